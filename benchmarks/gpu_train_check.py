"""The training path on a GPU, end to end: train, SIGKILL at a random step, resume, eval.

Takes a run directory that `kiln prepare/tokenizer/tokenize` already filled (the
quickstart's, say) and, on CUDA at the training precision `auto` picks (bf16 there):

1. trains a reference run for `--steps` steps, a checkpoint every `--every` steps;
2. trains the same run again in a copy, SIGKILLs the process after a random logged step,
   resumes it, and compares every logged loss with the reference: bitwise where the
   kernels are deterministic, otherwise the largest difference is printed;
3. runs `kiln eval` and `kiln generate` on the result (both on the GPU);
4. gives the reference run's MFU: its median logged tokens/s per rank x the model's training
   FLOPs per token (model.json's `flops_per_token`), over the datasheet dense peak of the
   GPU at the run's precision (`common.SPEC_PEAKS`: 989 TFLOP/s bf16 on an H100 SXM or an
   H200). The quickstart's ~4M model at 16 x 128 tokens a step is launch-bound on such a
   GPU (~0.4% at 140k tokens/s); `--set model.dim=... --set train.global_batch=...` give it
   more work per step.

    python benchmarks/gpu_train_check.py runs/quickstart --steps 300 --every 50

CPU runs of the same protocol are the test suite's (tests/test_train.py); this script is
the one to run where a GPU is lent. It ends with a `RESULT` line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import chip_peak, result_line  # noqa: E402


def losses(run: Path) -> dict[int, float]:
    out = {}
    path = run / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a last line the kill cut short
            continue
        if r.get("kind") == "train":
            out[r["step"]] = r["loss"]
    return out


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == kind]


def kiln(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kiln.cli", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                 f"\n{done.stderr[-3000:]}")
    return done


def gpu_name(device: str) -> str | None:
    """The name of the GPU `device` trains on, or None on a CPU. Asked in a process of its
    own, so that this one holds no CUDA context while the runs train."""
    if not device.startswith("cuda"):
        return None
    index = device.partition(":")[2] or "0"
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name("
                           f"{int(index)}))"], capture_output=True, text=True, timeout=120)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def mfu(run: Path, tokens_per_s: float, gpu: str | None) -> tuple[float | None, float | None]:
    """(model FLOPs utilisation, the peak it is taken against) of a run that trained at
    `tokens_per_s` (all ranks together) on GPUs named `gpu`; (None, None) where the chip's
    peak is unknown (a CPU, a GPU not in the table)."""
    model = json.loads((run / "model.json").read_text())
    peak = chip_peak(gpu, model["precision"]) if gpu else None
    if peak is None:
        return None, None
    per_rank = tokens_per_s / model.get("world_size", 1)
    return per_rank * model["flops_per_token"] / peak, peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a prepared and tokenized run directory")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="checkpoint every N steps")
    parser.add_argument("--device", default="cuda", help="train.device (cpu tries the script)")
    parser.add_argument("--set", action="append", default=[], help="more config overrides")
    args = parser.parse_args(argv)
    # checked before anything runs: a GPU session's minutes are few, and the reference run
    # alone can take ten of them
    if args.steps < 2 * args.every + 2:
        parser.error("--steps must leave room for a kill after the first checkpoint: "
                     "at least 2 x --every + 2")
    if not (args.run / "tokens" / "index.json").is_file():
        parser.error(f"{args.run}: not a tokenized run directory (no tokens/index.json); "
                     "run kiln prepare, tokenizer and tokenize on it first")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            sys.exit("gpu_train_check: --device cuda but no CUDA device is visible here "
                     "(nothing run); --device cpu tries the script on CPU")
    sets = [f"train.steps={args.steps}", f"train.checkpoint_every={args.every}",
            f"train.device={args.device}", *args.set]
    overrides = [a for s in sets for a in ("--set", s)]
    work = Path(tempfile.mkdtemp(prefix="kiln-gpu-"))
    reference, killed = work / "reference", work / "killed"
    for d in (reference, killed):
        shutil.copytree(args.run, d, ignore=shutil.ignore_patterns(
            "checkpoints", "metrics.jsonl", "report*", "eval*.json", "export", "samples*"))

    start = time.perf_counter()
    done = kiln("train", str(reference), "--fresh", *overrides)
    reference_s = time.perf_counter() - start
    print(done.stdout[-2500:])
    expected = losses(reference)
    train = records(reference, "train")
    val = records(reference, "val")
    print(f"reference: {len(expected)} logged steps in {reference_s:.1f} s; first loss "
          f"{train[0]['loss']:.3f}, last {train[-1]['loss']:.3f}; last val "
          f"{ {k: v for k, v in val[-1].items() if k != 'kind'} if val else None}")

    kill_at = random.Random().randint(args.every + 1, args.steps - args.every)
    cmd = [sys.executable, "-m", "kiln.cli", "train", str(killed), "--fresh", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if max(losses(killed), default=0) >= kill_at:
            break
        time.sleep(0.02)
    exited = proc.poll()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = max(losses(killed), default=0)
    if at_kill >= args.steps:
        sys.exit("the run finished before it could be killed; give it more --steps")
    if exited is not None:  # a crash is not the kill this checks: say so, rerun it to see why
        sys.exit(f"the run to kill exited by itself (exit {exited}) after logged step "
                 f"{at_kill}: {' '.join(cmd)}")
    if at_kill < kill_at:
        sys.exit(f"the run to kill logged only step {at_kill} of {kill_at} in 600 s")
    kiln("train", str(killed), *overrides)
    resumed = losses(killed)
    common = sorted(set(expected) & set(resumed))
    diffs = [abs(expected[s] - resumed[s]) for s in common]
    bitwise = resumed == expected
    print(f"killed after logged step {at_kill}, resumed: {len(common)} steps compared, "
          f"bitwise identical: {bitwise}, largest |difference| {max(diffs):.3g}")

    more = [a for s in args.set for a in ("--set", s)]
    ev = kiln("eval", str(reference), "--set", f"train.device={args.device}", *more)
    print(ev.stdout[-800:])
    gen = kiln("generate", str(reference), "--set", f"train.device={args.device}", *more)
    print(gen.stdout[:800])
    tok_s = [r["tokens_per_s"] for r in train if "tokens_per_s" in r]
    median_tok_s = sorted(tok_s)[len(tok_s) // 2] if tok_s else 0
    gpu = gpu_name(args.device)
    util, peak = mfu(reference, median_tok_s, gpu)
    if util is not None:
        print(f"MFU {100 * util:.2f}% against {gpu}'s {peak / 1e12:.0f} TFLOP/s dense peak "
              f"({median_tok_s:,.0f} tokens/s, median of the logged windows)")
    else:
        print(f"MFU: no datasheet peak for {gpu or args.device} (common.SPEC_PEAKS)")
    print(result_line(bitwise_resume=int(bitwise), resume_max_diff=max(diffs),
                      killed_at=at_kill, final_loss=train[-1]["loss"],
                      tokens_per_s=median_tok_s, train_s=reference_s,
                      **({"mfu": util, "peak_tflops": peak / 1e12} if util is not None else {})))
    if os.environ.get("KEEP_WORK") is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
