"""Kill `kiln train` at every write of a tiny run, re-run it, and compare the run folder with
an uninterrupted run's: the same files (no temp or hidden leftovers), the same checkpoints,
bitwise the same weights. Prints one line per kill that differs and a RESULT line.

    PYTHONPATH=src python scripts/kill_sweep.py [--fresh] [--targets os:fsync,os:replace]

--fresh: the killed command is `kiln train RUN --fresh` on a run trained once; the re-run is
`kiln train RUN --fresh` again, then (separately) a plain `kiln train RUN`.
--resume: the killed command resumes a run from step 2 whose records go on past it (as a
kill after step 4's records, before its checkpoint, leaves it): the resume sets them aside.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kill_points import _SCRIPT, KILLED  # noqa: E402

TARGETS = ("os:fsync", "os:replace", "os:rename", "os:unlink", "os:rmdir", "os:mkdir",
           "shutil:rmtree")
TRAIN = ("--set", "train.steps=4", "--set", "train.checkpoint_every=2",
         "--set", "train.keep_checkpoints=1", "--set", "train.eval_every=0")


def kiln(*args: str, kill: tuple[str, int] | None = None) -> subprocess.CompletedProcess:
    """`kiln ARGS` in a subprocess; with `kill` = (module:function, n), os._exit at its nth
    call (the run ends normally when it makes fewer calls)."""
    target, nth = kill or ("os:getpid", 10**9)
    module, attr = target.split(":")
    return subprocess.run([sys.executable, "-c", _SCRIPT, module, attr, str(nth), "", *args],
                          capture_output=True, text=True, timeout=600)


def state(run: Path) -> dict:
    """What the run folder holds: every path outside archive/, each archive folder as its
    label (without its time) and the names it holds, each checkpoint's weights' sha256, the
    train losses by step, and how many archived files repeat another's bytes."""
    files = []
    for p in sorted(run.rglob("*")):
        rel = p.relative_to(run).parts
        if rel[0] in ("tokens", "documents", "tokenizer.json", "archive") or \
                rel[0].startswith("prepare"):
            continue
        files.append("/".join(rel) + ("/" if p.is_dir() else ""))
    weights = {p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16]
               for p in sorted((run / "checkpoints").glob("step_*/model.safetensors"))}
    losses = {}
    if (run / "metrics.jsonl").is_file():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("kind", "train") == "train" and "loss" in r:
                losses[r["step"]] = r["loss"]
    archives = sorted(
        re.sub(r"-\d{8}-\d{6}(-\d+)?$", "", f.name) + ":"
        + ",".join(sorted(str(p.relative_to(f)) for p in f.rglob("*")))
        for f in (run / "archive").glob("*"))
    archived = [hashlib.sha256(p.read_bytes()).hexdigest() for p in run.glob("archive/*/*")
                if p.is_file()]
    return {"files": files, "weights": weights, "losses": losses, "archives": archives,
            "duplicates": len(archived) - len(set(archived))}


# a kill before the first checkpoint has the re-run start at step 0 with the records moved
# to archive/before-restart-*; one after steps logged past the last checkpoint has the
# resume move them to archive/after-step-N-*: by design, one folder with metrics.jsonl alone
_SET_ASIDE = re.compile(r"(before-restart|after-step-\d+):metrics\.jsonl")


def diff(got: dict, want: dict) -> tuple[str, bool]:
    """What differs, and whether it is only records set aside by design."""
    out = []
    extra = sorted(set(got["files"]) - set(want["files"]))
    missing = sorted(set(want["files"]) - set(got["files"]))
    if extra:
        out.append(f"extra {extra}")
    if missing:
        out.append(f"missing {missing}")
    if got["weights"] != want["weights"]:
        out.append(f"weights {got['weights']} != {want['weights']}")
    if got["losses"] != want["losses"]:
        out.append("losses differ")
    if got["duplicates"] > want["duplicates"]:
        out.append(f"{got['duplicates']} archived files repeat another's bytes")
    more = Counter(got["archives"]) - Counter(want["archives"])
    fewer = Counter(want["archives"]) - Counter(got["archives"])
    by_design = not out and not fewer and sum(more.values()) == 1 and \
        _SET_ASIDE.fullmatch(next(iter(more))) is not None
    if more or fewer:
        out.append(f"archive folders: extra {sorted(more.elements())}, "
                   f"missing {sorted(fewer.elements())}")
    return "; ".join(out), by_design


