"""`generate` on a model trained with document masking samples what training's masked forward
gives: a document's tokens see neither earlier documents nor the EOS before them."""

from __future__ import annotations

import pytest
import torch

from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.model.doc_mask import document_ids
from kiln.model.sampling import _next_token, generate, last_document

EOS = 0


def masked_model(doc_mask: bool = True, **extra) -> Transformer:
    """Random weights far from init (norm gains too), so a key that should be hidden moves
    the logits well past any near-tie."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_seq_len=40, doc_mask=doc_mask, **extra)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    return model.eval()


def masked_reference(model: Transformer, prompt: list[int], n: int, temperature: float,
                     seed: int) -> list[int]:
    """Token by token from the full forward with training's document ids (no cache), drawn
    with the same generator as `generate`."""
    rng = torch.Generator().manual_seed(seed)
    seq, out = list(prompt), []
    for _ in range(min(n, model.cfg.max_seq_len - len(prompt))):
        x = torch.tensor([seq])
        with torch.no_grad():
            logits = model(x, doc_ids=document_ids(x, EOS))[0, -1]
        token = _next_token(logits, temperature, 0, 1.0, rng)
        out.append(token)
        seq.append(token)
        if token == EOS:
            break
    return out


def test_last_document_is_what_the_last_token_sees():
    assert last_document([EOS], EOS) == [EOS]
    assert last_document([5, 7, EOS], EOS) == [5, 7, EOS]
    assert last_document([5, EOS, 7, EOS], EOS) == [7, EOS]
    assert last_document([4, EOS, EOS], EOS) == [EOS]
    assert last_document([5, 7, EOS, 9, 3], EOS) == [9, 3]
    assert last_document([9, 3], EOS) == [9, 3]


@pytest.mark.parametrize("extra", [{}, {"local_per_global": 1, "sliding_window": 4}],
                         ids=["global", "sliding-window"])
@pytest.mark.parametrize("prompt", [[EOS], [5, 7, EOS], [5, 7, EOS, 9, 3]],
                         ids=["eos", "document-then-eos", "two-documents"])
def test_samples_are_those_of_the_masked_forward(extra, prompt):
    model = masked_model(**extra)
    longest = 0
    for temperature, seed in [(0.0, 0), *((1.0, s) for s in range(8))]:
        ours = generate(model, prompt, 30, temperature=temperature, eos_id=EOS,
                        generator=torch.Generator().manual_seed(seed))
        assert ours == masked_reference(model, prompt, 30, temperature, seed), (temperature, seed)
        longest = max(longest, len(ours))
    assert longest >= 6  # a document long enough that the hidden keys would have mattered


def test_without_document_masking_the_whole_prompt_is_the_context():
    model = masked_model(doc_mask=False)
    prompt = [5, 7, EOS, 9, 3]
    ours = generate(model, prompt, 20, temperature=0.0, eos_id=EOS)
    seq = list(prompt)
    for token in ours:
        with torch.no_grad():
            assert token == int(model(torch.tensor([seq]))[0, -1].argmax())
        seq.append(token)
