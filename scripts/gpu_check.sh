#!/usr/bin/env bash
# Kiln's checks that need a GPU, for a lent device machine (build the carried parts first
# with scripts/gpu_bundle.sh). Most important first, each step under its own time limit, so
# a slow one cannot take the rest with it; each step's whole log lands in $OUT.
#   throughput_b16   benchmarks/throughput.py in bf16 at the issue's batch: speedup, MFU
#   train_resume     benchmarks/gpu_train_check.py: the quickstart trained on CUDA (bf16
#                    autocast), SIGKILLed at a random step and resumed (losses compared),
#                    then evaluated and sampled
#   fsdp             one-rank torchrun with parallel = fsdp: NCCL init + FSDP2 on CUDA
#   train_compile    the trainer with train.compile = true on CUDA
#   throughput_b128  the benchmark in fp32 and bf16 with 8x the work per step
#   compile          ... and torch.compile on both models (bf16, batch 128)
# Step limits add up to 570 s; ONLY=fsdp,train_compile runs the named steps alone (a rerun
# in what is left of the device budget). Training runs in copies of .gpu/qs, so a rehearsal
# leaves the carried folder as it was. The runs' records come back in $OUT/runs.tgz.
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
  [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$name,"* ]] || return 0
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
resume=(--steps 300 --every 50)
[ -n "${QUICK:-}" ] && resume=(--steps 30 --every 10 --set train.log_every=5 --set train.eval_batches=2
  --set eval.max_batches=4 --set generate.max_new_tokens=8)
step train_resume 150 "$PY" benchmarks/gpu_train_check.py .gpu/qs --device "$DEVICE" "${resume[@]}"
step fsdp 60 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m kiln.cli \
  train "$RUN" --fresh --set train.device="$DEVICE" --set train.parallel=fsdp --set train.steps=40
step train_compile 90 "$PY" -m kiln.cli train "$RUN" --fresh --set train.device="$DEVICE" \
  --set train.compile=true --set train.steps=100
step throughput_b128 60 "$PY" benchmarks/throughput.py "${quick[@]}" --device "$DEVICE" \
  --precision fp32,bf16 --batch 128
step compile 120 "$PY" benchmarks/throughput.py "${quick[@]}" --device "$DEVICE" --precision bf16 \
  --batch 128 --compile
# the records of the fsdp and compiled runs (each --fresh moved the one before into archive/)
(cd "$RUN" && find . \( -name metrics.jsonl -o -name eval.json -o -name model.json \
  -o -name env.json -o -name config.toml \) -print0 | tar czf "$OUT/runs.tgz" --null -T -)
echo "all steps: $((SECONDS - start)) s"
