#!/usr/bin/env bash
# Create .venv with CPU torch and Kiln (editable, with test extras). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch is pinned here; the package itself accepts torch >=2.11,<3, so GPU
# users keep their own. Where pip's own configuration offers a CPU wheel (a local wheel
# folder), that one; elsewhere PyPI's Linux wheel is the CUDA build (GBs of CUDA libraries),
# so the CPU wheel comes from PyTorch's CPU index.
TORCH="torch==2.13.0"
if .venv/bin/python -m pip install -q --dry-run --no-deps --ignore-installed --report - "$TORCH" \
    2>/dev/null | grep -q '"version": *"[^"]*+cpu"'; then
  .venv/bin/python -m pip install -q "$TORCH"
elif ! .venv/bin/python -m pip install -q --timeout 30 --retries 1 "$TORCH" \
    --index-url https://download.pytorch.org/whl/cpu; then
  echo "setup: PyTorch's CPU index did not answer; $TORCH from pip's configured index" >&2
  .venv/bin/python -m pip install -q "$TORCH"
fi
.venv/bin/python -m pip install -q -e ".[test]"
