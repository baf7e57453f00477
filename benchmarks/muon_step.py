"""Step time of Muon (+AdamW on embeddings and gains) against fused AdamW on Kiln models.

Two figures per model size, each timed interleaved in rounds (A B, then B A, ...) so drift
on a shared machine hits both alike, medians over rounds:

- optimizer only: `optimizer.step()` on fixed gradients;
- the whole train step as `Trainer.train_step` runs it: forward under autocast, loss,
  backward, clip, step, zero_grad (the issue's target: Muon <= 1.15x AdamW, tiny recipe).

It also times Muon's Newton-Schulz in bf16 against fp32 on this machine (the reason for
`muon_ns_dtype = "auto"`).

The models: a dim-256 4-layer dense Llama, recipes/trinity-tiny.toml's model (MoE, 16
experts per layer; vocab 4096 as its tokenizer) at its own batch and sequence length, and a
~20M dense model.

    python benchmarks/muon_step.py               # dim-256 dense, trinity-tiny, ~20M
    python benchmarks/muon_step.py --quick       # smoke test (< 1 minute)
    python benchmarks/muon_step.py --threads 1   # on a machine shared with other jobs
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, result_line, set_threads, time_call  # noqa: E402

from kiln.config import ModelConfig, OptimConfig, load_config  # noqa: E402
from kiln.model import Transformer, count_params  # noqa: E402
from kiln.optim import build_optimizer  # noqa: E402
from kiln.train.precision import autocast, resolve_precision  # noqa: E402


@dataclasses.dataclass
class Setting:
    name: str
    model: ModelConfig
    batch: int
    seq_len: int
    rounds: int


TINY = Setting("tiny", ModelConfig(vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4,
                                   max_seq_len=256), batch=16, seq_len=128, rounds=7)
M20 = Setting("20m", ModelConfig(vocab_size=8192, dim=512, n_layers=6, n_heads=8, n_kv_heads=4,
                                 max_seq_len=256), batch=8, seq_len=256, rounds=5)
TRINITY_RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "trinity-tiny.toml"


def trinity_tiny(rounds: int = 7) -> Setting:
    """The trinity-tiny recipe's model, batch and sequence length (vocab 4096, its tokenizer)."""
    cfg = load_config(TRINITY_RECIPE)
    cfg.model.vocab_size = 4096
    return Setting("trinity_tiny", cfg.model, batch=cfg.train.micro_batch,
                   seq_len=cfg.train.seq_len, rounds=rounds)


QUICK = Setting("quick", ModelConfig(vocab_size=1024, dim=128, n_layers=2, n_heads=4,
                                     n_kv_heads=2, max_seq_len=64), batch=4, seq_len=64, rounds=3)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # not Linux
        return "n/a"


def make(setting: Setting, optim: OptimConfig, device: torch.device):
    torch.manual_seed(0)
    model = Transformer(setting.model).to(device)
    return model, build_optimizer(model, optim)


def train_step(model, opt, batch, precision: str, device: torch.device) -> float:
    """`Trainer.train_step` on one micro-batch: the fused loss, MoE aux losses and the
    balancing update included (work common to both optimizers belongs in the ratio)."""
    with autocast(device, precision):
        loss = model(batch[:, :-1], targets=batch[:, 1:])
    aux = model.aux_loss()
    (loss if aux is None else loss + aux).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for layer in model.moe_layers():
        layer.update_bias()
    return loss.item()


def interleaved(fns: dict[str, callable], rounds: int) -> dict[str, float]:
    """Median seconds per call of each fn, run in alternating order each round."""
    for fn in fns.values():  # warm-up (allocations, first-touch of optimizer state)
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            times[k].append(time_call(fns[k]))
    return {k: median(v) for k, v in times.items()}


def bench(setting: Setting, device: torch.device, precision: str) -> dict[str, float]:
    adamw_cfg = OptimConfig(name="adamw", lr=3e-3)
    muon_cfg = OptimConfig(name="muon", lr=3e-3)
    fp32_cfg = OptimConfig(name="muon", lr=3e-3)
    fp32_cfg.muon_ns_dtype = "fp32"
    runs = {k: make(setting, c, device)
            for k, c in (("adamw", adamw_cfg), ("muon", muon_cfg), ("muon_fp32", fp32_cfg))}
    ns_dtype = next(g["ns_dtype"] for g in runs["muon"][1].param_groups if g["use_muon"])
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, setting.model.vocab_size, (setting.batch, setting.seq_len + 1),
                          generator=g).to(device)

    # optimizer only, on fixed gradients
    for model, _ in runs.values():
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g).to(device) * 1e-3
    opt_times = interleaved({k: opt.step for k, (_, opt) in runs.items()}, 2 * setting.rounds + 1)
    for _, opt in runs.values():
        opt.zero_grad(set_to_none=True)

    full = {k: (lambda m=m, o=o: train_step(m, o, batch, precision, device))
            for k, (m, o) in runs.items() if k != "muon_fp32"}
    step_times = interleaved(full, setting.rounds)
    params = count_params(runs["adamw"][0])["params"]
    print(f"[{setting.name}] params={params / 1e6:.1f}M batch={setting.batch}x{setting.seq_len} "
          f"precision={precision} muon_ns={ns_dtype}")
    print(f"  optimizer step: adamw {opt_times['adamw'] * 1e3:.1f} ms, muon "
          f"{opt_times['muon'] * 1e3:.1f} ms, muon(fp32 NS) {opt_times['muon_fp32'] * 1e3:.1f} ms")
    print(f"  train step:     adamw {step_times['adamw'] * 1e3:.1f} ms, muon "
          f"{step_times['muon'] * 1e3:.1f} ms")
    return {
        "opt_ratio": opt_times["muon"] / opt_times["adamw"],
        "train_ratio": step_times["muon"] / step_times["adamw"],
        "ns_fp32_over_auto": opt_times["muon_fp32"] / opt_times["muon"],
        "adamw_ms": opt_times["adamw"] * 1e3, "muon_ms": opt_times["muon"] * 1e3,
        "train_adamw_ms": step_times["adamw"] * 1e3, "train_muon_ms": step_times["muon"] * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny smoke run")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: every core this process may use)")
    args = ap.parse_args()
    threads = set_threads()
    if args.threads:
        torch.set_num_threads(threads := args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    precision = resolve_precision("auto", device)
    print(f"device={device} threads={threads} torch={torch.__version__} "
          f"loadavg={load_average()}")
    settings = [QUICK] if args.quick else [TINY, trinity_tiny(), M20]
    results = {s.name: bench(s, device, precision) for s in settings}
    print(f"loadavg at the end={load_average()} (others' jobs on these cores skew figures)")
    first = results[settings[0].name]
    figures = {"muon_over_adamw_step": first["opt_ratio"],
               "muon_over_adamw_train_step": first["train_ratio"],
               "ns_fp32_over_auto": first["ns_fp32_over_auto"],
               "adamw_step_ms": first["adamw_ms"], "muon_step_ms": first["muon_ms"]}
    for name, r in list(results.items())[1:]:
        figures[f"muon_over_adamw_step_{name}"] = r["opt_ratio"]
        figures[f"muon_over_adamw_train_step_{name}"] = r["train_ratio"]
    print(result_line(**figures))


if __name__ == "__main__":
    main()
