"""Texts too long for the stages after the reader, cut into parts at a documented rule.

Why: the prose quality filters split a document into words with spaCy, at about 100 bytes of
memory per character of text: a 200 MB text (one `text` field, a `.txt` dump with no line
breaks) needs some 20 GB and fails hours into a run, though Gopher's 100,000-word bound
would drop it in the end anyway (the quality stage judges that bound on the whole text, over
its parts: `kiln.data.filters.text_length`). So the reader cuts any text longer than
`MAX_DOCUMENT_CHARS` (spaCy's own default `max_length`, 1,000,000 characters) into
consecutive parts, none longer, each a document of its own, nothing left out:

- each part ends at the last blank line (a paragraph break) in the second half of the window
  of `MAX_DOCUMENT_CHARS` characters; else at its last line break; else after its last ASCII
  space, tab, CR, FF or VT (`_WHITESPACE`: not Unicode's other spaces, such as U+00A0 or
  U+3000); else (none there) at the window's end;
- but where the rest of the text (from the part's start to the text's end) is over the limit
  and at most 1.5 times it, that cut could leave a last part of a few words, which rules
  judged part by part drop (C4's five sentences, Gopher's top-2-gram share: a kept text lost
  its ending): the rest is cut in two near its middle instead, at the break nearest the
  middle within a quarter of the limit either side of it (a paragraph break, else a line
  break, else whitespace, as above; else at the middle), so every part, the last too, holds
  between a quarter of the limit and the limit;
- the separator stays at the end of the part before the cut, so the parts joined are the text.

A text of up to `MAX_DOCUMENT_CHARS` characters is never cut (the largest file of the
standard library is 757 kB), so smaller corpora read exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

MAX_DOCUMENT_CHARS = 1_000_000
# metadata key of each part: the id of the text it was cut from (`kiln tokenize` splits
# train/val by it, so a text's parts never land on both sides)
PART_OF = "part_of"


def cut_text_of(doc) -> tuple[str | None, str] | None:
    """Which cut text `doc` is a part of, for a stage that gives a text's parts its first
    part's verdict: (its source file, `part_of`), or None for a document that was not cut.
    `part_of` alone is the text's id within its source (`dump.txt`, `data.jsonl:1`): two
    sources named alike (`en/dump.txt` and `fr/dump.txt` given as files) give their texts one
    id, and the second text's parts took the first's verdict."""
    text = doc.metadata.get(PART_OF)
    return None if text is None else (doc.metadata.get("source"), text)


class FirstPartVerdict:
    """What a stage found on a cut text's first part (its language, score, M2 verdict), held
    for the later parts, which follow it one after another: one text at a time."""

    def __init__(self) -> None:
        self.text: tuple[str | None, str] | None = None
        self.value: Any = None

    def of(self, doc) -> Any:
        """The verdict held for `doc`, a later part of the held text; else None."""
        text = cut_text_of(doc)
        return self.value if text is not None and text == self.text else None

    def keep(self, doc, value: Any) -> None:
        """`value` is `doc`'s verdict: held for its text's later parts (if it is a part)."""
        if (text := cut_text_of(doc)) is not None:
            self.text, self.value = text, value

_WHITESPACE = (" ", "\t", "\r", "\f", "\v")
# the kinds of break a part ends after, the first kind found taken: a paragraph, a line,
# whitespace (each kind's separators are of one length)
_BREAKS = (("\n\n",), ("\n",), _WHITESPACE)
# the cut rule, recorded in the signature of a prepare that cut texts
# (kiln.data.prepare_signature): a resume must not mix parts cut by another rule (before
# it, the usual cut to the end, which could leave a last part of a few words)
CUT_RULE = "halved_end"
CUT_RULE_KEY = "long_text_cut"  # its key in the signature and the documents' fingerprint


def split_long_text(text: str, limit: int = MAX_DOCUMENT_CHARS) -> Iterator[str]:
    """`text` as consecutive parts of at most `limit` characters (see the module's rule).
    A cut scans at most half the limit per kind of break (seven kinds), backwards in a
    window's second half or outwards from the rest's middle: linear in the text's length."""
    _check(limit)
    start, n = 0, len(text)
    while n - start > limit:
        yield text[start:(cut := _next_cut(text, start, n - start, limit))]
        start = cut
    yield text[start:]


def split_text_stream(chunks: Iterable[str], limit: int = MAX_DOCUMENT_CHARS) -> Iterator[str]:
    """The parts `split_long_text` makes of `"".join(chunks)`, from the chunks as they come:
    a cut depends on the window it ends and on whether the rest of the text is over 1.5
    times the limit, so a part is made once more than that is read, and no more than that
    and a chunk are held (a 20 GB text dump reads in a few MB)."""
    _check(limit)
    held, pending, n_pending = "", [], 0  # chunks are joined once enough is read: a
    for chunk in chunks:                  # decompressor's reads of a few kB each are not
        pending.append(chunk)             # copied a million characters at a time
        n_pending += len(chunk)
        if not _far_from_end(len(held) + n_pending, limit):
            continue
        held += "".join(pending)
        pending, n_pending, start = [], 0, 0
        while _far_from_end(len(held) - start, limit):  # the usual cut, whatever follows
            yield held[start:(cut := _next_cut(held, start, len(held) - start, limit))]
            start = cut
        held = held[start:]
    yield from split_long_text(held + "".join(pending), limit)  # the end is in sight


def _check(limit: int) -> None:
    if limit < 2:
        raise ValueError(f"the part limit must be at least 2 characters, not {limit}")


def _far_from_end(rest: int, limit: int) -> bool:
    """Whether a rest of `rest` characters is over 1.5 x `limit`: a usual cut leaves more
    than half the limit after it, so no part is short."""
    return 2 * rest > 3 * limit


def _next_cut(text: str, start: int, rest: int, limit: int) -> int:
    """Where the part starting at `start` ends, `rest` (over `limit`) characters being left
    from it to the text's end: the usual cut in its window's second half, or, where the end
    is near, a cut near the middle of the rest (the module's rule)."""
    if _far_from_end(rest, limit):
        return _cut(text, start + limit // 2, start + limit)
    middle, quarter = start + rest // 2, limit // 4
    return _cut_near(text, middle - quarter, middle, middle + quarter)


def _cut(text: str, lo: int, end: int) -> int:
    """Where the part that must end by `end` ends: after the last separator in [lo, end)
    of the first kind of `_BREAKS` there is one of; else at `end`."""
    for seps in _BREAKS:
        at = max(text.rfind(sep, lo, end) for sep in seps)
        if at >= 0:
            return at + len(seps[0])
    return end


def _cut_near(text: str, lo: int, middle: int, end: int) -> int:
    """Where a rest is cut in two: after the separator in [lo, end) nearest `middle` (the
    earlier of two as near), of the first kind there is one of, as `_cut` orders them; else
    at `middle`. Each kind is searched from `middle` outwards, to the first hit each way."""
    for seps in _BREAKS:
        cuts = []
        for sep in seps:
            before = text.rfind(sep, lo, min(end, middle + len(sep) - 1))
            after = text.find(sep, middle, end)
            cuts += [at + len(sep) for at in (before, after) if at >= 0]
        if cuts:
            return min(cuts, key=lambda cut: (abs(cut - middle), cut))
    return middle
