"""What a days-long run's metrics.jsonl costs the tools that read it: `kiln report` (read,
summary, plots, page) and the resume's setting aside of the records past its checkpoint,
each against one plain pass of json.loads over the same file, measured in this process;
and the memory the report's records take per record. An untimed report of a small run
first (matplotlib's first figure loads its fonts), then `--rounds` rounds of the three,
their order reversed each round; each figure is the median over the rounds.

    python benchmarks/report_long_run.py [--records 1000000] [--rounds 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from kiln.report import build_report, read_metrics
from kiln.train.metrics_tail import set_aside_records_after


def synthesise(run: Path, n: int) -> None:
    """A run of `n` train records, one val record per 1000 steps, a stretch re-logged after a
    kill (with the torn line it left) and a diverged record at the end."""
    rng = random.Random(0)
    run.mkdir(parents=True)

    def train(step: int) -> str:
        return json.dumps({"kind": "train", "step": step,
                           "loss": 2 + 8 * math.exp(-10 * step / n) + rng.gauss(0, 0.1),
                           "loss_steps": 1, "lr": 3e-4, "grad_norm": abs(rng.gauss(1, 0.2)),
                           "tokens": step * 4096, "tokens_per_s": 5e4 + rng.gauss(0, 2e3),
                           "elapsed_s": step * 0.08}) + "\n"

    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, n + 1):
            f.write(train(step))
            if step % 1000 == 0:
                f.write(json.dumps({"kind": "val", "step": step, "val_loss": 2.5,
                                    "val_bpb": 1.2 + 1 / math.log(step + 2)}) + "\n")
            if step == n // 2 + 500:  # killed mid-line, resumed from the step n // 2 checkpoint
                f.write('{"kind": "train", "st\n')
                f.writelines(train(s) for s in range(n // 2 + 1, step + 1))
        f.write(json.dumps({"kind": "diverged", "step": n, "what": "the loss is not finite"}) + "\n")


def plain_pass(path: Path) -> None:
    with open(path) as f:
        for line in f:
            try:
                json.loads(line)
            except ValueError:
                pass


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_rounds(tmp: Path, run: Path, records: int, rounds: int) -> dict[str, float]:
    """Median seconds of the plain pass, the report and the resume's set-aside over `rounds`
    rounds (A B C, then C B A: drift on a shared machine hits all alike), after a warm-up."""
    warm = tmp / "warm"
    synthesise(warm, 1000)
    build_report(warm)  # imports done, fonts loaded: not part of the timed report
    metrics = run / "metrics.jsonl"
    resume_run = tmp / "resume"
    resume_run.mkdir()

    def resume() -> None:
        set_aside_records_after(resume_run, records - 100)

    calls = {"plain": lambda: plain_pass(metrics), "report": lambda: build_report(run),
             "resume": resume}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in calls if r % 2 == 0 else list(calls)[::-1]:
            if name == "resume":  # the set-aside moves records out: a fresh copy each time
                shutil.copy(metrics, resume_run / "metrics.jsonl")
            times[name].append(seconds(calls[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    if args.rounds < 1 or args.records < 1000:
        parser.error("--rounds must be at least 1 and --records at least 1000")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run = Path(tmp) / "run"
        synthesise(run, args.records)
        metrics = run / "metrics.jsonl"
        mb = metrics.stat().st_size / 1e6
        t = timed_rounds(Path(tmp), run, args.records, args.rounds)
        plain_s, report_s, resume_s = t["plain"], t["report"], t["resume"]
        tracemalloc.start()
        records = read_metrics(metrics)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        per_record = held / len(records)
    print(f"{args.records} train records, {mb:.0f} MB of metrics.jsonl, median of {args.rounds} rounds")
    print(f"plain json pass      {plain_s:8.2f} s")
    print(f"kiln report          {report_s:8.2f} s  ({report_s / plain_s:.2f}x)")
    print(f"resume set-aside     {resume_s:8.2f} s  ({resume_s / plain_s:.2f}x)")
    print(f"records in memory    {per_record:8.0f} bytes a record")
    print(f"RESULT records={args.records} metrics_mb={mb:.1f} report_over_plain={report_s / plain_s:.3f} "
          f"resume_over_plain={resume_s / plain_s:.3f} bytes_per_record={per_record:.0f}")


if __name__ == "__main__":
    main()
