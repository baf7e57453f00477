"""Brain Rot M1: junk = short AND popular posts, judged from engagement metadata alone.

Xing et al. 2025 ("LLMs Can Get Brain Rot", arXiv:2510.13928) build junk / control sets
from tweets: junk is < 30 tokens with popularity > 500, control is > 100 tokens with
popularity <= 500; everything else is neither. Token length is the Llama-3-8B-Instruct
tokenizer count with special tokens, so `length` takes any local tokenizer file (or a
callable); we cannot download Llama-3's here.

Popularity is the sum of the engagement counts found under `popularity_keys` in
`doc.metadata` (default likes + retweets + replies + quotes, the fields of the paper's
twitter100m source). The released script uses likes only: pass `popularity_keys=("likes",)`
to reproduce it. Documents whose metadata lacks a key, or holds a non-count, are tagged
"unknown" and kept (counted as `m1_missing_engagement`): M1 has no opinion about them.

The released script is the length-only ablation and differs in two more ways: its junk bound
is `<= 30` tokens (the paper's rule, kept here, is `< 30`), and it first keeps only tweets
that are pure ASCII (its English filter), which is a choice of source, not of M1, and is not
applied here. The source's text field is `tweet` (read it with `data.text_field = "tweet"`).
Kiln tags and drops here; the paper's token-matched junk / control arms and their mixtures
are built from the tags (`mode="tag"`) by the `brain_rot_arms` stage (`filters.arms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how M1 classes a document (tokens, popularity)
RULES_VERSION = "2026-12-07"

ENGAGEMENT_KEYS = ("likes", "retweets", "replies", "quotes")
JUNK_MAX_TOKENS = 30  # junk: tokens < 30 (strict)
CONTROL_MIN_TOKENS = 100  # control: tokens > 100 (strict)
POPULARITY_THRESHOLD = 500  # junk: popularity > 500; control: popularity <= 500


class TokenizerLength:
    """Token count with a local HF `tokenizers` file, special tokens included (as the paper).

    Loaded lazily so the pipeline step pickles cheaply into executor workers.
    """

    def __init__(self, tokenizer_path: str | Path, add_special_tokens: bool = True):
        self.path = Path(tokenizer_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {self.path}")
        self.add_special_tokens = add_special_tokens
        self._tok = None

    def __call__(self, text: str) -> int:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(self.path))
        return len(self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tok": None}


def popularity(metadata: dict, keys: Sequence[str] = ENGAGEMENT_KEYS) -> int | None:
    """Sum of the engagement counts under `keys`; None when one is missing or not a count."""
    total = 0
    for key in keys:
        value = metadata.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            return None
        if isinstance(value, float) and not value.is_integer():
            return None
        total += int(value)
    return total


def m1_class(
    n_tokens: int,
    pop: int | None,
    junk_max_tokens: int = JUNK_MAX_TOKENS,
    control_min_tokens: int = CONTROL_MIN_TOKENS,
    popularity_threshold: int = POPULARITY_THRESHOLD,
) -> str:
    """"junk" (short and popular), "control" (long and unpopular), "neither" or "unknown"."""
    if pop is None:
        return "unknown"
    if n_tokens < junk_max_tokens and pop > popularity_threshold:
        return "junk"
    if n_tokens > control_min_tokens and pop <= popularity_threshold:
        return "control"
    return "neither"


class EngagementFilter(BaseFilter):
    """M1 as a pipeline step: writes `m1_tokens`, `m1_popularity`, `m1_class` into metadata.

    mode "drop" removes junk (reason `m1_junk`); mode "tag" keeps every document, so a
    later step (or whoever builds the paper's junk / control arms) decides from the tags.
    """

    name = "🧠 Brain Rot M1 engagement"

    def __init__(
        self,
        length: Callable[[str], int] | str | Path,
        mode: str = "drop",
        popularity_keys: Sequence[str] = ENGAGEMENT_KEYS,
        junk_max_tokens: int = JUNK_MAX_TOKENS,
        control_min_tokens: int = CONTROL_MIN_TOKENS,
        popularity_threshold: int = POPULARITY_THRESHOLD,
        exclusion_writer: DiskWriter | None = None,
    ):
        super().__init__(exclusion_writer)
        if mode not in ("drop", "tag"):
            raise ValueError(f"EngagementFilter mode must be 'drop' or 'tag', got {mode!r}")
        if not popularity_keys:
            raise ValueError("popularity_keys must name at least one engagement field")
        if len(set(popularity_keys)) != len(popularity_keys):  # a repeat counted twice
            raise ValueError(f"popularity_keys names a field twice: {list(popularity_keys)}")
        self.length = length if callable(length) else TokenizerLength(length)
        self.mode = mode
        self.popularity_keys = tuple(popularity_keys)
        self.thresholds = (junk_max_tokens, control_min_tokens, popularity_threshold)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        n_tokens = int(self.length(doc.text))
        pop = popularity(doc.metadata, self.popularity_keys)
        label = m1_class(n_tokens, pop, *self.thresholds)
        doc.metadata.update(m1_tokens=n_tokens, m1_popularity=pop, m1_class=label)
        self.stat_update(f"m1_{label}")
        if label == "unknown":
            self.stat_update("m1_missing_engagement")
        if self.mode == "drop" and label == "junk":
            return False, "m1_junk"
        return True
