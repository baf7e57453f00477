"""Generated ids -> text, without the half character a stop can leave at the end.

Byte-level BPE tokens are bytes, not characters: a sample that stops (max_new_tokens, the
context, or EOS) may end on the first bytes of a multi-byte UTF-8 character. Decoding them
gives U+FFFD, which reads as if the model wrote a broken character. The sample's text is
its complete characters; the incomplete tail is left out and counted, so whoever prints or
records the text can say so. Invalid bytes elsewhere (the model's own) stay U+FFFD.
"""

from __future__ import annotations

import codecs
import functools

from tokenizers import Tokenizer, pre_tokenizers


@functools.cache
def _symbol_bytes() -> dict[str, int]:
    """Byte-level BPE's printable symbol -> the byte it stands for (GPT-2's table: printable
    Latin-1 bytes are themselves, the others 256, 257, ... in byte order)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}
    if set(table) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("tokenizers' ByteLevel alphabet is not GPT-2's byte table")
    return table


def sample_bytes(tok: Tokenizer, ids: list[int]) -> bytes:
    """The bytes `ids` stand for; an added token's (EOS) are its text, as
    `decode(skip_special_tokens=False)` shows it."""
    added = tok.get_added_tokens_decoder()
    table = _symbol_bytes()
    out = bytearray()
    for idx in ids:
        if idx in added:
            out += added[idx].content.encode("utf-8")
        elif (token := tok.id_to_token(idx)) is not None:
            out += bytes(table[ch] for ch in token)
        else:
            raise ValueError(f"id {idx} is not in the tokenizer's vocabulary")
    return bytes(out)


def decode_sample(tok: Tokenizer, ids: list[int], eos: int | None = None) -> tuple[str, int]:
    """(text, bytes left out): the text of `ids` up to its last complete character, and how
    many trailing bytes began a character the stop cut short. A final `eos` ends the
    sample: the bytes before it are the ones checked, and its text follows them."""
    end = ids[:-1] if ids and eos is not None and ids[-1] == eos else ids
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(sample_bytes(tok, end), final=False)
    held = len(decoder.getstate()[0])  # a valid start of a character, awaiting the rest
    if len(end) < len(ids):
        text += sample_bytes(tok, ids[-1:]).decode("utf-8")
    return text, held
