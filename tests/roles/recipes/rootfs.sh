# Recipe: a Debian minbase root filesystem (debootstrap), the base of the container image and the VM disk.
# shellcheck shell=bash
RECIPE_DEPS=()

recipe_inputs() {
  echo "suite=$RT_SUITE mirror=$(rt_mirror) variant=minbase"
}

recipe_build() {  # $1 = output folder
  debootstrap --variant=minbase "$RT_SUITE" "$1/root" "$(rt_mirror)" > "$1/debootstrap.log" 2>&1 ||
    { tail -n 20 "$1/debootstrap.log" >&2; return 1; }
}
