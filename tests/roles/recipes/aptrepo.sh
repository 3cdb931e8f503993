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
  # shellcheck disable=SC2086  # a word list of package names
  rt_fetch_debs "$1" $RT_REPO_PACKAGES
  rt_index_repo "$1/repo"
}
