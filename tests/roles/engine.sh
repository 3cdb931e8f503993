#!/usr/bin/env bash
# The role tests' docker engine, kept in its own network namespace ($RT_NETNS) so that its
# bridge, its iptables rules and its containers never touch this machine's network or firewall.
# Its images persist in $RT_CACHE/docker; its sockets and state live in $RT_RUN.
#
#   engine.sh start     create the namespace, start dockerd in it, import the container image
#   engine.sh stop      remove the test containers, stop dockerd, delete the namespace
#   engine.sh image     print the container image's tag
set -euo pipefail
# shellcheck source=tests/roles/lib.sh
source "$(dirname "$0")/lib.sh"

DOCKERD=${RT_DOCKERD:-/usr/sbin/dockerd}
DOCKER=/usr/bin/docker  # Debian's client; /usr/local/bin/docker may be a different one
state=${RT_RUN:-}/docker

image_tag() {
  echo "rt/systemd:$(cat "$RT_CACHE/container/.recipe")"
}

start() {
  rt_require_run
  [ -n "${RT_NETNS:-}" ] || rt_die "RT_NETNS is not set"
  [ -x "$DOCKERD" ] || rt_die "$DOCKERD not found: apt-get install docker.io"
  [ -f "$RT_CACHE/container/.recipe" ] || rt_die "no container image: run tests/roles/build.sh first"
  ip netns add "$RT_NETNS"
  ip -n "$RT_NETNS" link set lo up
  mkdir -p "$state" "$RT_CACHE/docker"
  # nsenter --net, not `ip netns exec`: the latter remounts /sys and hides the cgroup mounts.
  nsenter --net="/run/netns/$RT_NETNS" -- "$DOCKERD" \
    --data-root "$RT_CACHE/docker" --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
    -H "unix://$state/docker.sock" \
    > "$state/dockerd.log" 2>&1 < /dev/null &
  local i
  for i in $(seq 1 100); do
    DOCKER_HOST=unix://$state/docker.sock $DOCKER version > /dev/null 2>&1 && break
    [ "$i" -eq 100 ] && { tail -n 20 "$state/dockerd.log" >&2; rt_die "dockerd did not come up in 30 s"; }
    sleep 0.3
  done
  export DOCKER_HOST=unix://$state/docker.sock
  # Containers a killed earlier run left behind.
  $DOCKER ps -aq --filter label=rt.role-test | xargs -r $DOCKER rm -f > /dev/null
  local tag
  tag=$(image_tag)
  if ! $DOCKER image inspect "$tag" > /dev/null 2>&1; then
    rt_log "importing $tag"
    tar -C "$RT_CACHE/container/root" -c . | $DOCKER import -c 'CMD ["/sbin/init"]' - "$tag" > /dev/null
    # Older images of this harness only take space.
    $DOCKER images --format '{{.Repository}}:{{.Tag}}' rt/systemd | grep -vxF "$tag" | xargs -r $DOCKER rmi > /dev/null || true
  fi
}

stop() {
  [ -n "${RT_RUN:-}" ] || return 0
  local pid
  if [ -S "$state/docker.sock" ]; then
    DOCKER_HOST=unix://$state/docker.sock $DOCKER ps -aq --filter label=rt.role-test |
      xargs -r env DOCKER_HOST="unix://$state/docker.sock" $DOCKER rm -f > /dev/null 2>&1 || true
    # Volumes the roles under test created (this engine serves the tests only).
    DOCKER_HOST=unix://$state/docker.sock $DOCKER volume ls -q |
      xargs -r env DOCKER_HOST="unix://$state/docker.sock" $DOCKER volume rm -f > /dev/null 2>&1 || true
  fi
  if [ -f "$state/dockerd.pid" ]; then
    pid=$(cat "$state/dockerd.pid")
    if kill "$pid" 2>/dev/null; then
      # dockerd stops its containerd too; a zombie (state Z) counts as gone.
      for _ in $(seq 1 100); do
        [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = "" ] && break
        [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = "Z" ] && break
        sleep 0.2
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  if [ -n "${RT_NETNS:-}" ] && [ -e "/run/netns/$RT_NETNS" ]; then
    ip netns del "$RT_NETNS"
  fi
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  image) image_tag ;;
  *) echo "usage: $0 start|stop|image" >&2; exit 2 ;;
esac
