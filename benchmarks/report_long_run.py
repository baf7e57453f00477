"""What a days-long run's metrics.jsonl costs the tools that read it: `kiln report` (read,
summary, plots, page) and the resume's setting aside of the records past its checkpoint,
each against one plain pass of json.loads over the same file, measured in this process;
and the memory the report's records take per record.

    python benchmarks/report_long_run.py [--records 1000000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run = Path(tmp) / "run"
        synthesise(run, args.records)
        metrics = run / "metrics.jsonl"
        mb = metrics.stat().st_size / 1e6
        plain_s = seconds(lambda: plain_pass(metrics))
        report_s = seconds(lambda: build_report(run))
        resume_run = Path(tmp) / "resume"
        resume_run.mkdir()
        shutil.copy(metrics, resume_run / "metrics.jsonl")
        resume_s = seconds(lambda: set_aside_records_after(resume_run, args.records - 100))
        tracemalloc.start()
        records = read_metrics(metrics)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        per_record = held / len(records)
    print(f"{args.records} train records, {mb:.0f} MB of metrics.jsonl")
    print(f"plain json pass      {plain_s:8.2f} s")
    print(f"kiln report          {report_s:8.2f} s  ({report_s / plain_s:.2f}x)")
    print(f"resume set-aside     {resume_s:8.2f} s  ({resume_s / plain_s:.2f}x)")
    print(f"records in memory    {per_record:8.0f} bytes a record")
    print(f"RESULT records={args.records} metrics_mb={mb:.1f} report_over_plain={report_s / plain_s:.3f} "
          f"resume_over_plain={resume_s / plain_s:.3f} bytes_per_record={per_record:.0f}")


if __name__ == "__main__":
    main()
