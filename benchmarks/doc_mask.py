"""Cost of intra-document masking (`model.doc_mask`): training tokens/s and peak memory of
the throughput benchmark's model (dim 512, 6 layers, 8 / 4 heads, vocab 8192, batch 16 x
256) with the mask off and on, the step of `Trainer.train_step` (autocast forward with the
fused loss, backward, clip, AdamW step).

Off and on are the same model and batch: steps alternate in rounds (off on, then on off),
so drift on a shared machine hits both alike; tokens/s are medians over steps. The batch
holds documents of random lengths (EOS at random, 1 in `--doc-len` tokens on average), or
with `--aligned` documents of exactly `--doc-len` tokens in every row. On the matmul path
a query block skips, in each batch row, the keys of earlier documents that none of the
row's queries sees (rows in contiguous runs, one batched matmul each): with short documents
the mask saves work; one attention layer's tensors kept for backward (off, on) show how
much, and its time and tensors with one key range for all rows ("shared", RUN_COST
infinite: the kernel before per-row ranges, and bf16's), interleaved with the others, what
the per-row ranges gain (`--precision fp32`; in bf16 "on" is "shared"). Peak
memory is each mode's peak resident size in a process of its own (VmHWM after a few
steps; CPU) or `torch.cuda.max_memory_allocated` (GPU).

    python benchmarks/doc_mask.py                  # all-global layers, as throughput.py
    python benchmarks/doc_mask.py --window 64      # 1 local : 1 global, window 64
    python benchmarks/doc_mask.py --doc-len 32     # short documents (T / 8), random lengths
    python benchmarks/doc_mask.py --doc-len 32 --aligned  # every row: documents of 32 tokens
    python benchmarks/doc_mask.py --quick          # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, peak_rss_mb, result_line, set_threads, time_call  # noqa: E402
from throughput import FULL, QUICK, Setting  # noqa: E402

from kiln.config import OptimConfig  # noqa: E402
from kiln.model import Transformer  # noqa: E402
from kiln.model.doc_mask import document_ids  # noqa: E402
from kiln.optim import build_optimizer  # noqa: E402
from kiln.train.host_memory import keep_freed_memory  # noqa: E402
from kiln.train.precision import autocast, resolve_device, resolve_precision  # noqa: E402

EOS = 0


def setting(args: argparse.Namespace) -> Setting:
    s = QUICK if args.quick else FULL
    if args.window:
        s = dataclasses.replace(s, model=dataclasses.replace(
            s.model, local_per_global=1, sliding_window=args.window))
    return s


def make_batch(s: Setting, doc_len: int, device: torch.device,
               aligned: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(1, s.model.vocab_size, (s.batch, s.seq_len + 1), generator=g)
    if aligned:  # every row: an EOS ends each doc_len tokens
        eos = (torch.arange(batch.shape[1]) % doc_len == doc_len - 1).expand(batch.shape)
    else:
        eos = torch.rand(batch.shape, generator=g) < 1 / doc_len
    return batch.masked_fill(eos, EOS).to(device)


class Stepper:
    def __init__(self, s: Setting, device: torch.device, precision: str):
        torch.manual_seed(0)
        self.model = Transformer(s.model).to(device).train()
        self.optimizer = build_optimizer(self.model, OptimConfig())
        self.device, self.precision = device, precision

    def step(self, batch: torch.Tensor, masked: bool) -> float:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        docs = document_ids(inputs, EOS) if masked else None
        with autocast(self.device, self.precision):
            loss = self.model(inputs, targets=targets, doc_ids=docs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def attention_times(s: Setting, batch: torch.Tensor, precision: str, device: torch.device,
                    repeats: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds of one attention layer (local with `--window`, else global)'s forward +
    backward on the path training takes (`Attention` as the model runs it), off, on and on
    with one key range shared by the batch rows, interleaved: the mask's own cost, which the
    step's figures bury under the rest of the step and the machine's drift; and the MB the
    layer keeps for backward in each mode."""
    import kiln.model.matmul_attention as ma
    from kiln.model.layers import Attention, rope_tables

    m = s.model
    attn = Attention(m.dim, m.n_heads, m.n_kv_heads, window=m.sliding_window,  # local with --window
                     kernel=m.attn_kernel).to(device)
    x = torch.randn(s.batch, s.seq_len, m.dim, device=device, requires_grad=True)
    cos, sin = (t.to(device) for t in rope_tables(m.dim // m.n_heads, s.seq_len, m.rope_theta))
    docs = document_ids(batch[:, :-1], EOS)

    run_cost = ma.RUN_COST

    def run(mode: str) -> None:
        ma.RUN_COST = dict.fromkeys(run_cost, math.inf) if mode == "shared" else run_cost
        with autocast(device, precision):
            y = attn(x, cos, sin, doc_ids=None if mode == "off" else docs)
        y.float().sum().backward()
        ma.RUN_COST = run_cost

    modes = ("off", "on", "shared")
    saved: dict[str, float] = {}
    for mode in modes:
        sizes: list[int] = []

        def pack(x: torch.Tensor, sizes: list[int] = sizes) -> torch.Tensor:
            sizes.append(x.numel() * x.element_size())
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            run(mode)
        saved[mode] = sum(sizes) / 2**20
    out: dict[str, list[float]] = {mode: [] for mode in modes}
    for mode in modes * 2:
        run(mode)
    for r in range(repeats):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            out[mode].append(time_call(lambda m=mode: run(m)))
    return out, saved


def memory_child(args: argparse.Namespace, masked: bool) -> None:
    """One mode's peak memory, in this process alone: printed as JSON."""
    s, device = setting(args), resolve_device(args.device)
    set_threads()
    if device.type == "cpu":
        keep_freed_memory()
    precision = resolve_precision(args.precision, device)
    stepper = Stepper(s, device, precision)
    batch = make_batch(s, args.doc_len, device, args.aligned)
    for _ in range(3):
        stepper.step(batch, masked)
    peak = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
            else peak_rss_mb())
    print(json.dumps({"peak_mb": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--window", type=int, default=0, help="sliding window of the local "
                        "layers (1 local : 1 global); 0: every layer global")
    parser.add_argument("--doc-len", type=int, default=64, help="mean document length")
    parser.add_argument("--aligned", action="store_true", help="documents of exactly "
                        "--doc-len tokens in every row (not random lengths)")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--memory-child", choices=("off", "on"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args, args.memory_child == "on")
        return
    s, device = setting(args), resolve_device(args.device)
    threads = set_threads()
    if device.type == "cpu":
        keep_freed_memory()
    precision = resolve_precision(args.precision, device)
    batch = make_batch(s, args.doc_len, device, args.aligned)
    docs = int(document_ids(batch[:, :-1], EOS).amax(dim=1).add(1).sum())
    m = s.model
    print(f"torch {torch.__version__}, {device.type}, {threads} threads, {precision}; dim {m.dim}, "
          f"{m.n_layers} layers, {m.n_heads}/{m.n_kv_heads} heads, window {m.sliding_window} "
          f"(local_per_global {m.local_per_global}); batch {s.batch} x {s.seq_len}, "
          f"{docs} documents in it{' (aligned)' if args.aligned else ''}")
    stepper = Stepper(s, device, precision)
    for masked in (False, True, False, True):  # warmup
        stepper.step(batch, masked)
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}  # process CPU seconds per step
    rounds = 2 if args.quick else args.rounds
    for r in range(rounds):
        for masked in (False, True) if r % 2 == 0 else (True, False):
            for _ in range(2):
                start = time.process_time()
                times[masked].append(time_call(lambda m=masked: stepper.step(batch, m)))
                cpu[masked].append(time.process_time() - start)
    tokens = s.batch * s.seq_len
    tps = {k: tokens / median(v) for k, v in times.items()}
    layer, saved = attention_times(s, batch, precision, device, 6 if args.quick else 40)
    peaks = {}
    for mode in ("off", "on"):
        cmd = [sys.executable, __file__, "--memory-child", mode, "--doc-len", str(args.doc_len),
               "--precision", args.precision, "--device", args.device, "--window",
               str(args.window)] + (["--quick"] if args.quick else []) + (
               ["--aligned"] if args.aligned else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        peaks[mode] = json.loads(out.strip().splitlines()[-1])["peak_mb"]
    print(f"{'mask':<6}{'tokens/s':>10}{'step ms':>10}{'range ms':>14}{'peak MB':>10}")
    for key, mode in ((False, "off"), (True, "on")):
        lo, hi = 1000 * min(times[key]), 1000 * max(times[key])
        print(f"{mode:<6}{tps[key]:>10.0f}{1000 * median(times[key]):>10.1f}"
              f"{f'{lo:.0f}-{hi:.0f}':>14}{peaks[mode]:>10.0f}")
    # the ratio per round, from steps seconds apart: its spread shows the machine's drift
    per_round = [median(times[False][i:i + 2]) / median(times[True][i:i + 2])
                 for i in range(0, len(times[False]), 2)]
    print(f"on/off tokens/s per round: {', '.join(f'{r:.3f}' for r in per_round)}")
    # CPU seconds of the process per step (all threads): what other processes on a shared
    # machine inflate least (wall time waits for the cores they hold)
    cpu_ms = {k: 1000 * median(v) for k, v in cpu.items()}
    print(f"CPU ms per step (all threads): off {cpu_ms[False]:.0f}, on {cpu_ms[True]:.0f}")
    # the fastest of many interleaved calls: the least disturbed, the cost of the work itself
    layer_ms = {k: (1000 * min(v), 1000 * median(v)) for k, v in layer.items()}
    print("one attention layer, forward + backward, ms (fastest / median): " + ", ".join(
        f"{mode} {layer_ms[mode][0]:.1f} / {layer_ms[mode][1]:.1f}" for mode in layer_ms))
    print("one attention layer's tensors kept for backward, MB: " + ", ".join(
        f"{mode} {mb:.1f}" for mode, mb in saved.items()))
    best = {k: 1000 * min(v) for k, v in times.items()}
    print(f"fastest step ms: off {best[False]:.0f}, on {best[True]:.0f}")
    print(result_line(tokens_per_s_off=tps[False], tokens_per_s_on=tps[True],
                      on_over_off=tps[True] / tps[False], cpu_ms_off=cpu_ms[False],
                      cpu_ms_on=cpu_ms[True], best_step_ms_off=best[False],
                      best_step_ms_on=best[True], attn_layer_ms_off=layer_ms["off"][0],
                      attn_layer_ms_on=layer_ms["on"][0],
                      attn_layer_ms_shared=layer_ms["shared"][0], peak_mb_off=peaks["off"],
                      peak_mb_on=peaks["on"], attn_saved_mb_off=saved["off"],
                      attn_saved_mb_on=saved["on"], attn_saved_mb_shared=saved["shared"]))


if __name__ == "__main__":
    main()
