#!/usr/bin/env bash
# A systemd container (systemd as PID 1, sshd) in the role tests' docker engine, for molecule's
# create/destroy playbooks (tests/roles/molecule/). Runs inside the harness's network namespace.
#
#   container.sh create NAME [DATA_SIZE [docker]]
#                                          start it; print molecule's instance config as JSON;
#                                          "docker": the test engine's socket at /var/run/docker.sock
#   container.sh destroy NAME              remove it and its data device
#
# Each container gets an XFS-formatted loop device as /dev/rtdata (the stand-in for the node's
# RAID; the scenarios' prepare step mounts it) and the local apt repository at /srv/rt-apt.
# --privileged fails here (CAP_SYS_RESOURCE is not in this machine's bounding set); these
# capabilities and options are what works.
set -euo pipefail
# shellcheck source=tests/roles/lib.sh
source "$(dirname "$0")/lib.sh"
rt_require_run

DOCKER=/usr/bin/docker
export DOCKER_HOST=unix://$RT_RUN/docker/docker.sock
name=${2:?usage: $0 create|destroy NAME [DATA_SIZE [docker]]}
dir=$RT_RUN/containers/$name

create() {
  local size=${1:-2G} loop ip state start extra=()
  [ "${2:-}" = docker ] && extra=(-v "$RT_RUN/docker/docker.sock:/var/run/docker.sock")
  mkdir -p "$dir"
  truncate -s "$size" "$dir/data.img"
  mkfs.xfs -q -f -L rtdata "$dir/data.img"
  loop=$(losetup --find --show "$dir/data.img")
  echo "$loop" > "$dir/loop"
  $DOCKER run -d --name "rt-$name" --hostname "$name" --label rt.role-test="$RT_RUN" \
    --cap-add ALL --cap-drop SYS_RESOURCE \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    --tmpfs /run --tmpfs /run/lock -v /sys/fs/cgroup:/sys/fs/cgroup:ro \
    -v "$RT_KEY.pub:/root/.ssh/authorized_keys:ro" -v "$RT_CACHE/aptrepo/repo:/srv/rt-apt:ro" \
    --device "$loop:/dev/rtdata" -e container=docker "${extra[@]}" \
    "$("$RT_DIR/engine.sh" image)" /sbin/init > "$dir/id"
  start=$(date +%s)
  until state=$($DOCKER exec "rt-$name" systemctl is-system-running 2>/dev/null) &&
      [ "$state" = running ] || [ "$state" = degraded ]; do
    if [ $(($(date +%s) - start)) -ge 90 ]; then
      $DOCKER logs "rt-$name" 2>&1 | tail -n 20 >&2
      rt_infra_error "container $name: systemd did not finish booting in 90 s (state: ${state:-none})"
      rt_die "container $name: systemd did not finish booting in 90 s (state: ${state:-none})"
    fi
    sleep 0.5
  done
  [ "$state" = running ] || $DOCKER exec "rt-$name" systemctl --failed --no-legend >&2 || true
  ip=$($DOCKER inspect -f '{{.NetworkSettings.IPAddress}}' "rt-$name")
  # A real login from this namespace, as molecule will make one: the converge must not be the
  # first to find a container that does not answer yet (seen as "No route to host" under load).
  if ! rt_wait_ssh "$ip" 22 60; then
    rt_infra_error "container $name: no ssh login on $ip:22 within 60 s"
    rt_die "container $name: no ssh login on $ip:22 within 60 s"
  fi
  printf '{"instance": "%s", "address": "%s", "port": 22, "user": "root", "identity_file": "%s"}\n' \
    "$name" "$ip" "$RT_KEY"
}

destroy() {
  $DOCKER rm -f "rt-$name" > /dev/null 2>&1 || true
  if [ -f "$dir/loop" ]; then
    losetup -d "$(cat "$dir/loop")" 2>/dev/null || true
  fi
  rm -rf "$dir"
}

case $1 in
  create) create "${3:-}" "${4:-}" ;;
  destroy) destroy ;;
  *) echo "usage: $0 create|destroy NAME [DATA_SIZE [docker]]" >&2; exit 2 ;;
esac
