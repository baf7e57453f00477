#!/usr/bin/env bash
# Build, here, what scripts/gpu_check.sh needs on a lent GPU machine, which reaches no network:
#   .whl/    wheels of Kiln's dependencies that machine's image lacks (datatrove and its needs)
#   .gpu/qs  the quickstart run directory, prepared and tokenized (the data stages run on CPU)
# Then one device call: carry [".whl", ".gpu"], command "bash scripts/gpu_check.sh".
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/kiln ] || bash scripts/setup.sh
PY_TARGET=${PY_TARGET:-3.12}  # the GPU image's python3 (device KINDS.md)
versions=$(.venv/bin/python - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("datatrove", "dill", "loguru", "multiprocess")))
PY
)
rm -rf .whl && mkdir -p .whl
# shellcheck disable=SC2086
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_TARGET" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl $versions
rm -rf .gpu/qs
for verb in prepare tokenizer tokenize; do
  .venv/bin/kiln "$verb" recipes/quickstart.toml --set run.dir=.gpu/qs
done
du -sh .whl .gpu
# what the device call will refuse, found here rather than after the machine has started
size_mb=$(du -sm .whl .gpu | awk '{s += $1} END {print s}')
[ "$size_mb" -lt 60 ] || { echo "ERROR: .whl + .gpu hold ${size_mb} MB, over the 64 MiB carry"; exit 1; }
tag="py${PY_TARGET/./}"
for w in .whl/*.whl; do
  case "$w" in *-py3-none-any.whl|*-"$tag"-*|*-cp"${PY_TARGET/./}"-*|*-abi3-*) ;;
    *) echo "ERROR: $w does not install on python $PY_TARGET (re-run with PY_TARGET=$PY_TARGET)"; exit 1;;
  esac
done
echo "ready for python $PY_TARGET: carry [\".whl\", \".gpu\"], run \"bash scripts/gpu_check.sh\""
