"""Training throughput of Kiln's transformer against Hugging Face's LlamaForCausalLM.

Both models have the same sizes (~20M parameters, GQA, tied embeddings), the same
optimizer (Kiln's fused AdamW with its decay groups, applied to each model's
parameters), the same loss value (mean next-token cross-entropy in fp32) and the same
precision (fp32, then bf16 autocast). Each model computes the loss its own way, as its
users train it: Kiln's `model(x, targets=y)` (the fused head + cross-entropy, what
`Trainer.train_step` runs), HF's full logits upcast to fp32 and `F.cross_entropy`
(what its `labels=` loss does). The step is `Trainer.train_step`'s: set lr, forward under
autocast, loss, backward, clip, step, zero_grad, read the loss. Kiln picks its attention
kernel (blocked batched matmuls for training on CPU), so HF is timed with
each of its own (`sdpa` and `eager`) and the faster is the peer.

Steps of the two models are timed interleaved in rounds (A B, then B A, ...) so drift
on a shared machine hits both alike; tokens/s are medians over steps. The peak that
`peak_fraction` = kiln tokens/s x training FLOPs/token / matmul FLOP/s is taken against
is sampled the same way: after each round, the faster of a square `torch.matmul` and the
step's fastest GEMM (found by the GEMM floor) is timed, and the peak is the median of
those samples. On these shared machines the same GEMM runs 20-40% faster in one minute
than the next, so a peak taken at another time (or the best of many timings) would mostly
measure the drift; `peak_fraction_vs_best` divides by the best rate seen anywhere in the
run instead, the stricter figure.

    python benchmarks/throughput.py            # ~20M parameters (several minutes on 2 cores)
    python benchmarks/throughput.py --quick    # tiny smoke test (< 1 minute)
    python benchmarks/throughput.py --compile  # torch.compile both models (compile time reported)
    python benchmarks/throughput.py --precision fp32,bf16  # force bf16 on a CPU without it
    python benchmarks/throughput.py --device cuda --precision bf16 --batch 128  # a GPU

On a GPU the same comparison runs on the device (`--device auto` picks CUDA when one is
visible), the peak probe is an 8192^3 matmul, and `mfu` sets Kiln's model FLOP/s against
the GPU's datasheet dense bf16/fp32 peak where `common.SPEC_PEAKS` knows the chip. The ~20M model
at the issue's batch (16 x 256 tokens) is far too small to fill a GPU; `--batch` shows how
MFU grows with work per step.

bf16 runs by default only where the CPU multiplies bf16 natively (AVX-512 BF16 or AMX,
as `train.precision = "auto"` decides): elsewhere torch emulates it, ~70 times slower than
fp32 (a 4096x512x1408 matmul: 1.8 against 126 GFLOP/s on a 2-core AVX2 EPYC), and no one
would train that way.

The GEMM floor (`gemm_floor.py`) times the step's matrix multiplies alone; it bounds what
any implementation could reach here: `floor_fraction` is the highest `peak_fraction_vs_best`
and `hf_over_floor` the highest speedup over HF.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    chip_peak,
    matmul_flops,
    median,
    median_time,
    result_line,
    set_threads,
    time_call,
)
from gemm_floor import Floor, gemm_floor  # noqa: E402

from kiln.config import ModelConfig, OptimConfig  # noqa: E402
from kiln.model import Transformer, count_params, ffn_hidden_size, flops_per_token  # noqa: E402
from kiln.optim import build_optimizer  # noqa: E402
from kiln.train.host_memory import keep_freed_memory  # noqa: E402
from kiln.train.precision import autocast, resolve_device, resolve_precision  # noqa: E402


@dataclasses.dataclass
class Setting:
    model: ModelConfig
    batch: int
    seq_len: int
    warmup: int  # untimed steps per model and precision (compilation happens here)
    rounds: int  # interleaved rounds; each times `steps` steps of each model
    steps: int
    matmul_n: tuple[int, ...]  # square matmul sizes timed for the peak (the smallest each round)
    matmul_repeats: int


FULL = Setting(
    model=ModelConfig(vocab_size=8192, dim=512, n_layers=6, n_heads=8, n_kv_heads=4,
                      max_seq_len=256, tie_embeddings=True),
    batch=16, seq_len=256, warmup=2, rounds=8, steps=2, matmul_n=(2048, 4096), matmul_repeats=5,
)
QUICK = Setting(
    model=ModelConfig(vocab_size=1024, dim=128, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_seq_len=64, tie_embeddings=True),
    batch=4, seq_len=64, warmup=1, rounds=2, steps=2, matmul_n=(1024,), matmul_repeats=3,
)


def spec_peak(device: torch.device, precision: str) -> float | None:
    """The datasheet peak of this GPU at `precision`, or None (CPUs, unknown chips)."""
    if device.type != "cuda":
        return None
    return chip_peak(torch.cuda.get_device_name(device), precision)


HF_ATTENTION = ("sdpa", "eager")  # HF's attention choices; the peer is the faster one


def hf_llama(cfg: ModelConfig, attention: str = "sdpa") -> torch.nn.Module:
    """The same architecture as Hugging Face's LlamaForCausalLM (no dropout), with one of
    HF's attention implementations."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=ffn_hidden_size(cfg),
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.dim // cfg.n_heads,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        initializer_range=cfg.init_std,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation=attention,
    )
    return LlamaForCausalLM(hf_cfg)


