#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: makes .venv if missing,
# installs fencepost with its test and docs extras, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,docs]'
# Most tests wait (for a lease to expire, a server to start, a replica to die)
# rather than compute, so the suite runs in FENCEPOST_TEST_PROCESSES processes
# (default 2; 0 runs it in this one). A file's tests stay in one process, so the
# servers a module shares start once.
processes="${FENCEPOST_TEST_PROCESSES:-2}"
if [ "$processes" = 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$processes" --dist loadfile "$@"
