#!/usr/bin/env bash
# Installs CRIU (>= 4.2, with its CUDA plugin) on this machine through the criu role, for the
# snapshot integration tests. The upstream tarball comes from the pool of the Debian archive this
# machine already uses (no other download), checked against its sha256, and is cached under
# .cache/criu-src. Skips everything when the same version is already installed.
# CRIU 4.2 is needed here: 4.1 cannot dump TCP sockets on kernels that refuse SO_PASSCRED on them.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=4.2.1
sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
tarball=criu_${version}.orig.tar.xz
cache=.cache/criu-src

if /usr/local/sbin/criu --version 2>/dev/null | grep -q "Version: ${version}$"; then
  echo "install_criu: CRIU ${version} already installed"
  exit 0
fi
# shellcheck source=tests/roles/lib.sh
source tests/roles/lib.sh
mkdir -p "$cache"
if ! echo "${sha256}  ${cache}/${tarball}" | sha256sum -c --quiet 2>/dev/null; then
  mirror=$(rt_mirror)
  .venv/bin/python - "$mirror/pool/main/c/criu/$tarball" "$cache/$tarball" "$sha256" <<'PY'
import hashlib, sys, urllib.request
url, dest, want = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=300).read()
if hashlib.sha256(data).hexdigest() != want:
    sys.exit(f"{url}: sha256 mismatch")
open(dest, "wb").write(data)
PY
fi
.venv/bin/ansible-playbook tests/support/criu_local.yml \
  -e criu_version="$version" -e criu_source_path="$PWD/$cache/$tarball" -e criu_source_checksum="sha256:$sha256"
