#!/usr/bin/env bash
# Role tests (docs/roles.md): `molecule test` for every role scenario, against systemd containers
# and a QEMU VM that this script starts and stops itself. Needs root (apt-get, network namespaces,
# loop devices). What it does, each step timed:
#   1. installs the system packages it needs (only those missing)
#   2. builds, or reuses from .cache/role-test, the images (tests/roles/build.sh)
#   3. starts a docker engine in a private network namespace (tests/roles/engine.sh)
#   4. runs `molecule test` for each scenario inside that namespace
#   5. stops everything it started (also on failure or Ctrl-C) and prints the timings
#
#   scripts/test-roles.sh                     every scenario (roles/*/molecule/*)
#   scripts/test-roles.sh fio raid0_xfs       these roles' scenarios (ROLE or ROLE:SCENARIO)
#   scripts/test-roles.sh --shell             engine up, a shell in the namespace: run molecule by hand
#   scripts/test-roles.sh --shell CMD [ARG...]  engine up, CMD run in the namespace, from the folder
#                                             it was called in: in roles/fio,
#                                             sudo ../../scripts/test-roles.sh --shell molecule test -s default
# Exit status: 0 when every scenario passed (--shell CMD: CMD's).
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=tests/roles/lib.sh
source tests/roles/lib.sh

# The harness's own needs; what the roles install inside the test hosts comes from the images.
HOST_PACKAGES=(docker.io debootstrap qemu-system-x86 e2fsprogs xfsprogs apt-utils fio
  iproute2 util-linux openssh-client python3)
# Keep in step with pyproject.toml's dev extras.
MOLECULE_PINS=(molecule==26.10.0 molecule-plugins==26.10.12)

shell=false
selected=()
shell_cmd=()
while [ $# -gt 0 ]; do
  case $1 in
    --shell) shell=true; shift; shell_cmd=("$@"); break ;;  # the rest is the command, its options included
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) rt_die "unknown option $1 (see --help)" ;;
    *) selected+=("$1") ;;
  esac
  shift
done

[ "$(id -u)" -eq 0 ] || rt_die "the role tests need root (apt-get, network namespaces, loop devices)"
[ -x .venv/bin/python ] || rt_die "no .venv: run scripts/setup.sh --dev first"

RT_TIMINGS=$(mktemp /tmp/rt-timings.XXXXXX)
export RT_TIMINGS
total_start=$(date +%s.%N)

install_host_packages() {
  local missing=() pkg
  for pkg in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && { rt_log "system packages: all present"; return 0; }
  rt_log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
}

ensure_molecule() {
  if ! .venv/bin/python -c 'import molecule, molecule_plugins' 2>/dev/null; then
    rt_log "installing ${MOLECULE_PINS[*]} into .venv"
    .venv/bin/python -m pip install -q "${MOLECULE_PINS[@]}"
    scripts/install-molecule-launcher.sh .venv  # pip wrote its own script: put the launcher back
  fi
}

