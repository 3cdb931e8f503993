#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, lint (ruff, yamllint, ansible-lint at the
# production profile), CRIU for the snapshot tests (built by the criu role), pytest (unit, plugin,
# stand-in, node tools and real-host integration tests), then the role scenarios under molecule
# (scripts/test-roles.sh: systemd containers and a QEMU VM that it starts and stops itself).
# Needs root. Arguments go to pytest and skip the role scenarios, e.g. scripts/test.sh -k spec
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
export PATH="$PWD/.venv/bin:$PATH"

echo "== lint"
ruff check .
yamllint -s .
ansible-lint -q

echo "== CRIU for the snapshot tests"
tests/support/install_criu.sh

echo "== tests"
pytest "$@"

if [ $# -eq 0 ]; then
  echo "== role scenarios"
  scripts/test-roles.sh
fi