class PeakProbe:
    """The matmul rate available now: the faster of an n x n x n matmul and the step's
    fastest GEMM, each the median of a few calls."""

    def __init__(self, dtype: torch.dtype, n: int, floor: Floor, device: torch.device,
                 repeats: int = 3):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        self.calls = [(lambda: torch.matmul(a, b), 2 * n**3), (floor.best_call, floor.best_flops)]
        self.repeats = repeats

    def sample(self) -> float:
        return max(flops / median_time(call, self.repeats) for call, flops in self.calls)


class Runner:
    """One model with its optimizer, stepping exactly as `Trainer.train_step` does."""

    def __init__(self, name: str, model: torch.nn.Module, forward, precision: str,
                 compile_model: bool, device: torch.device):
        self.name, self.precision, self.device = name, precision, device
        self.model = model.to(device).train()
        self.optimizer = build_optimizer(model, OptimConfig())
        self.clip = OptimConfig().grad_clip
        self.forward = torch.compile(forward) if compile_model else forward
        self.times: list[float] = []
        self.losses: list[float] = []

    def step(self, batch: torch.Tensor) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = OptimConfig().lr
        inputs, targets = batch[:, :-1], batch[:, 1:]
        with autocast(self.device, self.precision):
            loss = self.forward(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.item())


