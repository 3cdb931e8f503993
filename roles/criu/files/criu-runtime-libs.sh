#!/bin/sh
# criu role: the shared libraries of criu and its plugins, found by ldd.
#
#   criu-runtime-libs.sh collect OUT FILE...        on the node that built criu: copies every library
#       ldd resolves for the FILEs, except the C library's own, into OUT, named by its soname
#   criu-runtime-libs.sh missing LIBDIR FILE...     prints the sonames this node lacks for the FILEs
#       (ldd with LD_LIBRARY_PATH=LIBDIR says "not found", or a version of it not found), one a line
#   criu-runtime-libs.sh carry STAGE LIBDIR FILE... copies what this node lacks from STAGE into
#       LIBDIR until ldd finds everything; prints "carried NAME" for each; exits 3 naming a library
#       STAGE does not have (the C library above all: a build must not need a newer one than the node's)
#
# A FILE that is a folder stands for the *.so files in it (the plugin folder). The C library is never
# carried: a program and its libraries must use the node's own loader and libc.
set -eu

files() {  # FILE... -> one path a line, folders expanded to their *.so files
  for f in "$@"; do
    if [ -d "$f" ]; then
      for so in "$f"/*.so; do
        if [ -e "$so" ]; then echo "$so"; fi
      done
    else
      echo "$f"
    fi
  done
}

is_libc() {  # SONAME: part of the C library (glibc), which the node always has and must provide
  case $1 in
    ld-linux* | linux-vdso* | linux-gate* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | \
      libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.* | \
      libthread_db.so.* | libBrokenLocale.so.*) return 0 ;;
  esac
  return 1
}

ldd_all() {  # LIBDIR FILE... -> ldd's lines for every FILE, LIBDIR first in the search
  libdir=$1
  shift
  files "$@" | while read -r f; do
    LD_LIBRARY_PATH=$libdir ldd "$f" 2>&1 || true
  done
}

missing() {  # LIBDIR FILE...
  ldd_all "$@" | sed -n \
    -e 's/^[[:space:]]*\([^[:space:]]*\) => not found.*/\1/p' \
    -e 's/^.*: \([^:]*\): version .* not found.*/\1/p' | sed 's|.*/||' | sort -u
}

collect() {  # OUT FILE...
  out=$1
  shift
  rm -rf "$out"
  mkdir -p "$out"
  lines=$(ldd_all "" "$@")
  if echo "$lines" | grep -q 'not found'; then
    echo "criu-runtime-libs: the build itself lacks libraries: $(echo "$lines" | grep 'not found' | tr -s ' \t' ' ')" >&2
    exit 3
  fi
  echo "$lines" | sed -n 's/^[[:space:]]*\([^[:space:]]*\) => \(\/[^[:space:]]*\).*/\1 \2/p' | sort -u |
    while read -r name path; do
      if is_libc "$name"; then continue; fi
      cp -L "$path" "$out/$name"
      chmod 0644 "$out/$name"
      echo "collected $name"
    done
}

carry() {  # STAGE LIBDIR FILE...
  stage=$1
  libdir=$2
  shift 2
  mkdir -p "$libdir"
  round=0
  while :; do
    need=$(missing "$libdir" "$@")
    if [ -z "$need" ]; then return 0; fi
    round=$((round + 1))
    if [ "$round" -gt 32 ]; then
      echo "criu-runtime-libs: still missing after 32 rounds: $(echo "$need" | tr '\n' ' ')" >&2
      exit 3
    fi
    for name in $need; do
      if is_libc "$name" || [ ! -f "$stage/$name" ] || [ -e "$libdir/$name" ]; then
        why=$(ldd_all "$libdir" "$@" | grep -F "$name" | tr -s ' \t' ' ' | sort -u | head -n 3 | tr '\n' ';')
        echo "criu-runtime-libs: this node lacks $name and the build's saved libraries cannot give it: $why" >&2
        exit 3
      fi
      cp "$stage/$name" "$libdir/$name"
      chmod 0644 "$libdir/$name"
      echo "carried $name"
    done
  done
}

usage() {
  echo "usage: criu-runtime-libs.sh collect OUT FILE... | missing LIBDIR FILE... | carry STAGE LIBDIR FILE..." >&2
  exit 2
}

case ${1:-} in
  collect) [ $# -ge 3 ] || usage; shift; collect "$@" ;;
  missing) [ $# -ge 3 ] || usage; shift; missing "$@" ;;
  carry) [ $# -ge 4 ] || usage; shift; carry "$@" ;;
  *) usage ;;
esac
