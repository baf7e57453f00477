"""Trinity-tiny against a plain Llama of equal active parameters, same data, same steps.

    python benchmarks/trinity_vs_dense.py               # the recipes' 200 steps each
    python benchmarks/trinity_vs_dense.py --steps 100   # shorter
    python benchmarks/trinity_vs_dense.py --quick      # smoke test (~1 minute; see QUICK)
    python benchmarks/trinity_vs_dense.py --threads 1  # one CPU thread per run

Runs `kiln run recipes/trinity-tiny.toml` and `kiln run recipes/dense-tiny.toml` (prepare,
tokenizer, tokenize, train, eval, generate, export, report) one after the other in
subprocesses, into RUNS/trinity-tiny and RUNS/dense-tiny (both folders are deleted first:
`kiln train` would otherwise resume an older run's checkpoints), then writes the comparison
report `kiln report RUNS/trinity-tiny --compare RUNS/dense-tiny`.

Figures: validation bits per byte on the whole val split after training (eval.json), and
training tokens/s (mean over the second half of the steps, from metrics.jsonl) as a ratio
Trinity / dense. Both runs share the machine in turn, never at the same time.

On a CPU shared with other jobs, threads waiting on each other cost Trinity far more than
the dense model: its step runs ~1,000 small expert matmuls (each one a wait for a thread the
other jobs may hold), dense a few dozen large ones. With the load at 7 on 2 cores a
trinity-tiny step (16 x 128 tokens, bf16) took 10-28 s on 2 threads and 0.4-0.9 s on one;
`--quick` (as a smoke test) therefore runs on one thread unless `--threads` says otherwise:
46 s in all there against 4 min 16 s on 2 threads, the same losses.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_line  # noqa: E402

from kiln.config import run_dir_override  # noqa: E402
from kiln.report import read_metrics  # noqa: E402
from kiln.report.summary import summarize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("trinity-tiny", "dense-tiny")
# --quick: the same two models on ~0.5 MB of the corpus read and written as it is (no
# quality, PII or dedup stages), a 1,024-token vocabulary, 12 steps of 4 x 128 tokens logged
# every 2 (the ratio needs records in the second half), validation, eval and generation cut
# to a few batches and tokens. A smoke test of the whole chain and of the RESULT line: its
# figures are not the full run's (a quarter of the batch, the models barely trained).
QUICK = ("data.max_bytes=250000", 'prepare.stages=["read", "write"]',
         "tokenizer.vocab_size=1024", "train.steps=12", "train.global_batch=4",
         "train.micro_batch=4", "train.log_every=2", "train.eval_every=0",
         "train.eval_batches=2", "train.checkpoint_every=12", "eval.max_batches=2",
         "eval.next_token_positions=0", 'generate.prompts=["def "]', "generate.max_new_tokens=4")


def kiln(*args: str, threads: int = 0) -> None:
    """`kiln ARGS` in a subprocess; `threads` > 0 sets its OMP_NUM_THREADS (torch's threads)."""
    cmd = [sys.executable, "-m", "kiln.cli", *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    print(("" if not threads else f"OMP_NUM_THREADS={threads} ") + "$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stdout[-4000:]}")
    for line in done.stdout.splitlines():  # the verbs' one-line summaries, not the progress bars
        if line.startswith(("export", "eval", "report", "tokenize", "[")):
            print("  " + line, flush=True)


def figures(run_dir: Path) -> dict[str, float]:
    evaluation = json.loads((run_dir / "eval.json").read_text())
    model = json.loads((run_dir / "model.json").read_text())
    summary = summarize(read_metrics(run_dir / "metrics.jsonl"))
    return {"val_bpb": evaluation["bpb"], "tokens_per_s": summary.mean_tokens_per_s or 0.0,
            "final_loss": summary.final_train_loss or float("nan"),
            "params": model["params"], "params_active": model["params_active"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="train steps (0: the recipes', "
                        "or --quick's 12)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: little data, tiny batches, 12 steps, one thread "
                        "(see QUICK)")
    parser.add_argument("--threads", type=int, default=-1, help="CPU threads of each run "
                        "(OMP_NUM_THREADS; default: torch's own choice, 1 with --quick)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench-trinity-vs-dense",
                        help="where the runs go: its trinity-tiny/ and dense-tiny/ are replaced "
                        "(default: a folder of its own, not the recipes' runs/trinity-tiny)")
    args = parser.parse_args()
    threads = args.threads if args.threads >= 0 else (1 if args.quick else 0)
    results, wall = {}, {}
    for name in RECIPES:
        run_dir = (args.runs / name).resolve()
        shutil.rmtree(run_dir, ignore_errors=True)
        overrides = [run_dir_override(run_dir), *(QUICK if args.quick else ())]
        if args.steps:
            overrides.append(f"train.steps={args.steps}")
        start = time.perf_counter()
        kiln("run", str(ROOT / "recipes" / f"{name}.toml"),
             *[a for o in overrides for a in ("--set", o)], threads=threads)
        wall[name] = time.perf_counter() - start
        results[name] = figures(run_dir)
    trinity, dense = (args.runs / r for r in RECIPES)
    kiln("report", str(trinity.resolve()), "--compare", str(dense.resolve()))

    print(f"\n{'run':<14}{'params':>10}{'active':>10}{'final loss':>12}{'val bpb':>10}"
          f"{'tokens/s':>10}{'wall s':>9}")
    for name, f in results.items():
        print(f"{name:<14}{f['params']:>10,}{f['params_active']:>10,}{f['final_loss']:>12.4f}"
              f"{f['val_bpb']:>10.4f}{f['tokens_per_s']:>10.0f}{wall[name]:>9.0f}")
    t, d = results["trinity-tiny"], results["dense-tiny"]
    if not (t["tokens_per_s"] and d["tokens_per_s"]):  # a run too short to log a rate
        raise SystemExit("a run logged no tokens/s (too few steps for a log record past the "
                         "first): run with more --steps")
    print(f"comparison report: {trinity / 'report.html'}")
    print(result_line(trinity_val_bpb=t["val_bpb"], dense_val_bpb=d["val_bpb"],
                      trinity_over_dense_tokens_per_s=t["tokens_per_s"] / d["tokens_per_s"]))


if __name__ == "__main__":
    main()