def second_fresh(got: dict, want: dict) -> bool:
    """Whether `got` differs from `want` by one more before-fresh archive folder alone: a
    `--fresh` killed after its archive was done, once its new model had trained, and run
    again, is a second fresh start, which sets the first one's outputs aside."""
    more = Counter(got["archives"]) - Counter(want["archives"])
    fewer = Counter(want["archives"]) - Counter(got["archives"])
    same = {k: v for k, v in got.items() if k != "archives"} == \
        {k: v for k, v in want.items() if k != "archives"}
    folder = next(iter(more), "")  # label:contents; an empty folder is a leftover
    return same and not fewer and sum(more.values()) == 1 and \
        folder.startswith("before-fresh:") and folder != "before-fresh:"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--max-n", type=int, default=200)
    args = ap.parse_args()
    from conftest import tiny_config

    from kiln.cli import cmd_prepare, cmd_tokenize, cmd_tokenizer
    from kiln.run_dir import write_run_metadata

    tmp = Path(tempfile.mkdtemp(prefix="kill-sweep-"))
    prepared = tmp / "prepared"
    cfg = tiny_config(prepared)
    write_run_metadata(cfg)
    for stage in (cmd_prepare, cmd_tokenizer, cmd_tokenize):
        stage(cfg)
    if args.fresh:  # a run trained once, to be started over
        assert kiln("train", str(prepared), *TRAIN).returncode == 0
    if args.resume:  # a run with records past its last checkpoint
        keep_two = ("--set", "train.keep_checkpoints=2")
        assert kiln("train", str(prepared), *TRAIN, *keep_two).returncode == 0
        shutil.rmtree(prepared / "checkpoints" / "step_00000004")
        (prepared / "checkpoints" / "latest").write_text("step_00000002\n")
    fresh = ("--fresh",) if args.fresh else ()

    def copy() -> Path:
        run = tmp / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(prepared, run)
        return run

    run = copy()
    done = kiln("train", str(run), *TRAIN, *fresh)
    assert done.returncode == 0, done.stderr
    want = state(run)
    untouched = state(copy()) if args.fresh else None
    kills = bad = set_asides = second_starts = 0
    for target in args.targets.split(","):
        points = 0
        for n in range(1, args.max_n + 1):
            run = copy()
            proc = kiln("train", str(run), *TRAIN, *fresh, kill=(target, n))
            if proc.returncode != KILLED:
                assert proc.returncode == 0, proc.stderr
                break
            kills += 1
            points += 1
            after_kill = tmp / "after-kill"
            shutil.rmtree(after_kill, ignore_errors=True)
            shutil.copytree(run, after_kill, symlinks=True)
            reruns = [("again", fresh)] + ([("plain", ())] if args.fresh else [])
            for name, flags in reruns:
                if name == "plain":
                    shutil.rmtree(run)
                    shutil.copytree(after_kill, run, symlinks=True)
                again = kiln("train", str(run), *TRAIN, *flags)
                got = state(run)
                if again.returncode != 0:
                    problem = f"re-run failed: {again.stderr.strip().splitlines()[-1]}"
                elif name == "plain" and not diff(got, untouched)[0]:
                    problem = ""  # killed before the fresh start was under way: the old run
                else:
                    problem, by_design = diff(got, want)
                    if by_design:
                        set_asides += 1
                        problem = ""
                    elif name == "again" and args.fresh and second_fresh(got, want):
                        second_starts += 1  # killed once its archive was done: by design
                        problem = ""
                if problem:
                    bad += 1
                    print(f"{target} #{n} ({name} re-run): {problem}", flush=True)
        print(f"{target}: {points} kill points", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"RESULT kills={kills} differing={bad} records_set_aside={set_asides} "
          f"second_fresh_starts={second_starts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
