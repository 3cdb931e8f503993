#!/usr/bin/env bash
# Replace pip's `molecule` console script in a venv with a launcher that puts the venv's bin/ first
# on PATH, then runs molecule: as it starts, before it reads any config, molecule runs
# `ansible-config dump` from PATH (ansible-compat), so a bare `.venv/bin/molecule list` in a role
# folder failed with FileNotFoundError: 'ansible-config' unless the venv was activated.
#   scripts/install-molecule-launcher.sh [VENV]   (default: this checkout's .venv)
# Idempotent; written atomically (temp file + rename). A later `pip install molecule` puts pip's
# script back: scripts/setup.sh --dev runs this again each time.
set -euo pipefail

venv=${1:-"$(dirname "$0")/../.venv"}
venv=$(cd -- "$venv" >/dev/null && pwd)  # >/dev/null: cd prints the folder under CDPATH
python=$venv/bin/python
[ -x "$python" ] || { echo "install-molecule-launcher.sh: no $python" >&2; exit 2; }

# The entry point as molecule's own metadata names it (today molecule.__main__:main).
entry=$("$python" -c '
import sys
from importlib.metadata import entry_points
found = [e.value for e in entry_points(group="console_scripts", name="molecule")]
if not found:
    sys.exit("install-molecule-launcher.sh: molecule is not installed in " + sys.prefix)
print(found[0])
')
module=${entry%%:*}
func=${entry#*:}
case "$module" in *[!A-Za-z0-9_.]*|"") echo "install-molecule-launcher.sh: unexpected entry point $entry" >&2; exit 2 ;; esac
case "$func" in *[!A-Za-z0-9_]*|"") echo "install-molecule-launcher.sh: unexpected entry point $entry" >&2; exit 2 ;; esac

# The kernel splits a shebang at a space and may cut it past 127 bytes: then, as pip does, sh
# starts the interpreter (the second line is a shell command and a Python string at once).
long=0
case "$python" in *[[:space:]]*) long=1 ;; esac
[ ${#python} -gt 120 ] && long=1
if [ "$long" = 1 ]; then
  shebang="#!/bin/sh
'''exec' \"$python\" \"\$0\" \"\$@\"
' '''"
else
  shebang="#!$python"
fi

target=$venv/bin/molecule
tmp=$(mktemp "$target.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cat > "$tmp" <<EOF
$shebang
# Written by scripts/install-molecule-launcher.sh in place of pip's script: molecule runs
# ansible-config from PATH before it reads any config, so this venv's bin/ goes first on PATH.
import os
import sys

_bin = os.path.dirname(sys.executable)
_path = os.environ.get("PATH", "")
if _path.split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + _path if _path else _bin

from $module import $func

if __name__ == "__main__":
    sys.argv[0] = sys.argv[0].removesuffix(".exe")
    sys.exit($func())
EOF
chmod 755 "$tmp"
mv -f "$tmp" "$target"
trap - EXIT
