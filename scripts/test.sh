#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): install, lint (ruff, the import layers, yamllint,
# ansible-lint at the production profile), CRIU for the snapshot tests (built by the criu role), pytest (unit, plugin,
# stand-in, node tools, role specs and real-host integration tests), then every role scenario under
# molecule (scripts/test-roles.sh: systemd containers and a QEMU VM it starts and stops itself,
# images built from Debian packages and cached in .cache/role-test). Needs root.
# Lint stops the run; pytest and the role scenarios both run, and the exit status is non-zero when
# either failed. Arguments go to pytest and skip the role scenarios, e.g. scripts/test.sh -k spec
# (RT_SKIP=1 skips them too).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
stamp() { echo "== $1 (at $(($(date +%s) - start)) s)"; }
scripts/setup.sh --dev
export PATH="$PWD/.venv/bin:$PATH"

stamp lint
ruff check .
lint-imports
yamllint -s .
ansible-lint -q

stamp "CRIU for the snapshot tests"
tests/support/install_criu.sh

stamp tests
pytest_rc=0
pytest "$@" || pytest_rc=$?

roles_rc=0
if [ $# -eq 0 ] && [ "${RT_SKIP:-0}" != 1 ]; then
  stamp "role scenarios"
  scripts/test-roles.sh || roles_rc=$?
fi

stamp "done: pytest rc=$pytest_rc, role scenarios rc=$roles_rc"
[ "$pytest_rc" -eq 0 ] && [ "$roles_rc" -eq 0 ]
