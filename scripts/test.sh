#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: makes .venv if missing,
# installs fencepost with its test and docs extras, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,docs]'
exec .venv/bin/python -m pytest "$@"
