"""Seconds the default quickstart prepare pipeline adds over the bare read -> write pipeline.

Both run on the quickstart corpus (the interpreter's standard library) through datatrove's local
executor with the same tasks/workers; the default is QUICKSTART_STAGES, minus any stage whose
module is not importable yet (listed in the output, never silently). Target: < 60 s extra on
2 cores.

    python benchmarks/prepare_pipeline.py [--tasks 2 --workers 2 --max-bytes 0]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from kiln.data.pipeline import (
    QUICKSTART_STAGES,
    PrepareConfig,
    StageUnavailableError,
    resolve_factory,
    run_prepare,
)


def timed_prepare(stages: list[str], out: Path, args) -> tuple[float, dict]:
    cfg = PrepareConfig(stages=stages, tasks=args.tasks, workers=args.workers)
    start = time.perf_counter()
    summary = run_prepare(cfg, out, max_bytes=args.max_bytes, redo=True, progress=False)
    return time.perf_counter() - start, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-bytes", type=int, default=0, help="per task; 0 = whole stdlib")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    try:  # datatrove logs through loguru: keep the console to our own lines
        from loguru import logger

        logger.remove()
    except ImportError:
        pass
    stages, missing = [], []
    for name in QUICKSTART_STAGES:
        try:
            resolve_factory(name)
            stages.append(name)
        except StageUnavailableError as e:
            missing.append(name)
            print(f"skipping stage {name!r}: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        # an untimed read first (imports, the page cache), then plain, full, full, plain:
        # drift over the run hits both alike; each figure is the faster of its two runs
        timed_prepare(["read", "write"], Path(tmp) / "warm", args)
        times: dict[str, list[float]] = {"plain": [], "full": []}
        for i, kind in enumerate(("plain", "full", "full", "plain")):
            seconds, out = timed_prepare(["read", "write"] if kind == "plain" else stages,
                                         Path(tmp) / f"{kind}{i}", args)
            times[kind].append(seconds)
            if kind == "plain":
                plain = out
            else:
                full, full_dir = out, Path(tmp) / f"{kind}{i}"
        plain_s, full_s = min(times["plain"]), min(times["full"])
        rows = json.loads((full_dir / "yield.json").read_text())["stages"]
    print(f"read->write: {plain['documents_out']:,} docs, {plain['bytes_out']:,} bytes "
          f"in {plain_s:.1f}s")
    print(f"{'->'.join(stages)}: {full['documents_out']:,} docs, {full['bytes_out']:,} bytes "
          f"in {full_s:.1f}s (stages not available: {missing or 'none'})")
    for row in rows:
        print(f"  {row['stage']:<12} {row['documents_in']:>6} -> {row['documents_out']:>6} docs "
              f"({100 * (row['kept_fraction'] or 0):.1f}% kept) reasons {row['drop_reasons']}")
    kept_bytes = full["bytes_out"] / plain["bytes_out"] if plain["bytes_out"] else 0.0
    kept_docs = full["documents_out"] / plain["documents_out"] if plain["documents_out"] else 0.0
    print(f"RESULT pipeline_over_plain_s={full_s - plain_s:.2f} pipeline_s={full_s:.2f} "
          f"plain_s={plain_s:.2f} ratio={full_s / plain_s:.3f} kept_docs={kept_docs:.4f} "
          f"kept_bytes={kept_bytes:.4f} missing_stages={len(missing)}")


if __name__ == "__main__":
    main()
