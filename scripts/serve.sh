#!/usr/bin/env bash
# Starts fencepost on the embedded SQLite store (./fencepost.db) on a fresh
# machine: makes .venv if missing, installs fencepost, then runs the server.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/fencepost serve "$@"
