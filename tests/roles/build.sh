#!/usr/bin/env bash
# Build, or reuse from the cache, what the role tests run on:
#   rootfs     Debian minbase (debootstrap)                      recipes/rootfs.sh
#   container  the systemd container image's root                recipes/container.sh
#   aptrepo    local apt repository of what the roles install    recipes/aptrepo.sh
#   vm         the QEMU VM's disk (Debian kernel, systemd, mdadm) recipes/vm.sh
#   gpustack   what the GPU-stack scenarios install offline: apt repository with MOCK NVIDIA packages,
#              wheels, MOCK image tarballs, CRIU's source tarball     recipes/gpustack.sh
# Each artifact is rebuilt when its recipe hash changes: the recipe file, its inputs (mirror,
# package lists, the test SSH key for the VM) and the hashes of what it is built from.
#
#   tests/roles/build.sh [ARTIFACT...]     (default: every recipe in recipes/; needs root, debootstrap,
#                                          network to the mirror and to the Python package index)
set -euo pipefail
# shellcheck source=tests/roles/lib.sh
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || rt_die "build.sh needs root (debootstrap, chroot)"

ensure_key() {
  [ -s "$RT_KEY" ] && [ -s "$RT_KEY.pub" ] && return 0
  mkdir -p "$(dirname "$RT_KEY")"
  rm -f "$RT_KEY" "$RT_KEY.pub"
  ssh-keygen -q -t ed25519 -N '' -C role-test -f "$RT_KEY"
}

# Hash of one artifact's recipe; sources the recipe in a subshell so recipes don't leak.
recipe_hash() {
  local name=$1
  (
    # shellcheck disable=SC1090
    source "$RT_DIR/recipes/$name.sh"
    {
      cat "$RT_DIR/recipes/$name.sh"
      recipe_inputs
      local dep
      for dep in "${RECIPE_DEPS[@]}"; do
        printf 'dep %s %s\n' "$dep" "$(cat "$RT_CACHE/$dep/.recipe")"
      done
    } | sha256sum | cut -c1-16
  )
}

recipe_deps() {
  (
    # shellcheck disable=SC1090
    source "$RT_DIR/recipes/$1.sh"
    echo "${RECIPE_DEPS[@]}"
  )
}

declare -A ensured=()
ensure() {
  local name=$1 dep hash out
  [ -n "${ensured[$name]:-}" ] && return 0
  ensured[$name]=1
  for dep in $(recipe_deps "$name"); do
    ensure "$dep"
  done
  hash=$(recipe_hash "$name")
  if [ "$(cat "$RT_CACHE/$name/.recipe" 2>/dev/null)" = "$hash" ]; then
    rt_log "$name: cached ($hash)"
    return 0
  fi
  out=$RT_CACHE/$name.new
  rm -rf "$out"
  mkdir -p "$out"
  # shellcheck disable=SC2016  # expanded by the inner shell
  if ! rt_step "build $name ($hash)" bash -c 'set -euo pipefail; source "$1/lib.sh"; source "$1/recipes/$2.sh"; recipe_build "$3"' \
      build "$RT_DIR" "$name" "$out"; then
    # Leave no mount behind in a half-built root.
    grep -o " $out[^ ]*" /proc/mounts | sort -r | xargs -r -n 1 umount -l 2>/dev/null || true
    rt_die "building $name failed; its logs are in $out"
  fi
  echo "$hash" > "$out/.recipe"
  rm -rf "$RT_CACHE/$name"
  mv "$out" "$RT_CACHE/$name"
}

mkdir -p "$RT_CACHE"
ensure_key
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for recipe in "$RT_DIR"/recipes/*.sh; do
    targets+=("$(basename "$recipe" .sh)")
  done
fi
for target in "${targets[@]}"; do
  [ -f "$RT_DIR/recipes/$target.sh" ] || rt_die "unknown artifact $target (known: $(cd "$RT_DIR/recipes" && ls | sed 's/\.sh$//' | xargs))"
  ensure "$target"
done
