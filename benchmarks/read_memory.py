"""Peak memory of the read stage on one large input file, against the file's size.

Each file (generated under a temporary folder, deleted after) is read by `SourceReader` in a
fresh process, its documents consumed one at a time as the pipeline does; the figure is that
process's peak resident memory (VmHWM) less its peak before the read (the imports).

    python benchmarks/read_memory.py                  # 200 MB .txt, .txt.gz, .txt.zst, .json...
    python benchmarks/read_memory.py --mb 200,1000    # and 1 GB ones (needs ~3 GB of disk)
    python benchmarks/read_memory.py --kinds txt      # only the plain text

Kinds: txt, txt.gz, txt.zst; json (a list of records), json.gz (the same, compressed),
json_wrapped (`{"version": 1, "data": [...]}` on one line).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak (benchmarks/common.py)
CHILD = """
import json, sys, time
from pathlib import Path
from kiln.data.documents import SourceReader
def hwm_kb():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    return int(line.split()[1])
before = hwm_kb()
start = time.perf_counter()
reader = SourceReader([sys.argv[1]], progress=False)
docs = chars = 0
for doc in reader.run():
    docs += 1
    chars += len(doc.text)
peak = hwm_kb()
print(json.dumps({"before_kb": before, "peak_kb": peak, "s": time.perf_counter() - start, "docs": docs, "chars": chars,
                  "counts": dict(reader.counts)}))
"""
WORDS = ("the of and to in is was kiln fired for three days potters watched colour flame "
         "through spy hole adding wood when it dimmed réseau données 数据").split()
# one record's text in write_json
PARAGRAPH = " ".join(WORDS * 12) + "\n\n"


def prose_block(n_bytes: int = 4 << 20, seed: int = 0) -> bytes:
    """Seeded random words in sentences and paragraphs, repeated further apart than the
    compressors' windows, so they compress as text does (~3x), not as one repeated line."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_bytes:
        s = " ".join(rng.choices(WORDS, k=rng.randint(5, 30))) + (
            ".\n\n" if rng.random() < 0.05 else ". ")
        out.append(s)
        size += len(s.encode())
    return "".join(out).encode()


def write_text(path: Path, n_bytes: int, opener=open) -> None:
    """`n_bytes` of prose, less the bytes of a character the size would cut in two: a file
    ending inside a character is not UTF-8, and the reader skips it whole (a 5 MB file did,
    and the benchmark printed its 0 MB as a figure)."""
    block = prose_block()
    with opener(path, "wb") as f:
        written = 0
        while written < n_bytes:
            piece = block[:n_bytes - written]
            if len(piece) < len(block):  # the last piece: drop a character cut at its end
                f.write(piece.decode("utf-8", "ignore").encode())
                break
            f.write(piece)
            written += len(piece)


def _zstd_writer(path: Path, mode: str):
    import zstandard

    return zstandard.ZstdCompressor(level=1).stream_writer(open(path, mode), closefd=True)


def write_json(path: Path, n_bytes: int, opener=open, wrapped: bool = False) -> None:
    """A list of records (`[{"text": ...}, ...]`), one paragraph each; `wrapped`: in an
    object beside another key, all on one line (`{"version": 1, "data": [...]}`)."""
    record = json.dumps({"text": PARAGRAPH * 4, "id": 0}).encode()
    start, end = (b'{"version": 1, "data": [', b"]}") if wrapped else (b"[", b"]")
    with opener(path, "wb") as f:
        f.write(start)
        written, i = len(start), 0
        while written < n_bytes:
            piece = (b"," if i else b"") + record
            f.write(piece)
            written += len(piece)
            i += 1
        f.write(end)


def measure(path: Path) -> dict:
    """The child's figures for reading `path`, or {"error": why}: a read that skipped the
    file, or found nothing in it, measured no reading at all."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, text=True,
                         capture_output=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    got = json.loads(out.stdout.strip().splitlines()[-1])
    skipped = {k: v for k, v in got["counts"].items() if k.startswith("skipped")}
    if skipped or not got["docs"]:
        return {"error": f"{path.name} was not read: {got['docs']} documents, {skipped}"}
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", default="200", help="file sizes in MB, comma-separated")
    parser.add_argument("--kinds", default="txt,txt.gz,txt.zst,json,json.gz,json_wrapped")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="kiln-read-memory-") as tmp:
        for mb in (int(m) for m in args.mb.split(",")):
            for kind in args.kinds.split(","):
                path = Path(tmp) / f"big_{mb}mb.{kind}"
                if kind == "txt":
                    write_text(path, mb * 1_000_000)
                elif kind == "txt.gz":
                    write_text(path, mb * 1_000_000,
                               lambda p, m: gzip.open(p, m, compresslevel=1))
                elif kind == "txt.zst":
                    write_text(path, mb * 1_000_000, _zstd_writer)
                elif kind == "json":
                    write_json(path, mb * 1_000_000)
                elif kind == "json.gz":
                    write_json(path, mb * 1_000_000, lambda p, m: gzip.open(p, m, compresslevel=1))
                elif kind == "json_wrapped":
                    path = Path(tmp) / f"big_{mb}mb_wrapped.json"
                    write_json(path, mb * 1_000_000, wrapped=True)
                else:
                    raise SystemExit("--kinds: txt, txt.gz, txt.zst, json, json.gz or "
                                     f"json_wrapped, not {kind!r}")
                got = measure(path)
                path.unlink()
                name = f"{kind.replace('.', '_')}_{mb}mb"
                if "error" in got:
                    print(f"{name:>16}: failed: {got['error']}")
                    results[f"{name}_failed"] = 1
                    continue
                peak_mb = (got["peak_kb"] - got["before_kb"]) / 1024
                print(f"{name:>16}: peak {peak_mb:8.1f} MB over the imports' "
                      f"{got['before_kb'] / 1024:.0f} MB; {got['docs']} documents, "
                      f"{got['chars']:,} characters in {got['s']:.1f} s; {got['counts']}")
                results[f"{name}_peak_mb"] = round(peak_mb, 1)
                results[f"{name}_peak_over_size"] = round(peak_mb / mb, 3)
                results[f"{name}_s"] = round(got["s"], 1)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
