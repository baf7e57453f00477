"""The first tokens of a text without tokenizing all of it.

A scorer reads a document's first few hundred tokens, but encoding the whole text (up to the
reader's 1,000,000 characters) cost time and memory in proportion to the document. A byte-level
BPE never merges across its pre-tokenizer's pieces, and a piece is decided by its own
characters and the one after it: in a prefix of the text every piece but the last two is a
piece of the whole text, and is encoded as it is there. So a prefix is encoded, and its tokens
are taken when those pieces hold enough of them; otherwise a prefix four times as long, up to
the whole text. The ids are those of encoding the whole text, cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

CHARS_PER_TOKEN = 8  # the first prefix: 8 characters a token (English BPE: about 4)
GROWTH = 4


def first_token_ids(tok: Tokenizer, texts: Sequence[str], limit: int) -> list[list[int]]:
    """`tok.encode(text, add_special_tokens=False).ids[:limit]` of each text, from prefixes."""
    out: list[list[int] | None] = [None] * len(texts)
    todo = list(range(len(texts)))
    chars = CHARS_PER_TOKEN * max(limit, 1)
    while todo:
        cut = [texts[i][:chars] for i in todo]
        encodings = tok.encode_batch(cut, add_special_tokens=False)
        again = []
        for i, prefix, enc in zip(todo, cut, encodings):
            if len(prefix) == len(texts[i]) or _settled(tok, prefix, enc.offsets, limit):
                out[i] = enc.ids[:limit]
            else:
                again.append(i)
        todo, chars = again, chars * GROWTH
    return out  # type: ignore[return-value]  (every entry is filled)


def _settled(tok: Tokenizer, prefix: str, offsets: list[tuple[int, int]], limit: int) -> bool:
    """Whether the first `limit` tokens of `prefix` lie in pieces before its last two."""
    if len(offsets) < limit or tok.pre_tokenizer is None:
        return False
    pieces = tok.pre_tokenizer.pre_tokenize_str(prefix)
    if len(pieces) < 3:
        return False
    return offsets[limit - 1][1] <= pieces[-2][1][0]  # ends before the second-last piece