def bench_precision(s: Setting, precision: str, compile_model: bool, batch: torch.Tensor,
                    device: torch.device) -> dict:
    torch.manual_seed(0)
    kiln_model = Transformer(s.model)
    runners = [Runner("kiln", kiln_model, lambda x, y: kiln_model(x, targets=y), precision,
                      compile_model, device)]
    for attention in HF_ATTENTION:  # Kiln picks its attention kernel: HF gets its best too
        hf_model = hf_llama(s.model, attention)
        runners.append(Runner(f"hf_{attention}", hf_model, lambda x, y, m=hf_model: F.cross_entropy(
            m(input_ids=x, use_cache=False).logits.flatten(0, 1).float(), y.flatten()),
            precision, compile_model, device))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    # and again after the steps
    floor_before = gemm_floor(s.model, s.batch, s.seq_len, dtype, device=device)
    probe = PeakProbe(dtype, min(s.matmul_n), floor_before, device)
    peaks = []
    warm = {}
    for r in runners:
        start = time.perf_counter()
        for _ in range(s.warmup):
            r.step(batch)
        warm[r.name] = time.perf_counter() - start
    warm["hf"] = max(warm[f"hf_{a}"] for a in HF_ATTENTION)
    for i in range(s.rounds):
        for r in runners if i % 2 == 0 else runners[::-1]:
            for _ in range(s.steps):
                r.times.append(time_call(lambda r=r: r.step(batch)))
        peaks.append(probe.sample())
    # the faster of the two floors: a lower bound should not inherit a slow spell's drift
    floor_after = gemm_floor(s.model, s.batch, s.seq_len, dtype, device=device)
    floor = min(floor_before, floor_after, key=lambda f: f.seconds)
    square = max(matmul_flops(dtype, n, s.matmul_repeats, device) for n in s.matmul_n)
    # the best GEMM rate of either floor: the step's shapes can beat squares
    gemm_peak = max(floor_before.best_rate, floor_after.best_rate)
    tokens = batch.shape[0] * (batch.shape[1] - 1)
    out = {"peak": median(peaks), "best_peak": max(square, gemm_peak, *peaks),
           "peak_range": (min(peaks), max(peaks)), "square_peak": square, "warmup_s": warm,
           "gemm_peak": gemm_peak}
    for r in runners:
        out[r.name] = tokens / median(r.times)
        out[r.name + "_spread"] = (tokens / max(r.times), tokens / min(r.times))
        if not all(map(lambda v: v == v, r.losses)):
            raise RuntimeError(f"{r.name} produced a NaN loss under {precision}")
        out[r.name + "_losses"] = (r.losses[0], r.losses[-1])
    peer = max(HF_ATTENTION, key=lambda a: out[f"hf_{a}"])
    out["hf_attention"] = peer
    out["hf"], out["hf_spread"] = out[f"hf_{peer}"], out[f"hf_{peer}_spread"]
    out["ratio"] = out["kiln"] / out["hf"]
    # the same ratio per round, from steps minutes apart at most: its spread shows how far
    # the drift of a shared machine moves one run's figure
    peer_times = next(r.times for r in runners if r.name == f"hf_{peer}")
    per_round = [median(peer_times[i:i + s.steps]) / median(runners[0].times[i:i + s.steps])
                 for i in range(0, len(peer_times), s.steps)]
    out["round_ratios"] = (median(per_round), min(per_round), max(per_round))
    out["fraction"] = out["kiln"] * flops_per_token(s.model, s.seq_len) / out["peak"]
    out["fraction_vs_best"] = out["kiln"] * flops_per_token(s.model, s.seq_len) / out["best_peak"]
    spec = spec_peak(device, precision)
    out["mfu"] = out["kiln"] * flops_per_token(s.model, s.seq_len) / spec if spec else None
    out["hf_mfu"] = out["hf"] * flops_per_token(s.model, s.seq_len) / spec if spec else None
    out["floor"] = tokens / floor.seconds  # tokens/s if only the GEMMs took time
    out["floor_parts"] = floor.parts
    # best against best: the floor is the fastest timing of each GEMM, so it is set against
    # the best rate seen (it cannot exceed 1 then), not the median peak
    out["floor_fraction"] = floor.flops / floor.seconds / out["best_peak"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--precision", default="", help="comma list of fp32,bf16 (default: "
                        "fp32, and bf16 where the device runs it natively)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto: CUDA when a GPU is visible, else CPU")
    parser.add_argument("--batch", type=int, default=0, help="sequences per step "
                        "(default: the setting's, 16 for the full run)")
    args = parser.parse_args()
    if args.batch < 0:
        parser.error("--batch must be positive")
    unknown = set(args.precision.split(",")) - {"fp32", "bf16"} if args.precision else set()
    if unknown:
        parser.error(f"--precision takes fp32 and/or bf16, got {', '.join(sorted(unknown))}")
    s = QUICK if args.quick else FULL
    if args.compile:  # compilation and any recompilation on the next calls stay untimed
        s = dataclasses.replace(s, warmup=max(s.warmup, 3))
    if args.batch:
        s = dataclasses.replace(s, batch=args.batch)
    device = resolve_device(args.device)
    if device.type == "cuda":  # a 2048^3 product cannot keep a datacenter GPU busy
        s = dataclasses.replace(s, matmul_n=(8192,), matmul_repeats=10)
    threads = set_threads()
    # as Trainer does on CPU; process-wide, so every model gets it
    kept = keep_freed_memory() if device.type == "cpu" else False
    torch.manual_seed(0)
    batch = torch.randint(0, s.model.vocab_size, (s.batch, s.seq_len + 1)).to(device)
    params = count_params(Transformer(s.model))["params"]
    fpt = flops_per_token(s.model, s.seq_len)

    m = s.model
    where = (f"{torch.cuda.get_device_name(device)}" if device.type == "cuda"
             else f"CPU, {threads} threads (torch.set_num_threads)")
    print(f"torch {torch.__version__}, {where}, compile={args.compile}, "
          f"freed host memory kept={kept}")
    print(f"model: dim {m.dim}, {m.n_layers} layers, {m.n_heads} heads / {m.n_kv_heads} kv, "
          f"ffn {ffn_hidden_size(m)}, vocab {m.vocab_size}, tied={m.tie_embeddings}; "
          f"{params / 1e6:.2f}M params; {fpt / 1e6:.1f} MFLOP/token (train)")
    print(f"batch {s.batch} x {s.seq_len} tokens; {s.warmup} warmup steps, "
          f"{s.rounds} interleaved rounds x {s.steps} steps per model; loss: "
          f"kiln: model(x, targets=y) (fused); hf: cross_entropy(logits.float()); hf timed with "
          f"{' and '.join(HF_ATTENTION)} attention, the faster is the peer")
    auto = resolve_precision("auto", device)  # what train.precision = "auto" picks
    precisions = args.precision.split(",") if args.precision else ["fp32", "bf16"][:1 + (auto == "bf16")]
    if not args.precision and auto == "fp32" and device.type == "cpu":
        print("bf16: not run: this CPU has neither AVX-512 BF16 nor AMX, so torch emulates "
              "bf16 matmuls (tens of times slower than fp32) and training uses fp32; "
              "--precision fp32,bf16 forces it")
    load_before = os.getloadavg()[0]
    res = {p: bench_precision(s, p, args.compile, batch, device) for p in precisions}
    load_after = os.getloadavg()[0]

    print()
    print(f"{'precision':<10}{'kiln tok/s':>12}{'hf tok/s':>12}{'kiln/hf':>9}"
          f"{'matmul GFLOP/s':>16}{'kiln % peak':>13}{'hf % peak':>11}"
          f"{'warmup s (k/hf)':>18}")
    for p, r in res.items():
        hf_frac = r["hf"] * fpt / r["peak"]
        print(f"{p:<10}{r['kiln']:>12.0f}{r['hf']:>12.0f}{r['ratio']:>9.3f}"
              f"{r['peak'] / 1e9:>16.0f}{100 * r['fraction']:>12.1f}%{100 * hf_frac:>10.1f}%"
              f"{r['warmup_s']['kiln']:>9.1f}/{r['warmup_s']['hf']:.1f}")
    for p, r in res.items():
        lo, hi = r["kiln_spread"]
        hlo, hhi = r["hf_spread"]
        print(f"  {p} per-step range: kiln {lo:.0f}-{hi:.0f} tok/s, hf {hlo:.0f}-{hhi:.0f} tok/s")
        mid, rlo, rhi = r["round_ratios"]
        print(f"  {p} kiln/hf per round: median {mid:.3f}, range {rlo:.3f}-{rhi:.3f}")
        # every step trains on the same batch: a model that learns drives its loss down
        print(f"  {p} loss, first -> last step (one batch, repeated): " + ", ".join(
            f"{n} {r[n + '_losses'][0]:.3f} -> {r[n + '_losses'][1]:.3f}"
            for n in ("kiln", *(f"hf_{a}" for a in HF_ATTENTION))))
        if r["kiln_losses"][1] > 0.99 * r["kiln_losses"][0]:
            print(f"  WARNING: {p}: kiln's loss did not fall over the steps: it is not learning")
        print(f"  {p} hf by attention: " + ", ".join(
            f"{a} {r[f'hf_{a}']:.0f} tok/s" for a in HF_ATTENTION) + f" (peer: {r['hf_attention']})")
    print()
    print("GEMM floor (the step's matmuls alone, each in its fastest layout; gemm_floor.py):")
    for p, r in res.items():
        parts = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in r["floor_parts"].items())
        lo, hi = r["peak_range"]
        print(f"  {p}: peak = {r['peak'] / 1e9:.0f} GFLOP/s, the median of {s.rounds} samples "
              f"between rounds ({lo / 1e9:.0f}-{hi / 1e9:.0f}); best rate seen in the run "
              f"{r['best_peak'] / 1e9:.0f} (square matmul {r['square_peak'] / 1e9:.0f}, fastest "
              f"step GEMM {r['gemm_peak'] / 1e9:.0f}): kiln at "
              f"{100 * r['fraction_vs_best']:.1f}% of it")
        print(f"  {p}: {r['floor']:.0f} tok/s = {100 * r['floor_fraction']:.1f}% of the best rate; "
              f"ms: {parts}; kiln at {100 * r['kiln'] / r['floor']:.0f}% of the floor's "
              f"speed; the most any implementation gains over hf: {r['floor'] / r['hf']:.2f}x")
    for p, r in res.items():
        if r["mfu"] is not None:
            print(f"  {p}: MFU against the datasheet peak ({spec_peak(device, p) / 1e12:.0f} "
                  f"TFLOP/s): kiln {100 * r['mfu']:.1f}%, hf {100 * r['hf_mfu']:.1f}%")
    if device.type == "cuda":
        print(f"  GPU memory: peak allocated {torch.cuda.max_memory_allocated(device) / 2**30:.2f}"
              f" GiB over the run (both models, all precisions)")
    print(f"targets: kiln/hf >= 1.2 and >= 60% of matmul peak, at the training precision "
          f"(train.precision = auto picks {auto} on this {device.type})")
    if device.type == "cpu" and max(load_before, load_after) > threads + 0.5:
        print(f"WARNING: load average {load_before:.1f} -> {load_after:.1f} on {threads} threads: "
              "other processes competed for the CPU; these figures are not reliable")
    main_p = auto if auto in res else precisions[0]
    figures = {"speedup_vs_hf": res[main_p]["ratio"], "peak_fraction": res[main_p]["fraction"],
               "peak_fraction_vs_best": res[main_p]["fraction_vs_best"],
               "floor_fraction": res[main_p]["floor_fraction"],
               "hf_over_floor": res[main_p]["floor"] / res[main_p]["hf"],
               "bf16": int(main_p == "bf16"), "batch": s.batch}
    if res[main_p]["mfu"] is not None:
        figures |= {"mfu": res[main_p]["mfu"], "hf_mfu": res[main_p]["hf_mfu"]}
    for p, r in res.items():
        figures |= {f"speedup_vs_hf_{p}": r["ratio"], f"peak_fraction_{p}": r["fraction"],
                    f"peak_fraction_vs_best_{p}": r["fraction_vs_best"],
                    f"hf_eager_over_sdpa_{p}": r["hf_eager"] / r["hf_sdpa"],
                    f"floor_fraction_{p}": r["floor_fraction"],
                    f"hf_over_floor_{p}": r["floor"] / r["hf"], f"kiln_tokens_per_s_{p}": r["kiln"],
                    f"hf_tokens_per_s_{p}": r["hf"],
                    f"round_ratio_median_{p}": r["round_ratios"][0],
                    f"round_ratio_min_{p}": r["round_ratios"][1],
                    f"round_ratio_max_{p}": r["round_ratios"][2]}
    print(result_line(**figures, params=params))


if __name__ == "__main__":
    main()
