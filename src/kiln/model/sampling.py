"""Autoregressive sampling with the KV cache: greedy, temperature, top-k and nucleus (top-p).

The prompt is run once (prefill) and every new token costs one single-token forward, so
generating n tokens is O(n) forwards instead of O(n^2) recomputation.
"""

from __future__ import annotations

import torch

from kiln.errors import TrainingDiverged
from kiln.model.transformer import Transformer


def tokenizer_ids(logits: torch.Tensor, vocab_size: int | None) -> torch.Tensor:
    """The last dimension's first `vocab_size` entries (None: all): the ids the tokenizer
    has. A vocabulary padded past it (model.vocab_size) has rows no tokenizer decodes, never
    trained yet given some probability; `generate` samples, and `kiln eval`'s next-token
    concentration measures, the distribution over the tokenizer's ids alone."""
    return logits[..., :vocab_size]


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask (to -inf) all but the top-k logits, then all outside the nucleus of mass top_p.

    Works on the last dimension. top_k keeps every logit at least the k-th largest (0 = off):
    tokens whose logits tie get the same probability, as in transformers' TopKLogitsWarper,
    rather than some of them dropped by where they sit in the vocabulary. The nucleus is the
    smallest set of most likely tokens whose probability reaches top_p (1.0 = off), so the
    most likely token always survives.
    """
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")
    out = logits
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        out = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1)  # the least likely first
        probs = sorted_logits.softmax(dim=-1, dtype=torch.promote_types(out.dtype, torch.float32))
        # each token's mass with all less likely ones, summed from the small end (as
        # transformers does): a top_p near 1 leaves a tail of tiny probabilities that a sum
        # from the head, already ~1, would round away
        tail = probs.cumsum(dim=-1)
        drop_sorted = tail <= 1.0 - top_p  # the nucleus reaches top_p without them
        drop_sorted[..., -1] = False  # the most likely token always survives
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out

def decoding_settings(temperature: float, top_k: int, top_p: float) -> dict[str, object]:
    """What samples.json records of how a sample was drawn: greedy decoding (temperature 0)
    uses neither top_k nor top_p, so it names itself rather than listing them."""
    if temperature == 0.0:
        return {"temperature": 0.0, "decoding": "greedy"}
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p}


def _next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> int:
    if not torch.isfinite(logits).all():  # argmax and multinomial would pick garbage
        raise TrainingDiverged("the model's logits are not finite: its weights hold NaN or "
                               "inf (did training diverge?)")
    if temperature == 0.0:
        return int(logits.argmax())
    logits = logits.double()  # a temperature of 1e-300 is 0 in fp32
    # shifted so the largest is 0 before dividing: a tiny temperature then sends the others
    # to -inf (greedy in the limit) instead of overflowing them all to inf - inf = NaN
    probs = filter_logits((logits - logits.max()) / temperature, top_k, top_p).softmax(dim=-1)
    if generator is not None:
        probs = probs.to(generator.device)  # multinomial needs probs on the generator's device
    return int(torch.multinomial(probs, 1, generator=generator))


def last_document(prompt_ids: list[int], eos_id: int) -> list[int]:
    """The prompt's tokens its last token may see in a model trained with document masking
    (`model.doc_mask`): those after the last EOS before it. An EOS belongs to the document it
    ends, so a prompt ending in EOS keeps the EOS's own document (for `[EOS]`, the EOS alone);
    earlier documents were hidden from it in training."""
    start = max((i + 1 for i, t in enumerate(prompt_ids[:-1]) if t == eos_id), default=0)
    return prompt_ids[start:]


@torch.no_grad()
def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> list[int]:
    """The new token ids (prompt excluded) sampled after `prompt_ids`.

    temperature 0 is greedy (top_k/top_p are then irrelevant). `vocab_size` (the
    tokenizer's) keeps the draws to ids a tokenizer can decode: a model whose vocabulary is
    padded past it (model.vocab_size) gives its never-trained rows some probability, and the
    tokenizer would drop those ids from the text without a word. Stops after emitting
    `eos_id` (which is included in the result), after `max_new_tokens`, or when prompt plus
    completion would exceed the model's max_seq_len. The model's train/eval mode is restored.

    A model trained with `model.doc_mask` (its `eos_id` the shards' EOS, as `kiln generate`
    passes) never let a token see another document: the prompt's earlier documents are left
    out of the context, and after a prompt ending in EOS (`kiln generate`'s "" prompt) the
    new document is decoded from a fresh cache, so its tokens do not attend to that EOS,
    which training hid from them. Positions then start at 0, which RoPE (relative) and NoPE
    layers do not see; the samples are those of training's masked forward.
    """
    if not prompt_ids:
        raise ValueError("generate needs a non-empty prompt (e.g. the EOS id to start a document)")
    if not temperature >= 0:  # NaN too: it would fail later, in multinomial
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    max_len = model.cfg.max_seq_len
    if len(prompt_ids) > max_len:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds max_seq_len {max_len}")
    budget = min(max_new_tokens, max_len - len(prompt_ids))
    device = model.embed.weight.device
    was_training = model.training
    model.eval()
    masked = model.cfg.doc_mask and eos_id is not None
    context = last_document(prompt_ids, eos_id) if masked else prompt_ids
    try:
        caches = model.new_caches(len(context) + budget)
        step_input = torch.tensor([context], dtype=torch.long, device=device)
        out: list[int] = []
        for _ in range(budget):
            # the head on the last position alone: the prompt's other rows are never sampled,
            # and their logits (prompt x vocabulary) were 3.3 GB at 4,096 x 200,192 in fp32
            last = model.hidden_states(step_input, caches)[0, -1]
            logits = tokenizer_ids(model.head(last), vocab_size)
            token = _next_token(logits, temperature, top_k, top_p, generator)
            out.append(token)
            if token == eos_id:
                break
            if masked and len(out) == 1 and context[-1] == eos_id:
                # the first token after an EOS starts a document: it sees none before it
                caches = model.new_caches(budget)
            step_input = torch.tensor([[token]], dtype=torch.long, device=device)
        return out
    finally:
        model.train(was_training)
