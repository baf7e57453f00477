"""Time and peak host memory of Kiln's MinHash cluster step (`FirstCopyMinhashCluster`: the
member first in read order stays) against datatrove's own (`MinhashDedupCluster`: the
union-find root stays), on the same bucket pairs, measured in the same run.

The input is made once, with numpy: `--dups` documents with a near-duplicate, spread at
random over `--tasks` tasks of `--docs` documents each, in clusters of 2 or more (sizes
geometric, mean ~2.7); each of the 14 buckets pairs, as datatrove's bucket step does, each
cluster's members matching there (all of them in bucket 0, each other member with chance
0.8 elsewhere) in (task, index) order, clusters in random order. Read-order keys: task t
reads files t, t + tasks, ... of 50 documents each, a document's key its file's place.
Each step runs in a fresh process, the two alternating (A B, then B A); the figures are
seconds and the peak resident memory (VmHWM) less the peak just before the step (the
imports); medians over the rounds. Kiln's removals are checked against the kept set worked
out here (each cluster's member of smallest (key, index, task)).

    python benchmarks/minhash_cluster.py                 # 800k duplicates, 3 rounds
    python benchmarks/minhash_cluster.py --dups 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, peak_rss_mb, result_line  # noqa: E402

BUCKETS = 14
DOCS_PER_FILE = 50


def make_input(work: Path, dups: int, tasks: int, docs: int, seed: int = 0) -> np.ndarray:
    """Writes `buckets/*.dups` and `order/*.order` under `work`; returns the (task, index)
    nodes that must be removed, sorted, as global ids task * docs + index."""
    if dups > tasks * docs:
        raise ValueError(f"{dups} duplicates among {tasks * docs} documents")
    rng = np.random.default_rng(seed)
    node = np.sort(rng.choice(tasks * docs, size=dups, replace=False))
    sizes = 1 + rng.geometric(0.6, size=dups // 2 + 1)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), dups) + 1]
    sizes[-1] -= sizes.sum() - dups
    if sizes[-1] < 2:  # a last cluster of one joins the one before
        sizes[-2] += sizes[-1]
        sizes = sizes[:-1]
    cluster = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    by = np.lexsort((node, cluster))  # each cluster's members in (task, index) order
    node, cluster = node[by], cluster[by]
    task, index = node // docs, node % docs
    # read order: task t reads files t, t + tasks, ...; its document i is in its file i // 50
    key = ((index // DOCS_PER_FILE) * tasks + task).astype("<u8")
    (work / "order").mkdir()
    for t in range(tasks):
        i = np.arange(docs)
        ((i // DOCS_PER_FILE) * tasks + t).astype("<u8").tofile(work / f"order/{t:05d}.order")
    (work / "buckets").mkdir()
    rank = rng.permutation(len(sizes))
    for b in range(BUCKETS):
        here = np.ones(dups, bool) if b == 0 else rng.random(dups) < 0.8
        n, c = node[here], cluster[here]
        pair = np.flatnonzero(c[1:] == c[:-1])
        pair = pair[np.argsort(rank[c[pair]], kind="stable")]
        rows = np.stack([n[pair] // docs, n[pair] % docs, n[pair + 1] // docs,
                         n[pair + 1] % docs], axis=1).astype("<u4")
        rows.tofile(work / f"buckets/{b:05d}_00.dups")
    first = np.ones(dups, bool)
    best = np.lexsort((task, index, key, cluster))
    keep = best[np.r_[True, cluster[best][1:] != cluster[best][:-1]]]
    first[keep] = False
    return np.sort(node[first])


def removed(folder: Path, docs: int) -> np.ndarray:
    """The global ids the step's `NNNNNN.remove` files name, sorted."""
    ids = [np.fromfile(f, "<u4").astype(np.int64) + int(f.stem) * docs
           for f in folder.glob("*.remove")]
    return np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)


def child(way: str, work: Path, out: Path) -> None:
    """One step in this fresh process: prints its seconds and MB over the imports' peak."""
    from datatrove.pipeline.dedup import MinhashDedupCluster

    from kiln.data.dedup import minhash_config
    from kiln.data.minhash_first import FirstCopyMinhashCluster

    if way == "kiln":
        step = FirstCopyMinhashCluster(str(work / "buckets"), str(work / "order"), str(out),
                                       BUCKETS)
    else:
        step = MinhashDedupCluster(str(work / "buckets"), str(out),
                                   config=minhash_config(num_buckets=BUCKETS))
    before = peak_rss_mb()
    start = time.perf_counter()
    step.run()
    seconds = time.perf_counter() - start
    print(json.dumps({"s": seconds, "mb": peak_rss_mb() - before}))


def run_child(way: str, work: Path, out: Path) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", way, str(work), str(out)],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dups", type=int, default=800_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--docs", type=int, default=0, help="per task; 0 = dups (1/tasks dup)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("WAY", "WORK", "OUT"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    docs = args.docs or args.dups
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        expected = make_input(work, args.dups, args.tasks, docs)
        pairs = sum(f.stat().st_size for f in (work / "buckets").iterdir()) // 16
        print(f"{args.dups} duplicates, {args.dups - len(expected)} clusters, {pairs} pairs, "
              f"{args.tasks} tasks of {docs} documents")
        figures: dict[str, list[dict]] = {"kiln": [], "datatrove": []}
        for r in range(args.rounds):
            for way in ("kiln", "datatrove") if r % 2 == 0 else ("datatrove", "kiln"):
                out = work / f"out_{way}"
                figures[way].append(fig := run_child(way, work, out))
                got = removed(out, docs)
                shutil.rmtree(out)
                if way == "kiln" and not np.array_equal(got, expected):
                    raise SystemExit("kiln's step removed other documents than the first copies")
                if len(got) != len(expected):
                    raise SystemExit(f"{way} removed {len(got)} documents, not {len(expected)}")
                print(f"round {r}  {way:9s} {fig['s']:7.2f} s  {fig['mb']:7.1f} MB")
    k_s, d_s = (median([f["s"] for f in figures[w]]) for w in ("kiln", "datatrove"))
    k_mb, d_mb = (median([f["mb"] for f in figures[w]]) for w in ("kiln", "datatrove"))
    ratios = [k["s"] / d["s"] for k, d in zip(figures["kiln"], figures["datatrove"])]
    print(result_line(kiln_over_datatrove_s=k_s / d_s, round_ratio_max=max(ratios),
                      kiln_s=k_s, datatrove_s=d_s, kiln_mb=k_mb, datatrove_mb=d_mb,
                      kiln_over_datatrove_mb=k_mb / d_mb, dups=args.dups, pairs=pairs))


if __name__ == "__main__":
    main()
