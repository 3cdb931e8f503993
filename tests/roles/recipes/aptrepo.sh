# Recipe: a local apt repository (a flat file: repository) of the packages the roles install and
# their dependencies that the container image lacks. Roles then really run `apt-get install`
# inside containers that have no network.
# shellcheck shell=bash
RECIPE_DEPS=(container)
RT_REPO_PACKAGES="fio python3-docker"

recipe_inputs() {
  echo "packages=$RT_REPO_PACKAGES mirror=$(rt_mirror)"
}

recipe_build() {  # $1 = output folder
  local scratch=$1/scratch
  cp -a "$RT_CACHE/container/root" "$scratch"
  rm -f "$scratch"/etc/apt/sources.list.d/*
  echo "deb $(rt_mirror) $RT_SUITE main" > "$scratch/etc/apt/sources.list"
  mkdir -p "$scratch/srv/repo/partial"
  # shellcheck disable=SC2086  # a word list of package names
  { rt_chroot_apt "$scratch" update &&
    rt_chroot_apt "$scratch" install --no-install-recommends --download-only -o Dir::Cache::archives=/srv/repo \
      $RT_REPO_PACKAGES; } > "$1/apt.log" 2>&1 || { tail -n 20 "$1/apt.log" >&2; return 1; }
  mkdir -p "$1/repo"
  mv "$scratch"/srv/repo/*.deb "$1/repo/"
  rm -rf "$scratch"
  (cd "$1/repo" && apt-ftparchive packages . > Packages)
  [ -s "$1/repo/Packages" ] || { echo "empty Packages index" >&2; return 1; }
}
