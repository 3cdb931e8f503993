# Shared by the role-test harness scripts (sourced, not run). See docs/roles.md.
#
# RT_CACHE   images and the VM disk, kept between runs (default .cache/role-test, git-ignored)
# RT_RUN     this run's state: docker engine socket, pid files, VM disks, logs (a short path,
#            because unix socket paths are limited to 108 bytes)
# RT_NETNS   the network namespace the docker engine, the containers, the VMs and molecule use
# shellcheck shell=bash

RT_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RT_DIR=$RT_REPO/tests/roles
RT_CACHE=${RT_CACHE:-$RT_REPO/.cache/role-test}
RT_SUITE=${RT_SUITE:-bookworm}
RT_KEY=$RT_CACHE/keys/id_ed25519
export RT_REPO RT_DIR RT_CACHE RT_SUITE RT_KEY

rt_log() { printf '[role-test %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
rt_die() { rt_log "ERROR: $*"; exit 1; }

# The Debian mirror this machine's apt uses (never hard-coded): deb822 sources first.
rt_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk -v suite="$RT_SUITE" '
      /^[[:space:]]*$/ { if (u != "" && s ~ ("(^| )" suite "( |$)")) { print u; exit } u = ""; s = ""; next }
      /^URIs:/ { u = $2 } /^Suites:/ { $1 = ""; s = $0 }
      END { if (u != "" && s ~ ("(^| )" suite "( |$)")) print u }' "$f" | head -n 1)
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  uri=$(awk -v suite="$RT_SUITE" '$1 == "deb" && $0 ~ (" " suite " ") { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
    /etc/apt/sources.list 2>/dev/null)
  [ -n "$uri" ] && { echo "$uri"; return 0; }
  rt_die "no apt source for $RT_SUITE in /etc/apt/sources.list{,.d/*.sources}: cannot debootstrap"
}

# Elapsed seconds since $1 (a `date +%s.%N` stamp), one decimal.
rt_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

# Run a step and record its wall time in $RT_TIMINGS (one "seconds<TAB>step<TAB>result" line).
rt_step() {
  local name=$1 start rc=0
  shift
  start=$(date +%s.%N)
  rt_log "== $name"
  "$@" || rc=$?
  local took
  took=$(rt_since "$start")
  if [ -n "${RT_TIMINGS:-}" ]; then
    printf '%s\t%s\t%s\n' "$took" "$name" "$([ $rc -eq 0 ] && echo ok || echo "FAILED rc=$rc")" >> "$RT_TIMINGS"
  fi
  rt_log "== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc=$rc)") in ${took}s"
  return $rc
}

# Wait until sshd at $1:$2 lets the test key log in and run a command; $3 = timeout in seconds.
# (An open port is not enough: under load sshd accepts before it can answer a login.)
rt_wait_ssh() {
  local host=$1 port=$2 timeout=$3 start
  start=$(date +%s)
  until ssh -q -i "$RT_KEY" -p "$port" -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=no \
      -o UserKnownHostsFile=/dev/null "root@$host" true < /dev/null 2>/dev/null; do
    [ $(($(date +%s) - start)) -ge "$timeout" ] && return 1
    sleep 1
  done
}

# Note a failure of the test infrastructure (not of a role under test): the harness runs the
# scenario once more when its attempt ended with such a note. RT_INFRA_LOG is set per scenario
# attempt by scripts/test-roles.sh; molecule's create step and the VM supervisor inherit it.
rt_infra_error() {
  rt_log "infrastructure: $*"
  [ -n "${RT_INFRA_LOG:-}" ] && printf '%(%H:%M:%S)T %s\n' -1 "$*" >> "$RT_INFRA_LOG"
  return 0
}

# Why an attempt failed, when the test infrastructure and not the role failed; empty otherwise.
#   - the harness noted it (RT_INFRA_LOG: a container or VM that did not boot or answer ssh, the
#     emulated NVMe controller hanging): tests/roles/container.sh, vm.sh;
#   - or Ansible lost a host (a PLAY RECAP with unreachable > 0) while no task failed (every recap
#     failed=0): a connection that dropped, "No route to host" under load.
# A failed task or assertion, a changed idempotence run or a timeout is never an infrastructure error.
rt_infra_failure() {  # LOG of one `molecule test` attempt
  local infra=${1%.log}.infra
  if [ -s "$infra" ]; then
    tr '\n' ' ' < "$infra"
    return 0
  fi
  if grep -Eq '^[^ ]+ +: ok=[0-9]+ +changed=[0-9]+ +unreachable=[1-9]' "$1" &&
      ! grep -Eq '^[^ ]+ +: ok=.* failed=[1-9]' "$1"; then
    grep -E 'UNREACHABLE!|Failed to connect|No route to host|Connection (refused|reset|timed out)|unreachable=[1-9]' "$1" |
      head -n 4 | tr -s ' \n' ' '
  fi
}

# Run apt-get inside a chroot, with /proc mounted only for the call and no service started.
rt_chroot_apt() {
  local root=$1 rc=0
  shift
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  mount -t proc proc "$root/proc"
  chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get -q -y \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" || rc=$?
  umount "$root/proc"
  rm -f "$root/usr/sbin/policy-rc.d" "$root/etc/resolv.conf"
  return $rc
}

# Download Debian packages with their dependencies (those the container image lacks) into
# OUT/repo, from the mirror, in a scratch copy of the container image. Used by the recipes that
# make a flat apt repository for containers without network.
rt_fetch_debs() {  # OUT PACKAGE...
  local out=$1 scratch=$1/scratch
  shift
  cp -a "$RT_CACHE/container/root" "$scratch"
  rm -f "$scratch"/etc/apt/sources.list.d/*
  echo "deb $(rt_mirror) $RT_SUITE main" > "$scratch/etc/apt/sources.list"
  mkdir -p "$scratch/srv/repo/partial" "$out/repo"
  { rt_chroot_apt "$scratch" update &&
    rt_chroot_apt "$scratch" install --no-install-recommends --download-only -o Dir::Cache::archives=/srv/repo \
      "$@"; } > "$out/apt.log" 2>&1 || { tail -n 20 "$out/apt.log" >&2; return 1; }
  mv "$scratch"/srv/repo/*.deb "$out/repo/"
  rm -rf "$scratch"
}

# Write the Packages index of a flat apt repository (and refuse an empty one).
rt_index_repo() {  # DIR
  (cd "$1" && apt-ftparchive packages . > Packages)
  [ -s "$1/Packages" ] || { echo "empty Packages index in $1" >&2; return 1; }
}

# Run a command in the harness's network namespace (the docker engine, containers and VMs live there).
rt_in_netns() {
  [ -n "${RT_NETNS:-}" ] || rt_die "RT_NETNS is not set: run through scripts/test-roles.sh"
  nsenter --net="/run/netns/$RT_NETNS" -- "$@"
}

rt_require_run() {
  [ -n "${RT_RUN:-}" ] && [ -d "$RT_RUN" ] ||
    rt_die "RT_RUN is not set: run molecule through scripts/test-roles.sh (or inside scripts/test-roles.sh --shell)"
}
