# Recipe: what the GPU-stack role scenarios (roles/{nvidia_driver,docker,nvidia_container_toolkit,
# cuda_checkpoint,criu,vllm_images,bench_client}/molecule) need inside containers that have no network:
#   repo/     a flat apt repository: the Debian packages those roles install (with the dependencies the
#             container image lacks) plus the MOCK NVIDIA packages of tests/roles/gpu_mocks (their
#             versions end in "mock1" and their descriptions start with "MOCK")
#   wheels/   Python wheels for the containers' Python (3.11): aiohttp and its dependencies (bench_client)
#             and the mock-vllm wheel (vllm_images' process runtime)
#   images/   a docker-archive tarball of a tiny MOCK image (vllm_images' tarball load)
#   src/      the source tarball of the criu role's default release, as Debian's archive carries it (the file its
#             default criu_source_url names, criu_4.2.1.orig.tar.xz), checked against its default checksum
# tests/roles/build.sh builds it with the other artifacts (cached like the rest).
# shellcheck shell=bash
RECIPE_DEPS=(container)
RT_GPU_PACKAGES="docker.io iptables ca-certificates xz-utils python3-venv build-essential pkg-config
libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler libcap-dev libnl-3-dev libnet1-dev
python3-protobuf libbsd-dev libgnutls28-dev libnftables-dev uuid-dev libdrm-dev"
RT_GPU_WHEELS="aiohttp==3.14.5"
# The criu role's defaults name the tarball and its checksum; this recipe follows them.
RT_CRIU_TARBALL=$(sed -n 's|^criu_source_url: *"\{0,1\}\([^"]*\)"\{0,1\}$|\1|p' "$RT_REPO/roles/criu/defaults/main.yml")
RT_CRIU_TARBALL=${RT_CRIU_TARBALL##*/}
RT_CRIU_SHA256=$(sed -n 's|^criu_source_checksum: *"\{0,1\}sha256:\([0-9a-f]\{64\}\)"\{0,1\}$|\1|p' "$RT_REPO/roles/criu/defaults/main.yml")

recipe_inputs() {
  echo "packages=$RT_GPU_PACKAGES wheels=$RT_GPU_WHEELS mirror=$(rt_mirror) criu=$RT_CRIU_TARBALL:$RT_CRIU_SHA256"
  (cd "$RT_DIR/gpu_mocks" && find . -type f \( -name build_mocks.py -o -name 'mock-*' \) -print0 | sort -z | xargs -0 sha256sum)
}

recipe_build() {  # $1 = output folder
  local out=$1 mirror
  [ -n "$RT_CRIU_TARBALL" ] && [ -n "$RT_CRIU_SHA256" ] ||
    { echo "cannot read criu_source_url / criu_source_checksum (sha256) from roles/criu/defaults/main.yml" >&2; return 1; }
  mirror=$(rt_mirror)
  # shellcheck disable=SC2086  # a word list of package names
  rt_fetch_debs "$out" $RT_GPU_PACKAGES
  mkdir -p "$out/wheels" "$out/images" "$out/src"
  python3 "$RT_DIR/gpu_mocks/build_mocks.py" --debs "$out/repo" --wheels "$out/wheels" --images "$out/images" \
    > "$out/mocks.log" 2>&1 || { tail -n 20 "$out/mocks.log" >&2; return 1; }
  rt_index_repo "$out/repo"
  # The containers run Debian 12's Python 3.11.
  "$RT_REPO/.venv/bin/python" -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp \
    --abi cp311 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$out/wheels" $RT_GPU_WHEELS > "$out/pip.log" 2>&1 || { tail -n 20 "$out/pip.log" >&2; return 1; }
  # The upstream tarball, from the pool of Debian's archive (test-infra.md section 5).
  python3 - "$mirror/pool/main/c/criu/$RT_CRIU_TARBALL" "$out/src/$RT_CRIU_TARBALL" "$RT_CRIU_SHA256" <<'PY'
import hashlib, sys, urllib.request
url, dest, want = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=120).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"{url}: sha256 {got}, expected {want}")
open(dest, "wb").write(data)
PY
}
