"""Bytes per token on held-out LaTeX: math-aware BPE vs plain byte-level BPE, same vocab size.

Both tokenizers are trained on the same LaTeX files and measured on other, held-out files
(split by a hash of the file name). LaTeX sources: tests/fixtures/latex/ if it has any, the
Debian TeX Live documentation (/usr/share/doc/texlive-doc: `apt-get download
texlive-latex-base-doc && dpkg-deb -x <deb> DIR`, then pass DIR/usr/share/doc/texlive-doc),
and any --tex-dir. Digit splitting costs compression by design (the point is stable
arithmetic), so expect ratio < 1; the figure says how much.

    python benchmarks/tokenizer_bytes_per_token.py --tex-dir /tmp/texdoc/x/usr/share/doc
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import tempfile
from pathlib import Path

from kiln.data.math_tokenizer import MATH_SEED_COMMANDS, train_math_tokenizer
from kiln.data.tokenizer import train_tokenizer

DEFAULT_DIRS = [Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "latex",
                Path("/usr/share/doc/texlive-doc")]


def read_tex(dirs: list[Path]) -> dict[str, str]:
    """name -> text of every .tex / .tex.gz file under `dirs` (UTF-8 with replacement)."""
    found: dict[str, str] = {}
    for root in dirs:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.name.endswith(".tex"):
                raw = path.read_bytes()
            elif path.name.endswith(".tex.gz"):
                raw = gzip.decompress(path.read_bytes())
            else:
                continue
            found[str(path)] = raw.decode("utf-8", errors="replace")
    return found


def held_out(name: str, fraction: float) -> bool:
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def bytes_per_token(tok, texts: list[str]) -> float:
    encs = tok.encode_batch(texts, add_special_tokens=False)
    return sum(len(t.encode()) for t in texts) / sum(len(e.ids) for e in encs)


def single_tokens(tok) -> int:
    """How many of the math tokenizer's seeded commands `tok` encodes as one token, each
    tokenizer counted (the math one's count was printed as all of them, never measured)."""
    return sum(len(tok.encode(c, add_special_tokens=False).ids) == 1 for c in MATH_SEED_COMMANDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tex-dir", action="append", type=Path, default=[])
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--held-out", type=float, default=0.25)
    args = parser.parse_args()
    files = read_tex(DEFAULT_DIRS + args.tex_dir)
    train = [t for n, t in files.items() if not held_out(n, args.held_out)]
    test = [t for n, t in files.items() if held_out(n, args.held_out)]
    if not train or not test:
        sys.exit(f"need LaTeX files for both splits, found {len(files)}; pass --tex-dir")
    print(f"LaTeX files: {len(train)} train ({sum(map(len, train)):,} chars), "
          f"{len(test)} held out ({sum(map(len, test)):,} chars); vocab {args.vocab}")
    with tempfile.TemporaryDirectory() as tmp:
        bpe = train_tokenizer(train, args.vocab, Path(tmp) / "bpe.json", show_progress=False)
        math = train_math_tokenizer(train, args.vocab, Path(tmp) / "math.json",
                                    show_progress=False)
    bpe_bpt, math_bpt = bytes_per_token(bpe, test), bytes_per_token(math, test)
    n = len(MATH_SEED_COMMANDS)
    print(f"seeded commands that are single tokens: math {single_tokens(math)}/{n}, "
          f"plain bpe {single_tokens(bpe)}/{n}")
    print(f"'2024' -> math {math.encode('2024').tokens}, bpe {bpe.encode('2024').tokens}")
    print(f"RESULT math_bytes_per_token={math_bpt:.4f} bpe_bytes_per_token={bpe_bpt:.4f} "
          f"ratio={math_bpt / bpe_bpt:.4f}")


if __name__ == "__main__":
    main()
