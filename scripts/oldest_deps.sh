#!/usr/bin/env bash
# Check the lower bounds pyproject.toml declares: build .venv-oldest with the lowest version
# of each direct dependency that the bounds allow (uv's lowest-direct resolution) and run the
# tests there (arguments go to pytest). Not part of CI: PyPI's Linux torch wheel is the CUDA
# build, ~6 GB installed. PYTHON picks the interpreter (default python3). uv reads its index
# from UV_INDEX_URL / UV_EXTRA_INDEX_URL, not from pip's configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-oldest
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q uv
"$VENV/bin/python" -m uv pip install -q --python "$VENV/bin/python" --resolution lowest-direct \
  -e ".[test]"
"$VENV/bin/python" - <<'PY'
from importlib import metadata
from packaging.requirements import Requirement
names = [Requirement(r).name for r in metadata.requires("kiln")]
print("oldest:", ", ".join(f"{n} {metadata.version(n)}" for n in names))
PY
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
