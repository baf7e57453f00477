#!/usr/bin/env bash
# Kiln's checks that need a GPU, for a lent device machine (build the carried parts first
# with scripts/gpu_bundle.sh). Most important first, each step under its own time limit, so
# a slow one cannot take the rest with it; each step's whole log lands in $OUT.
#   throughput_b16   benchmarks/throughput.py in bf16 at the issue's batch: speedup, MFU
#   train / eval     the quickstart trained and evaluated on CUDA (bf16 autocast)
#   fsdp             one-rank torchrun with parallel = fsdp: NCCL init + FSDP2 on CUDA
#   throughput_b256  the same benchmark with 16x the work per step
#   compile          ... and torch.compile on both models (at batch 16: compile time grows
#                    with the work per step)
# Step limits add up to 420 s, leaving room under the 600 s call for the wheel install and a
# rerun of the device budget. Training runs in a copy of .gpu/qs, so a rehearsal leaves the
# carried folder as it was. The runs' records come back in $OUT/runs.tgz.
# A rehearsal on CPU: DEVICE=cpu QUICK=1 PYTHON=.venv/bin/python bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln_gpu_out}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
quick=() steps=()
[ -n "${QUICK:-}" ] && quick=(--quick) steps=(--set train.steps=20)
mkdir -p "$OUT"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/kiln_site .whl/*.whl || { echo "wheel install failed: run scripts/gpu_bundle.sh and carry .whl"; exit 1; }
export PYTHONPATH="$PWD/src:/tmp/kiln_site" PYTHONUNBUFFERED=1
start=$SECONDS
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "== $name (limit ${limit}s, at ${t0}s): $*"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - t0)) s"
  grep -E "^RESULT|MFU|bits per byte|bits/byte|Error|error:" "$OUT/$name.log" | tail -6
}
[ "$DEVICE" = cuda ] && nvidia-smi -L
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
RUN=/tmp/kiln_gpu_qs
rm -rf "$RUN" && cp -r .gpu/qs "$RUN"
step throughput_b16 90 "$PY" benchmarks/throughput.py "${quick[@]}" --device "$DEVICE" --precision bf16
step train 60 "$PY" -m kiln.cli train "$RUN" --fresh --set train.device="$DEVICE" "${steps[@]}"
step eval 30 "$PY" -m kiln.cli eval "$RUN" --set train.device="$DEVICE"
step fsdp 60 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m kiln.cli \
  train "$RUN" --fresh --set train.device="$DEVICE" --set train.parallel=fsdp --set train.steps=40
step throughput_b256 60 "$PY" benchmarks/throughput.py "${quick[@]}" --device "$DEVICE" --precision bf16 --batch 256
step compile 120 "$PY" benchmarks/throughput.py "${quick[@]}" --device "$DEVICE" --precision bf16 --compile
# the records of both runs (the fsdp run's --fresh moved the first one's into archive/)
(cd "$RUN" && find . \( -name metrics.jsonl -o -name eval.json -o -name model.json \
  -o -name env.json -o -name config.toml \) -print0 | tar czf "$OUT/runs.tgz" --null -T -)
echo "all steps: $((SECONDS - start)) s"
