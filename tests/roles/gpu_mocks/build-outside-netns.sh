#!/usr/bin/env bash
# Run tests/roles/build.sh ARTIFACT... in the network namespace that scripts/test-roles.sh was started
# in: molecule runs inside the harness's private namespace, which has no route to the Debian mirror
# or PyPI that a (re)build downloads from. The first ancestor in another network namespace is that
# one; with none (run from the host namespace), build.sh runs as it is. A cached artefact is only checked.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
me=$(readlink /proc/self/ns/net)
pid=$$
while [ "$pid" -gt 1 ]; do
  pid=$(awk '/^PPid:/ { print $2 }' "/proc/$pid/status")
  ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null) || break
  if [ "$ns" != "$me" ]; then
    exec nsenter --net="/proc/$pid/ns/net" -- "$here/../build.sh" "$@"
  fi
done
exec "$here/../build.sh" "$@"
