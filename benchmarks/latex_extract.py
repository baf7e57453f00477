"""LaTeX -> text on a folder of real .tex files: conversion rate, leaked markup, math kept, MB/s.

Corpus (offline, from the Debian archive; ~900 real documents: journal templates and sample papers,
theses, package manuals):

    mkdir -p /tmp/texdebs && cd /tmp/texdebs
    apt-get download texlive-publishers-doc texlive-science-doc texlive-latex-recommended-doc
    for d in *.deb; do dpkg-deb -x "$d" /tmp/texx; done
    python benchmarks/latex_extract.py /tmp/texx/usr/share/doc/texlive-doc

Every .tex / .tex.gz that has both \\documentclass and \\begin{document} is one document; the
other .tex/.sty files of its folder form its "archive" (so \\input resolves). Metrics:
- converted: `latex_to_text` returned without an exception; nonempty: its body has text (bodies
  that are only TikZ, tabulars, \\blindtext or missing includes are legitimately empty);
- leaked_markup: words outside math and code (``` blocks and `inline` code, which keep LaTeX as
  written on purpose) that start with '\\' or contain a brace, over words;
- math_kept: math spans in the output / math spans in the comment-free source body;
- mb_per_s: main-file MB / seconds of `latex_to_text`, one process.
Peer, same run: pylatexenc's LatexNodes2Text on the same bodies (time-capped), for speed and leak.
"""

from __future__ import annotations

import argparse
import gzip
import time
from collections import Counter, defaultdict
from pathlib import Path

from kiln.data.arxiv import count_math_spans, latex_to_text, leaked_markup
from kiln.data.arxiv.latex_source import split_document, strip_comments

DEFAULT_CORPUS = "/tmp/texx/usr/share/doc/texlive-doc"


def load_folders(root: Path) -> dict[Path, dict[str, str]]:
    """Folder -> {path relative to it: text} for the .tex/.sty below it (gunzipped when .gz)."""
    flat: dict[Path, dict[str, str]] = defaultdict(dict)
    for path in sorted(root.rglob("*")):
        name = path.name.removesuffix(".gz")
        if not path.is_file() or not name.endswith((".tex", ".sty")):
            continue
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError):
                continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        flat[path.parent][name] = text
    folders: dict[Path, dict[str, str]] = {}
    for folder in flat:  # a document's "archive" is its folder and every folder below it
        folders[folder] = {
            (sub / name).relative_to(folder).as_posix(): text
            for sub, files in flat.items() if sub == folder or folder in sub.parents
            for name, text in files.items()
        }
    return folders


def documents(folders: dict[Path, dict[str, str]]) -> list[tuple[str, dict[str, str], str]]:
    docs = []
    for folder, files in folders.items():
        for name, text in sorted(files.items()):
            if "/" in name:
                continue
            clean = strip_comments(text) if name.endswith(".tex") else ""
            if "\\documentclass" in clean and "\\begin{document}" in clean:
                docs.append((f"{folder}/{name}", files, name))
    return docs


def peer(docs, seconds: float) -> tuple[float, float, int]:
    """pylatexenc LatexNodes2Text on document bodies until `seconds` run out: MB/s, leak, n."""
    from pylatexenc.latex2text import LatexNodes2Text

    converter = LatexNodes2Text(math_mode="verbatim")
    n_bytes, elapsed, leaked, words, n = 0, 0.0, 0, 0, 0
    for _, files, main in docs:
        body = split_document(files[main])[1]
        start = time.perf_counter()
        try:
            out = converter.latex_to_text(body)
        except Exception:  # pylatexenc raises many types; a failure just counts as no output
            out = ""
        elapsed += time.perf_counter() - start
        n_bytes += len(body.encode("utf-8"))
        a, b = leaked_markup(out)
        leaked, words, n = leaked + a, words + b, n + 1
        if elapsed > seconds:
            break
    return n_bytes / 1e6 / max(elapsed, 1e-9), leaked / max(words, 1), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", default=DEFAULT_CORPUS)
    parser.add_argument("--peer-seconds", type=float, default=20.0)
    parser.add_argument("--show-leaks", type=int, default=0, help="print the N leakiest documents")
    args = parser.parse_args()
    root = Path(args.corpus)
    if not root.is_dir():
        raise SystemExit(f"corpus folder not found: {root} (see this script's docstring to fetch it)")
    docs = documents(load_folders(root))
    if not docs:
        raise SystemExit(f"no LaTeX documents under {root}")
    converted, empty, n_bytes, elapsed = 0, 0, 0, 0.0
    leaked = words = math_in = math_out = 0
    errors: Counter = Counter()
    per_doc = []
    for label, files, main in docs:
        start = time.perf_counter()
        try:
            result = latex_to_text(files, main)
        except Exception as exc:  # the benchmark counts every failure, whatever its type
            errors[type(exc).__name__] += 1
            continue
        finally:
            elapsed += time.perf_counter() - start
            n_bytes += len(files[main].encode("utf-8"))
        converted += 1
        if not result.body.strip():
            empty += 1
            continue
        a, b = leaked_markup(result.body)
        leaked, words = leaked + a, words + b
        per_doc.append((a / max(b, 1), a, label))
        math_in += count_math_spans(split_document(strip_comments(files[main]))[1])
        math_out += count_math_spans(result.body)
    ours = n_bytes / 1e6 / elapsed
    peer_mbs, peer_leak, peer_n = peer(docs, args.peer_seconds)
    if not peer_mbs:
        raise SystemExit("the peer converted nothing in its time: raise --peer-seconds")
    for rate, a, label in sorted(per_doc, reverse=True)[: args.show_leaks]:
        print(f"  leak {rate:.3f} ({a} words) {label}")
    conv = converted / len(docs)
    leak = leaked / max(words, 1)
    kept = min(1.0, math_out / max(math_in, 1))
    print(f"documents={len(docs)} converted={converted} empty_body={empty} errors={dict(errors)}")
    print(f"input={n_bytes / 1e6:.2f} MB words={words} leaked_words={leaked}")
    print(f"math spans: source={math_in} output={math_out}")
    print(f"ours: {ours:.2f} MB/s leak={leak:.4f}; pylatexenc LatexNodes2Text ({peer_n} docs): "
          f"{peer_mbs:.2f} MB/s leak={peer_leak:.4f}; speed ratio={ours / peer_mbs:.1f}x")
    print(f"RESULT converted={conv:.4f} nonempty={(converted - empty) / len(docs):.4f} leaked_markup={leak:.5f} math_kept={kept:.4f} "
          f"mb_per_s={ours:.3f} peer_mb_per_s={peer_mbs:.3f} speed_ratio={ours / peer_mbs:.2f}")


if __name__ == "__main__":
    main()
