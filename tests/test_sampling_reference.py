"""filter_logits against transformers' logits warpers (Temperature, then TopK, then TopP, the
order `generate` applies them): the same tokens kept, the same renormalised probabilities."""

from __future__ import annotations

import pytest
import torch

from kiln.model.sampling import filter_logits

warpers = pytest.importorskip("transformers.generation.logits_process")


def _theirs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    scores = warpers.TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = warpers.TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = warpers.TopPLogitsWarper(top_p)(None, scores)
    return scores


def _ours(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    return filter_logits(logits.double() / temperature, top_k, top_p)  # as _next_token does


def _cases(seed: int, n: int, ties: bool):
    """Random logits: integer-valued (many ties) or Gaussian, some entries -inf."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        vocab = int(torch.randint(2, 60, (), generator=gen))
        if ties:
            logits = torch.randint(-3, 3, (3, vocab), generator=gen).float()
        else:
            logits = torch.randn(3, vocab, generator=gen) * 3
        if i % 3 == 0:  # some tokens already ruled out; each row keeps at least one
            logits[torch.rand(3, vocab, generator=gen) < 0.3] = float("-inf")
            logits[:, 0] = 0.5
        temperature = float(torch.rand((), generator=gen)) * 2 + 0.1
        top_k = int(torch.randint(0, vocab + 3, (), generator=gen))  # 0 and past the vocab too
        yield logits, temperature, top_k


@pytest.mark.parametrize("ties", [False, True])
def test_temperature_and_top_k_keep_what_transformers_keeps(ties):
    """Tokens tied with the k-th largest logit are all kept, as transformers keeps them: a
    token's probability must not depend on where it sits in the vocabulary."""
    for logits, temperature, top_k in _cases(0, 100, ties):
        theirs = _theirs(logits, temperature, top_k, 1.0)
        ours = _ours(logits, temperature, top_k, 1.0)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs)), (logits, top_k)
        torch.testing.assert_close(ours.softmax(-1).float(), theirs.softmax(-1),
                                   atol=1e-6, rtol=1e-5)


def test_top_k_treats_tied_tokens_alike():
    """Permuting the vocabulary permutes what top_k keeps: no tied token is favoured for its id."""
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0, 2.0])
    for top_k in range(1, 8):
        kept = torch.isfinite(filter_logits(logits, top_k=top_k))
        for perm in (torch.arange(7, -1, -1), torch.tensor([3, 6, 0, 5, 1, 7, 2, 4])):
            assert torch.equal(torch.isfinite(filter_logits(logits[perm], top_k=top_k)),
                               kept[perm]), (top_k, perm)
    kept = {k: int(torch.isfinite(filter_logits(logits, top_k=k)).sum()) for k in range(1, 9)}
    assert kept == {1: 2, 2: 2, 3: 6, 4: 6, 5: 6, 6: 6, 7: 7, 8: 8}


@pytest.mark.parametrize("ties", [False, True])
def test_top_p_after_top_k_keeps_what_transformers_keeps(ties):
    """The nucleus over what top_k left, renormalised: the token that crosses top_p is kept.
    Among tokens tied at the edge of the nucleus either may go (transformers' pick depends on
    its sort); then the kept probabilities match as a multiset."""
    gen = torch.Generator().manual_seed(1)
    for logits, temperature, top_k in _cases(2, 100, ties):
        top_p = float(torch.rand((), generator=gen)) * 0.999 + 0.001
        theirs = _theirs(logits, temperature, top_k, top_p)
        ours = _ours(logits, temperature, top_k, top_p)
        if ties:
            torch.testing.assert_close(ours.softmax(-1).float().sort(-1).values,
                                       theirs.softmax(-1).sort(-1).values, atol=1e-6, rtol=1e-5)
        else:
            assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs)), (logits, top_p)
            torch.testing.assert_close(ours.softmax(-1).float(), theirs.softmax(-1),
                                       atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("top_p", "kept"), [(1 - 1e-9, 1), (1 - 2e-10, 2), (1 - 5e-11, 3)])
def test_a_nucleus_near_one_keeps_the_tail_it_needs(top_p, kept):
    """Probabilities 1 - 3.8e-10, 2.8e-10, 1.0e-10: a top_p within 1e-9 of 1 still needs the
    tail, and summing from the head (already 1 in fp32) lost it: the sample went greedy."""
    logits = torch.tensor([20.0, -2.0, -3.0], dtype=torch.float64)
    assert torch.isfinite(filter_logits(logits, top_p=top_p)).sum() == kept
    theirs = warpers.TopPLogitsWarper(top_p)(None, logits[None].float())
    assert torch.isfinite(theirs).sum() == kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tiny_top_p_still_keeps_the_most_likely_token(dtype):
    """1 - top_p rounds to 1 in fp32, above the whole (rounded) mass: one token must stay."""
    logits = torch.tensor([[0.3, 2.0, float("-inf"), 1.0, 2.0 - 1e-3]], dtype=dtype)
    for top_p in (1e-12, 1e-3):
        out = filter_logits(logits, top_p=top_p)
        assert torch.isfinite(out).nonzero()[:, 1].tolist() == [1] and out[0, 1] == logits[0, 1]
