"""Hashed word n-gram index of benchmark items, for decontaminating a training corpus.

Normalisation (shared by the index and the filter, so both see the same tokens):
NFKC, casefold, invisible format characters (Cf: soft hyphen, zero-width space and joiners,
word joiner, BOM) removed, so one inside a word cannot hide it, every Unicode punctuation (P*)
or symbol (S*) character replaced by a space, every Han ideograph and kana character made a
token of its own, then split on whitespace.
"x^2+1=y, isn't it?" -> ["x", "2", "1", "y", "isn", "t", "it"]; "今天天气很好" -> six tokens.
Chinese and Japanese are written without spaces: split on spaces alone, a whole benchmark
passage was one "word" (no 13-gram in it, and a document quoting it inside a longer sentence
held no token equal to it), so CJK leaks were almost never caught. One character per token,
as decontamination commonly does for unspaced scripts (as BERT's tokenizer splits Han), makes
n = 13 a 13-character window. Hangul is written with spaces and is left as words; text with no
Han or kana character gives the tokens it gave before.
Each n-gram is the tokens joined by one space, hashed with blake2b (8-byte digest, little-endian)
-> a stable 64-bit value: the same on every machine and Python version, no extra dependency.

Why not datatrove's NGramsDecontIndexer: its `run` always imports `lighteval` (not installed and
it would load tasks from the hub), it needs spaCy for English word splitting, its default hash needs
`xxhash`, and its filter stops at the first hit (no match counts) and keeps one task per hash.
The n-gram choice follows it: answer n-grams plus prompt/answer boundary n-grams, and optionally
prompt-only n-grams (on by default here: a leaked problem statement is contamination too).
Where Kiln departs from datatrove's defaults, on purpose:
- n = 13, not 12: the contamination digest (arXiv:2601.04301) allows 12 or 13; 13 is the GPT-3
  decontamination size and a little less prone to matching stock phrasing; the only leak it
  misses that 12 catches is one of exactly 12 words. `prepare.decontaminate.n` sets it.
- numbers are kept, not all mapped to "0": a problem with other numbers (the paper's "perturbed"
  items, which showed no memorisation gain) is not the benchmark item; datatrove's mapping
  would also match any text that differs from an item only in its numbers.
- diacritics are kept (NFKC and casefold only): "café" and "cafe" are different words here.
A document is dropped (or tagged) on one matching n-gram, as datatrove does: the whole document,
not the span or the line.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.atomic import atomic_path
from kiln.data.decontam.benchmark_file import benchmark_records, benchmark_stem

INDEX_FORMAT = "kiln-ngram-index"
INDEX_VERSION = 1
HASH_NAME = "blake2b-64"
# names the normalisation below: an index saved under another one is refused (and rebuilt)
NORMALISATION = "nfkc-casefold-drop-cf-punct-symbols-to-space-han-kana-chars-whitespace-split"
DEFAULT_PROMPT_FIELDS = ("prompt", "question", "input", "problem")  # problem: MATH
DEFAULT_ANSWER_FIELDS = ("answer", "answers", "output", "target", "solution")  # answers: SQuAD
ANSWER_OBJECT_KEYS = ("text", "value", "aliases")  # the texts of an answer given as an object
# A problem shorter than n words gives no n-gram: it is matched as a whole (its exact
# normalised word sequence, contained in a document), from this length up; shorter ones
# ("what is 2 2") are too generic to call a match contamination.
MIN_EXACT_TOKENS = 5
# from this share of a benchmark's items that no document could ever match, prepare warns
UNCATCHABLE_WARN_SHARE = 0.05


# Han ideographs and kana (scripts written without spaces), as a character class's ranges
HAN_KANA = (
    "\u3040-\u30ff"  # Hiragana, Katakana (NFKC makes half-width katakana these)
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf\u4e00-\u9fff"  # CJK unified ideographs, extension A
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U000323af"  # extensions B-H, compatibility supplement
)
UNSPACED = re.compile(f"[{HAN_KANA}]")  # one token per character


def normalize_tokens(text: str) -> list[str]:
    """Case-folded words of `text`, format characters dropped, punctuation and symbols
    treated as spaces, each Han or kana character a word of its own."""
    text = UNSPACED.sub(r" \g<0> ", unicodedata.normalize("NFKC", text).casefold())
    return "".join(map(_normal_char, text)).split()


def _normal_char(c: str) -> str:
    category = unicodedata.category(c)
    return "" if category == "Cf" else " " if category[0] in "PS" else c


def hash_ngram(tokens: Sequence[str]) -> int:
    digest = hashlib.blake2b(" ".join(tokens).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def ngram_hashes(tokens: Sequence[str], n: int, min_end: int = 0) -> np.ndarray:
    """uint64 hashes of every n-gram window tokens[i:i+n] with i + n >= min_end."""
    start = max(0, min_end - n)
    values = [hash_ngram(tokens[i : i + n]) for i in range(start, len(tokens) - n + 1)]
    return np.array(values, dtype=np.uint64)


@dataclass
class BenchmarkItem:
    """One benchmark record: a prompt (may be None) and its gold answers (may be empty)."""

    prompt: str | None
    answers: list[str] = field(default_factory=list)
    # `file:line` (JSON lines) or `file[i]` (a JSON list), for error messages
    where: str = field(default="", compare=False)


def _field_text(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [str(value)]
    if isinstance(value, list):
        return [t for v in value for t in _field_text(v)]
    if isinstance(value, dict):  # TriviaQA {"value", "aliases", "type"...}, SQuAD {"text": [...]}
        return [t for k in ANSWER_OBJECT_KEYS if k in value for t in _field_text(value[k])]
    return []


def load_benchmark_items(
    path: Path | str,
    prompt_fields: Sequence[str] = DEFAULT_PROMPT_FIELDS,
    answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
) -> list[BenchmarkItem]:
    """Read a benchmark (JSON lines, `.gz` too, or a JSON list of objects:
    `benchmark_file`): the first non-blank prompt field, and every present answer field
    (MATH has a worked `solution` and a short `answer`: a leak of either counts).

    A bad record raises (naming file and line, and the fields a record without text has):
    silently skipping an item would leave it undetected.
    """
    items = []
    for where, record in benchmark_records(path):
        prompt = next((record[k] for k in prompt_fields  # a blank one ("input": "") is absent
                       if isinstance(record.get(k), str) and record[k].strip()), None)
        answers = list(dict.fromkeys(
            t for k in answer_fields if k in record for t in _field_text(record[k]) if t.strip()))
        if prompt is None and not answers:
            fields = ", ".join(list(record)[:20]) or "none"
            raise ValueError(
                f"{where}: none of the prompt fields {list(prompt_fields)} "
                f"or answer fields {list(answer_fields)} holds text (its fields: {fields}); "
                "name its fields in prepare.decontaminate.prompt_fields / answer_fields")
        items.append(BenchmarkItem(prompt=prompt, answers=answers, where=where))
    return items


def item_ngram_hashes(item: BenchmarkItem, n: int, include_prompt: bool = True) -> np.ndarray:
    """Hashes of the n-grams that betray `item`: answer-only and prompt/answer-boundary n-grams,
    plus prompt-only n-grams when `include_prompt` (or when the item has no answer)."""
    prompt_tokens = normalize_tokens(item.prompt) if item.prompt else []
    if not item.answers:
        return ngram_hashes(prompt_tokens, n)
    parts = []
    for answer in item.answers:
        tokens = prompt_tokens + normalize_tokens(answer)
        # a window holds an answer token iff it ends past the prompt: i + n >= len(prompt) + 1
        parts.append(
            ngram_hashes(tokens, n, min_end=0 if include_prompt else len(prompt_tokens) + 1)
        )
    return np.concatenate(parts) if parts else np.array([], dtype=np.uint64)


def exact_problem(item: BenchmarkItem, n: int) -> list[str] | None:
    """The words of a problem too short for an n-gram, matched whole instead."""
    tokens = normalize_tokens(item.prompt) if item.prompt else []
    return tokens if MIN_EXACT_TOKENS <= _words_worth(tokens) and len(tokens) < n else None


def _words_worth(tokens: list[str]) -> float:
    """How many words `tokens` say, for the exact rule's floor: a Han or kana character is
    about half a word (Chinese runs ~1.5 characters a word), so five of them ("今天天气好",
    a common phrase) are no problem specific enough to call its every quotation a leak."""
    return sum(0.5 if UNSPACED.fullmatch(t) else 1.0 for t in tokens)


def benchmark_names(paths: list[Path]) -> dict[str, Path]:
    """{name: path}: a file's name without `.jsonl` (`.jsonl.gz`, `.json`: `benchmark_stem`);
    files of the same name (each suite's `test.jsonl`) are told apart by as many of their
    folders as it takes (`gsm8k/test`, `math/test`)."""
    if len(set(map(_resolved, paths))) < len(paths):
        twice = next(p for p in paths if [_resolved(q) for q in paths].count(_resolved(p)) > 1)
        raise ValueError(f"the benchmark file {twice} is listed twice")

    def name(p: Path, depth: int) -> str:
        parts = p.absolute().parts
        return "/".join([*parts[-depth:-1], benchmark_stem(p)])

    depths = [1] * len(paths)
    while True:
        names = [name(p, d) for p, d in zip(paths, depths)]
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes:
            return dict(zip(names, paths))
        depths = [d + 1 if n in clashes else d for n, d in zip(names, depths)]


def _resolved(p: Path) -> str:
    return str(p.resolve())


def _benchmark_paths(
    benchmarks: Mapping[str, Path | str] | Iterable[Path | str],
) -> dict[str, Path]:
    if isinstance(benchmarks, Mapping):
        named = {str(k): Path(v) for k, v in benchmarks.items()}
    else:
        named = benchmark_names(list(map(Path, benchmarks)))
    if not named:
        raise ValueError("no benchmark files given")
    missing = [str(p) for p in named.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"benchmark files not found: {missing}")
    return named


def _redacted_forms(items: list[BenchmarkItem], pii_types: Sequence[str]) -> list[BenchmarkItem]:
    """The items PII redaction changes, as it leaves them."""
    from kiln.data.pii import redact  # only when a pii stage runs before the filter

    def clean(text: str) -> str:
        return redact(text, pii_types)[0]

    out = []
    for item in items:
        prompt = clean(item.prompt) if item.prompt else item.prompt
        answers = [clean(a) for a in item.answers]
        if prompt != item.prompt or answers != item.answers:
            out.append(BenchmarkItem(prompt, answers, item.where))
    return out


class NGramIndex:
    """Per-benchmark sorted unique uint64 n-gram hashes, with a combined lookup table."""

    def __init__(
        self,
        n: int,
        hashes: dict[str, np.ndarray],
        info: dict[str, dict] | None = None,
        include_prompt: bool | None = None,
        exact_edges: Iterable[Sequence] = (),
    ):
        """`exact_edges`: (length, first word, last word) of each short problem indexed whole
        (its hash is among `hashes`): a document's windows of that length with those edge
        words are looked up too (hashing every window of every such length would cost up to
        nine times the n-grams)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        self.include_prompt = include_prompt
        self.exact_edges = sorted({(int(length), first, last) for length, first, last in exact_edges})
        self._by_first: dict[str, list[tuple[int, str]]] = {}
        for length, first, last in self.exact_edges:
            self._by_first.setdefault(first, []).append((length, last))
        self.hashes = {k: np.unique(np.asarray(v, dtype=np.uint64)) for k, v in hashes.items()}
        self.info = info or {k: {} for k in hashes}
        self.names = sorted(self.hashes)
        all_h = [self.hashes[k] for k in self.names]
        owners = [np.full(len(h), i, dtype=np.int32) for i, h in enumerate(all_h)]
        flat = np.concatenate(all_h) if all_h else np.array([], dtype=np.uint64)
        own = np.concatenate(owners) if owners else np.array([], dtype=np.int32)
        order = np.argsort(flat, kind="stable")
        self._flat, self._owners = flat[order], own[order]

    @classmethod
    def build(
        cls,
        benchmarks: Mapping[str, Path | str] | Iterable[Path | str],
        n: int = 13,
        prompt_fields: Sequence[str] = DEFAULT_PROMPT_FIELDS,
        answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
        include_prompt: bool = True,
        pii_types: Sequence[str] | None = None,
    ) -> NGramIndex:
        """Index benchmark JSONL files (a list of paths named by file stem, or {name: path}).

        `pii_types`: the types a `pii` stage before the filter redacts. Each item is then
        indexed as written and as that stage leaves it (`Dr. Alice Jones` -> `Dr. <NAME>`):
        a leaked item's training copy is redacted before the filter sees it, and the n-grams
        spanning a redacted name or address would match neither form otherwise."""
        def exact_problems(its: list[BenchmarkItem]) -> list[list[str] | None]:
            return [exact_problem(it, n) if include_prompt or not it.answers else None
                    for it in its]

        hashes, info, edges = {}, {}, set()
        for name, path in _benchmark_paths(benchmarks).items():
            items = load_benchmark_items(path, prompt_fields, answer_fields)
            per_item = [item_ngram_hashes(it, n, include_prompt) for it in items]
            exact = exact_problems(items)
            redacted = _redacted_forms(items, pii_types) if pii_types is not None else []
            extra = [item_ngram_hashes(it, n, include_prompt) for it in redacted]
            exact_all = exact + exact_problems(redacted)
            whole = [hash_ngram(e) for e in exact_all if e is not None]
            edges.update((len(e), e[0], e[-1]) for e in exact_all if e is not None)
            hashes[name] = np.concatenate([*per_item, *extra, np.array(whole, dtype=np.uint64)])
            # an item with no n-gram and no problem indexed whole cannot be caught
            info[name] = {
                "items": len(items),
                "too_short_items": sum(1 for h, e in zip(per_item, exact)
                                       if len(h) == 0 and e is None),
                "exact_problems": sum(e is not None for e in exact),  # as written
                "source": str(path),
            }
            if len(hashes[name]) == 0:  # it would pass every document: say so, don't run
                raise ValueError(
                    f"benchmark {path} gives no {n}-gram to match ({len(items)} items, none "
                    f"with {n} tokens or a problem of {MIN_EXACT_TOKENS}+ words): "
                    "decontamination against it would catch nothing; check "
                    "the file and its prompt/answer fields, or lower prepare.decontaminate.n")
        index = cls(n, hashes, info, include_prompt, sorted(edges))
        for name in index.names:
            index.info[name]["ngrams"] = int(len(index.hashes[name]))
        return index

    def uncatchable_warnings(self) -> list[str]:
        """One line per benchmark with a notable share of items too short to ever match: a
        run decontaminated against it is not clean of them."""
        lines = []
        for name in self.names:
            items, short = self.info[name].get("items", 0), self.info[name].get("too_short_items", 0)
            if items and short / items >= UNCATCHABLE_WARN_SHARE:
                lines.append(
                    f"benchmark {name!r}: {short} of {items} items ({100 * short / items:.0f}%) "
                    f"have fewer than {self.n} words (and no problem of {MIN_EXACT_TOKENS}+ "
                    "words to match whole): no document can be caught for them")
        return lines

    def match_counts(self, tokens: Sequence[str], skip: int = 0) -> dict[str, int]:
        """{benchmark: number of n-gram positions of `tokens` found in its index, and of
        windows equal to one of its short problems} (hits only); with `skip`, only windows
        ending past the first `skip` tokens (the end of the part before, in a cut text)."""
        if len(self._flat) == 0:
            return {}
        whole = [hash_ngram(tokens[i : i + length])
                 for i, first in enumerate(tokens) if first in self._by_first
                 for length, last in self._by_first[first]
                 if skip < i + length <= len(tokens) and tokens[i + length - 1] == last]
        doc = np.concatenate([ngram_hashes(tokens, self.n, min_end=skip + 1),
                              np.array(whole, dtype=np.uint64)])
        if len(doc) == 0:
            return {}
        pos = np.searchsorted(self._flat, doc)
        hit = pos < len(self._flat)
        hit[hit] = self._flat[pos[hit]] == doc[hit]
        counts: dict[str, int] = {}
        for h in doc[hit]:
            lo = np.searchsorted(self._flat, h, side="left")
            hi = np.searchsorted(self._flat, h, side="right")
            for owner in set(self._owners[lo:hi].tolist()):
                name = self.names[owner]
                counts[name] = counts.get(name, 0) + 1
        return counts

    def save(self, path: Path | str) -> None:
        """Write one .npz (hashes + JSON header) atomically."""
        meta = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "n": self.n,
            "hash": HASH_NAME,
            "normalisation": NORMALISATION,
            "include_prompt": self.include_prompt,
            "exact_edges": self.exact_edges,
            "benchmarks": [{"name": k, **self.info.get(k, {})} for k in self.names],
        }
        arrays = {f"h{i}": self.hashes[k] for i, k in enumerate(self.names)}
        buf = io.BytesIO()
        np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
        with atomic_path(path) as tmp:
            tmp.write_bytes(buf.getvalue())

    @classmethod
    def load(cls, path: Path | str) -> NGramIndex:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no n-gram index at {path}; build it first")
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            for key, want in (
                ("format", INDEX_FORMAT),
                ("hash", HASH_NAME),
                ("normalisation", NORMALISATION),
            ):
                if meta.get(key) != want:
                    raise ValueError(
                        f"{path}: index {key} is {meta.get(key)!r}, this code expects {want!r}"
                    )
            names = [b["name"] for b in meta["benchmarks"]]
            hashes = {name: z[f"h{i}"] for i, name in enumerate(names)}
        info = {b["name"]: {k: v for k, v in b.items() if k != "name"} for b in meta["benchmarks"]}
        return cls(int(meta["n"]), hashes, info, meta.get("include_prompt"),
                   meta.get("exact_edges", ()))
