"""Intra-document attention masking (`model.doc_mask`, Trinity Large): Kiln packs documents
EOS-separated into fixed-length windows, and with the mask on a token attends only to
earlier tokens of its own document, not to the documents packed before it.

A document runs up to and including the EOS that ends it; the token after an EOS starts
the next one. Positions are not reset at a document's start (RoPE keeps the window's
absolute positions, as Llama 3 and most implementations do): within one document the
attention scores depend only on relative positions anyway. The loss is unchanged: every
target is still scored, including the first token of a document, predicted from the EOS
(which sees its own document only).

The model takes per-token document ids (`doc_ids`, (B, T) integers: equal ids, one
document) next to the tokens, so it stays free of tokenizer knowledge; the trainer and
eval make them from the inputs and the shards' EOS id (`document_ids`,
`kiln.data.loader.masking_eos_id`). Without
`doc_ids` attention is plain causal, with no extra work.
"""

from __future__ import annotations

import torch


def document_ids(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) document index of each token: the number of EOS tokens strictly before it,
    so an EOS belongs to the document it ends."""
    is_eos = (tokens == eos_id).to(torch.int32)
    return is_eos.cumsum(dim=-1, dtype=torch.int32) - is_eos


def causal_document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) boolean mask, True where query i may see key j: j <= i, same document."""
    t = doc_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril_()
    return (causal & (doc_ids[:, :, None] == doc_ids[:, None, :]))[:, None]
