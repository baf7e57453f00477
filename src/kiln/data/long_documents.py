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
- the separator stays at the end of the part before the cut, so the parts joined are the text.

A text of up to `MAX_DOCUMENT_CHARS` characters is never cut (the largest file of the
standard library is 757 kB), so smaller corpora read exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MAX_DOCUMENT_CHARS = 1_000_000
# metadata key of each part: the id of the text it was cut from (`kiln tokenize` splits
# train/val by it, so a text's parts never land on both sides)
PART_OF = "part_of"

_WHITESPACE = (" ", "\t", "\r", "\f", "\v")


def split_long_text(text: str, limit: int = MAX_DOCUMENT_CHARS) -> Iterator[str]:
    """`text` as consecutive parts of at most `limit` characters (see the module's rule).
    Each window's second half is searched backwards once per kind of break (at most seven
    scans, none past the window's middle): linear in the text's length."""
    if limit < 2:
        raise ValueError(f"the part limit must be at least 2 characters, not {limit}")
    start, n = 0, len(text)
    while n - start > limit:
        end = start + limit
        yield text[start:(cut := _cut(text, start + limit // 2, end))]
        start = cut
    yield text[start:]


def split_text_stream(chunks: Iterable[str], limit: int = MAX_DOCUMENT_CHARS) -> Iterator[str]:
    """The parts `split_long_text` makes of `"".join(chunks)`, from the chunks as they come:
    a cut depends only on the window it ends, so a part is made once its window is read, and
    no more than a window and a chunk are held (a 20 GB text dump reads in a few MB)."""
    if limit < 2:
        raise ValueError(f"the part limit must be at least 2 characters, not {limit}")
    held, pending, n_pending = "", [], 0  # chunks are joined once a window is full: a
    for chunk in chunks:                  # decompressor's reads of a few kB each are not
        pending.append(chunk)             # copied a million characters at a time
        n_pending += len(chunk)
        if len(held) + n_pending <= limit:
            continue
        held += "".join(pending)
        pending, n_pending = [], 0
        while len(held) > limit:
            cut = _cut(held, limit // 2, limit)
            yield held[:cut]
            held = held[cut:]
    yield held + "".join(pending)


def _cut(text: str, lo: int, end: int) -> int:
    """Where the part that must end by `end` ends: after a separator in [lo, end)."""
    at = text.rfind("\n\n", lo, end)
    if at >= 0:
        return at + 2
    at = text.rfind("\n", lo, end)
    if at >= 0:
        return at + 1
    at = max(text.rfind(ws, lo, end) for ws in _WHITESPACE)
    return at + 1 if at >= 0 else end
