#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, lint (ruff, yamllint, ansible-lint at the
# production profile), then pytest (unit, plugin, stand-in and real-host integration tests).
# Extra arguments go to pytest, e.g. scripts/test.sh -k spec
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
export PATH="$PWD/.venv/bin:$PATH"

echo "== lint"
ruff check .
yamllint -s .
ansible-lint -q

echo "== tests"
pytest "$@"