scenarios() {
  local path role scenario want
  for path in roles/*/molecule/*/molecule.yml; do
    [ -f "$path" ] || continue
    role=$(echo "$path" | cut -d/ -f2)
    scenario=$(echo "$path" | cut -d/ -f4)
    if [ ${#selected[@]} -eq 0 ]; then
      echo "$role:$scenario"
      continue
    fi
    for want in "${selected[@]}"; do
      [ "$want" = "$role" ] || [ "$want" = "$role:$scenario" ] && echo "$role:$scenario"
    done
  done
}

cleanup() {
  local rc=$? dir
  trap - EXIT INT TERM
  local lane_pid
  for lane_pid in ${bg_pid:-} ${lane_pids[@]+"${lane_pids[@]}"}; do
    if kill -0 "$lane_pid" 2>/dev/null; then
      rt_log "stopping the background scenarios"
      kill -TERM -- "-$lane_pid" 2>/dev/null || true
    fi
  done
  if [ -n "${RT_RUN:-}" ] && [ -f "$RT_RUN/scenario.pids" ]; then
    while read -r pid; do
      kill -TERM -- "-$pid" 2>/dev/null || true
    done < "$RT_RUN/scenario.pids"
    sleep 1
  fi
  for lane_pid in ${bg_pid:-} ${lane_pids[@]+"${lane_pids[@]}"}; do wait "$lane_pid" 2>/dev/null || true; done
  if [ -n "${RT_RUN:-}" ] && [ -d "$RT_RUN" ]; then
    rt_log "stopping what this run started"
    for dir in "$RT_RUN"/vms/*/; do
      [ -d "$dir" ] && tests/roles/vm.sh destroy "$(basename "$dir")" || true
    done
    for dir in "$RT_RUN"/containers/*/; do
      [ -d "$dir" ] && tests/roles/container.sh destroy "$(basename "$dir")" || true
    done
    tests/roles/engine.sh stop || true
    if [ $rc -ne 0 ]; then
      rm -rf "$RT_CACHE/last-run"
      cp -a "$RT_RUN" "$RT_CACHE/last-run" 2>/dev/null || true
      rt_log "logs of this run kept in $RT_CACHE/last-run"
    fi
    rm -rf "$RT_RUN"
  fi
  if [ -s "$RT_TIMINGS" ]; then
    printf '\nrole tests: timings (wall seconds)\n' >&2
    awk -F'\t' '{ printf "  %8.1f  %-55s %s\n", $1, $2, $3 }' "$RT_TIMINGS" >&2
    printf '  %8.1f  %s\n' "$(rt_since "$total_start")" "total" >&2
  fi
  rm -f "$RT_TIMINGS"
  exit $rc
}

trap cleanup EXIT
trap 'exit 130' INT TERM
rt_step "system packages" install_host_packages
rt_step "molecule in .venv" ensure_molecule

mkdir -p "$RT_CACHE"
exec 9> "$RT_CACHE/.lock"
flock -n 9 || rt_die "another role-test run holds $RT_CACHE/.lock"

rt_step "images (build or reuse)" tests/roles/build.sh

RT_RUN=$(mktemp -d /tmp/rt.XXXXXX)
RT_NETNS=rt-${RT_RUN##*.}
export RT_RUN RT_NETNS
rt_step "engine start (netns $RT_NETNS)" tests/roles/engine.sh start
export DOCKER_HOST=unix://$RT_RUN/docker/docker.sock
export PATH=$RT_REPO/.venv/bin:$PATH
export ANSIBLE_FORCE_COLOR=${ANSIBLE_FORCE_COLOR:-0} PY_COLORS=${PY_COLORS:-0}
# Each playbook's duration ("Playbook run took ..."), so a slow molecule step shows in the log.
export ANSIBLE_CALLBACKS_ENABLED=${ANSIBLE_CALLBACKS_ENABLED:-ansible.posix.timer}

# Ansible's ssh ControlMaster sockets are named after address and port, and the next scenario's
# container may get the address of the last one: one socket folder per scenario, so a dead
# container's master connection is never reused.
if $shell && [ ${#shell_cmd[@]} -gt 0 ]; then
  rt_log "in namespace $RT_NETNS, in $caller_dir: ${shell_cmd[*]}"
  rc=0
  # shellcheck disable=SC2016  # expanded by the inner shell
  ANSIBLE_SSH_CONTROL_PATH_DIR=$RT_RUN/ssh/shell rt_in_netns bash -c 'cd "$1" && shift && exec "$@"' _ \
    "$caller_dir" "${shell_cmd[@]}" || rc=$?
  exit $rc
fi
if $shell; then
  rt_log "a shell in namespace $RT_NETNS; e.g. cd roles/fio && molecule converge; exit to stop everything"
  ANSIBLE_SSH_CONTROL_PATH_DIR=$RT_RUN/ssh/shell rt_in_netns bash -i || true
  exit 0
fi

mapfile -t todo < <(scenarios)
[ ${#todo[@]} -gt 0 ] || rt_die "no scenario matches: ${selected[*]:-} (roles/*/molecule/*/molecule.yml)"
mkdir -p "$RT_RUN/logs"

# `molecule test` in the namespace, in a session of its own (so that cleanup can stop it and its
# ansible-playbook children), waited for with `wait` (which a signal interrupts, unlike a
# foreground command). Its output goes to a log per attempt ($RT_RUN/logs/ROLE.SCENARIO.attemptN.log),
# shown as it comes.
# Molecule names its working folder after the role's folder name only, so two checkouts testing
# the same role on one machine would share it: each run gets its own.
# The ssh control sockets' folder is short (unix socket paths are limited to 108 bytes).
molecule_test() {  # ROLE SCENARIO ATTEMPT
  local pid tail_pid rc=0 log=$RT_RUN/logs/$1.$2.attempt$3.log
  : > "$log"
  # shellcheck disable=SC2016  # expanded by the inner shell
  setsid env ANSIBLE_SSH_CONTROL_PATH_DIR="$RT_RUN/ssh/$1.$2.$3" \
    MOLECULE_EPHEMERAL_DIRECTORY="$RT_RUN/molecule/$1.$2" RT_INFRA_LOG="${log%.log}.infra" \
    nsenter --net="/run/netns/$RT_NETNS" -- bash -c 'cd "roles/$1" && exec timeout --kill-after=60 "$3" molecule test -s "$2"' \
    _ "$1" "$2" "${RT_SCENARIO_TIMEOUT:-1800}" > "$log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" >> "$RT_RUN/scenario.pids"
  tail -n +1 -f --pid="$pid" "$log" &
  tail_pid=$!
  wait "$pid" || rc=$?
  wait "$tail_pid" 2>/dev/null || true
  return $rc
}

# A scenario whose attempt failed because of the infrastructure runs once more (saying why); a
# role failure is never retried.
run_scenario() {  # ROLE:SCENARIO; records failures in $RT_RUN/failed
  local attempt again="" log why
  for attempt in 1 2; do
    [ "$attempt" = 2 ] && again=", second attempt"
    log=$RT_RUN/logs/${1%%:*}.${1#*:}.attempt$attempt.log
    if rt_step "molecule test ${1%%:*} (${1#*:}$again)" molecule_test "${1%%:*}" "${1#*:}" "$attempt"; then
      return 0
    fi
    why=$(rt_infra_failure "$log")
    if [ "$attempt" = 1 ] && [ -n "$why" ]; then
      rt_log "${1}: failed because of the test infrastructure, not the role ($why); running the scenario once more"
      echo "$1: $why" >> "$RT_RUN/infra-retries"
      continue
    fi
    break
  done
  echo "$1" >> "$RT_RUN/failed"
}

# The VM scenarios spend most of their time in one emulated CPU; the container scenarios run
# beside them (RT_PARALLEL=0: one after the other). A background scenario's output goes to
# its log, printed when it ends.
vm_todo=()
ct_todo=()
for item in "${todo[@]}"; do
  if grep -q 'rt_kind: vm' "roles/${item%%:*}/molecule/${item#*:}/molecule.yml"; then
    vm_todo+=("$item")
  else
    ct_todo+=("$item")
  fi
done
bg_pid=""
if [ "${RT_PARALLEL:-1}" = 1 ] && [ ${#vm_todo[@]} -gt 0 ] && [ ${#ct_todo[@]} -gt 0 ]; then
  rt_log "VM scenarios (${vm_todo[*]}) run in the background; their output follows when they end"
  set -m  # its own process group, so that cleanup can stop all of it
  (for item in "${vm_todo[@]}"; do run_scenario "$item"; done) > "$RT_RUN/logs/vm-scenarios.log" 2>&1 &
  bg_pid=$!
  set +m
  vm_todo=()
fi
# The container scenarios in RT_LANES lanes (default 2): most of a scenario is Ansible and ssh
# waiting on each other, so two overlap well even on 2 cores. Each scenario goes to the lane with
# the least expected time (seconds measured from scratch; 100 for one not listed), except that
# nvidia_driver:gpu_stack follows criu in criu's lane: it unpacks the build criu saves. The
# second lane's output is printed when it ends.
declare -A expected=([criu:default]=200 [nvidia_driver:gpu_stack]=250 [nvidia_driver:default]=160
  [bench_client:default]=130 [vllm_images:default]=140 [cuda_checkpoint:default]=120
  [nvidia_container_toolkit:default]=95 [cache_volumes:default]=90 [docker:default]=85 [fio:default]=75)
lanes=${RT_LANES:-$([ "${RT_PARALLEL:-1}" = 1 ] && echo 2 || echo 1)}
[ "$lanes" -ge 1 ] 2>/dev/null || rt_die "RT_LANES must be a positive number, got '$lanes'"
declare -a lane_items lane_load
for ((i = 0; i < lanes; i++)); do lane_items[i]=""; lane_load[i]=0; done
criu_lane=""
for item in "${ct_todo[@]}"; do
  if [ "$item" = nvidia_driver:gpu_stack ] && [ -n "$criu_lane" ]; then
    best=$criu_lane
  else
    best=0
    for ((i = 1; i < lanes; i++)); do [ "${lane_load[i]}" -lt "${lane_load[best]}" ] && best=$i; done
  fi
  [ "$item" = criu:default ] && criu_lane=$best
  lane_items[best]="${lane_items[best]} $item"
  lane_load[best]=$((lane_load[best] + ${expected[$item]:-100}))
done
lane_pids=()
for ((i = 1; i < lanes; i++)); do
  [ -n "${lane_items[i]// /}" ] || continue
  rt_log "lane $((i + 1)):${lane_items[i]} (its output follows when it ends)"
  set -m
  # shellcheck disable=SC2086  # a list of ROLE:SCENARIO words
  (for item in ${lane_items[i]}; do run_scenario "$item"; done) > "$RT_RUN/logs/lane$((i + 1)).log" 2>&1 &
  lane_pids+=("$!")
  set +m
done
rt_log "lane 1:${lane_items[0]}"
# shellcheck disable=SC2086
for item in ${lane_items[0]} "${vm_todo[@]}"; do
  run_scenario "$item"
done
for ((i = 1; i < lanes; i++)); do
  [ -n "${lane_items[i]// /}" ] || continue
  wait "${lane_pids[$((i - 1))]}" || true
  rt_log "output of lane $((i + 1)):"
  cat "$RT_RUN/logs/lane$((i + 1)).log"
done
if [ -n "$bg_pid" ]; then
  wait "$bg_pid" || true
  rt_log "output of the background VM scenarios:"
  cat "$RT_RUN/logs/vm-scenarios.log"
fi

if [ -s "$RT_RUN/infra-retries" ]; then
  rt_log "scenarios run twice because of the test infrastructure: $(cat "$RT_RUN/infra-retries")"
fi
if [ -s "$RT_RUN/failed" ]; then
  rt_log "FAILED: $(xargs < "$RT_RUN/failed")"
  exit 1
fi
rt_log "all ${#todo[@]} scenarios passed"
