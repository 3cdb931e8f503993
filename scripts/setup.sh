#!/usr/bin/env bash
# Install the runner and its pinned dependencies into .venv (Python >= 3.11).
#   scripts/setup.sh         what a user needs to run campaigns
#   scripts/setup.sh --dev   plus test and lint tools, and the system packages the tests start
#                            (openssh-server for the SSH test hosts, fio for the storage experiment; root for apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup.sh: $python is $("$python" --version 2>&1); Python 3.11 or newer is needed (set PYTHON=...)" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip

if [ "${1:-}" = "--dev" ]; then
  .venv/bin/python -m pip install -q -e '.[dev]'
  # pip's molecule script needs the venv's bin/ on PATH: the launcher puts it there (docs/roles.md).
  scripts/install-molecule-launcher.sh .venv
  if [ ! -x /usr/sbin/sshd ] || ! command -v fio >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "setup.sh: the integration tests need openssh-server and fio: sudo apt-get install openssh-server fio" >&2
      exit 2
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server fio >/dev/null
  fi
else
  .venv/bin/python -m pip install -q -e .
fi
# pip never byte-compiles an editable checkout: where PYTHONDONTWRITEBYTECODE is set (CI images, this
# project's machines) every `python -m runner` compiled the runner's modules again (~0.2 CPU s a start;
# benchmarks/bench_campaign_fixed_cost.py). A .pyc left stale by an edit is only ignored, never used.
.venv/bin/python -m compileall -q runner plugins nodetools
