"""A byte-level BPE for LaTeX-heavy text: every digit its own token, LaTeX commands kept whole.

Following the ArXiv-to-Model tokenizer (digest: papers/arxiv-latex-pipeline.md, §8): numbers are
split into single digits so arithmetic is learned digit by digit, and math macros (`\\frac`,
`\\alpha`, `\\begin`, ...) are single, context-free tokens. Pre-tokenization is one Split regex
(a GPT-2-like pattern whose punctuation class excludes the backslash, plus a `\\command`
alternative), then per-digit splitting, then a ByteLevel byte->symbol map with its own regex off
(its regex would cut `\\frac` into `\\` + `frac`). A command never absorbs the space before it,
so `\\frac` is the same token wherever it appears.

Seeded tokens: digits and the operators `+ - = * / ^ _ ( ) { } [ ] < >` are single bytes, hence
in the base alphabet. Each seeded command is made a single token by putting the merge chain
`\\ f -> \\f r -> \\fr a -> \\fra c` at the *front* of the merge list (highest priority, so no
learned merge can break it up), trimming the last learned merges to keep `vocab_size`. The
repo's post-training markers `[THOUGHT] [STEP] [RESULT]` are not seeded (they belong to a chat
format, not to pretraining text).

The file is a plain tokenizer.json: `kiln.data.tokenizer.load_tokenizer` loads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, pre_tokenizers

from kiln.atomic import atomic_path
from kiln.data.tokenizer import MIN_VOCAB, load_tokenizer, train_bpe, train_tokenizer

# `\command` (or a backslash + one non-letter, e.g. `\%`, `\\`, `\{`), then the GPT-2 classes with
# the backslash removed from the punctuation run, so a command always starts a new piece.
MATH_SPLIT_PATTERN = (
    r"\\(?:[a-zA-Z]+|[^a-zA-Z])?"
    r"|'(?:[sdmt]|ll|ve|re)"
    r"| ?\p{L}+| ?\p{N}+"
    r"| ?[^\s\p{L}\p{N}\\]+"
    r"|\s+(?!\S)|\s+"
)

GREEK = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi"
    " pi rho sigma tau upsilon phi varphi chi psi omega"
    " Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega"
).split()
STRUCTURE = (
    "frac sqrt int sum prod infty text begin end lim partial cdot left right mathbb mathcal"
    " mathrm times leq geq neq in to"
).split()
# Commands that are single tokens in every trained math tokenizer (digest §8, plus the
# commonest structural macros of arXiv math).
MATH_SEED_COMMANDS: tuple[str, ...] = tuple("\\" + name for name in GREEK + STRUCTURE)
DIGITS = "0123456789"
OPERATORS = "+-=*/^_(){}[]<>"


def math_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Split (commands/words/punctuation) -> single digits -> byte symbols."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(MATH_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _chain(seed: str) -> list[tuple[str, str]]:
    """The merges that build `seed` left to right: (s[:1], s[1]), (s[:2], s[2]), ..."""
    return [(seed[:k], seed[k]) for k in range(1, len(seed))]


def _seed_chains(seeds: Iterable[str]) -> list[tuple[str, str]]:
    """Every seed's merge chain, in order, each pair once."""
    chains: list[tuple[str, str]] = []
    for seed in seeds:
        for pair in _chain(seed):
            if pair not in chains:
                chains.append(pair)
    return chains


def min_math_vocab(seeds: Iterable[str] = MATH_SEED_COMMANDS) -> int:
    """The smallest vocabulary that holds the 256 byte symbols, EOS and every seed token."""
    return MIN_VOCAB + len({a + b for a, b in _seed_chains(seeds)})


def _seed_merges(
    vocab: dict[str, int], merges: list[list[str]], seeds: Iterable[str], vocab_size: int
) -> tuple[dict[str, int], list[list[str]]]:
    """Put every seed's merge chain first; drop the last learned merges to stay at vocab_size.

    Learned token ids follow merge order, so the last merge's token has the highest id and no
    later merge uses it: dropping merges from the end keeps the vocabulary consistent.
    """
    chains = _seed_chains(seeds)
    wanted = [a + b for a, b in chains]
    vocab, merges = dict(vocab), [list(m) for m in merges]
    while len(vocab) + sum(t not in vocab for t in set(wanted)) > vocab_size:
        if not merges:
            raise ValueError(
                f"vocab_size {vocab_size} is too small to hold the {len(set(wanted))} tokens "
                "that seed the LaTeX commands; raise tokenizer.vocab_size"
            )
        a, b = merges.pop()
        token = a + b
        if vocab.get(token) != len(vocab) - 1:
            raise RuntimeError(f"learned merge {a!r}+{b!r} is not the newest token; cannot trim")
        del vocab[token]
    for token in wanted:
        if token not in vocab:
            vocab[token] = len(vocab)
    chain_set = {tuple(p) for p in chains}
    learned = [m for m in merges if tuple(m) not in chain_set]
    return vocab, [list(p) for p in chains] + learned


def train_math_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_path: Path | str,
    min_frequency: int = 2,
    length: int | None = None,
    show_progress: bool = True,
    seeds: Iterable[str] = MATH_SEED_COMMANDS,
) -> Tokenizer:
    """Train the math-aware BPE on `texts`, save it atomically to `out_path`, return it loaded.

    Same contract as `train_tokenizer`: EOS is id 0, the round trip is exact for any string,
    the vocabulary has at most `vocab_size` entries.
    """
    seeds = list(seeds)
    bad = [s for s in seeds if not s.isascii() or len(s) < 2]
    if bad:
        raise ValueError(f"seed tokens must be ASCII and at least 2 characters: {bad}")
    tok = train_bpe(texts, vocab_size, math_pre_tokenizer(), min_frequency, length, show_progress)

    spec = json.loads(tok.to_str())
    # ASCII seeds are their own byte-level symbols, so the seed strings are the vocab strings.
    vocab, merges = _seed_merges(spec["model"]["vocab"], spec["model"]["merges"], seeds, vocab_size)
    spec["model"]["vocab"], spec["model"]["merges"] = vocab, merges
    tok = Tokenizer.from_str(json.dumps(spec))
    for seed in seeds:
        if len(tok.encode(seed, add_special_tokens=False).ids) != 1:
            raise RuntimeError(f"seeded command {seed!r} did not come out as a single token")
    with atomic_path(out_path) as tmp:
        tok.save(str(tmp))
    return load_tokenizer(out_path)


TOKENIZER_KINDS: dict[str, Callable[..., Tokenizer]] = {
    "bpe": train_tokenizer,
    "math": train_math_tokenizer,
}


def train_tokenizer_of_kind(kind: str, texts: Iterable[str], vocab_size: int,
                            out_path: Path | str, **kwargs) -> Tokenizer:
    """Dispatch on `tokenizer.kind`: "bpe" (plain byte-level) or "math" (this module)."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer.kind: {kind!r} is not one of {sorted(TOKENIZER_KINDS)}")
    return TOKENIZER_KINDS[kind](texts, vocab_size, out_path, **kwargs)
