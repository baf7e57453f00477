#!/usr/bin/env bash
# Create .venv with CPU torch and Kiln (editable, with test extras). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# CPU build pinned here; the package itself accepts any torch 2.x so GPU users keep theirs
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test]"
