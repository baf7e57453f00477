"""The matmul attention with document ids skips the keys of earlier documents that no query
of a block sees (`_leading_hidden_keys`): the result is the un-narrowed computation's, but
for the order of float sums, and the kept probabilities get narrower."""

import pytest
import torch

import kiln.model.matmul_attention as ma
from kiln.model.matmul_attention import matmul_attention


def doc_ids(lengths_per_row: list[list[int]], t: int) -> torch.Tensor:
    """(B, T) ids of documents whose lengths cycle through each row's list."""
    rows = []
    for lengths in lengths_per_row:
        row: list[int] = []
        doc = 0
        while len(row) < t:
            row += [doc] * lengths[doc % len(lengths)]
            doc += 1
        rows.append(row[:t])
    return torch.tensor(rows)


def _run(q, k, v, grad, window, ids):
    for x in (q, k, v):
        x.grad = None
    out = matmul_attention(q, k, v, window, ids)
    kept = [tuple(p.shape) for p in out.grad_fn.saved_tensors[3:]]
    out.backward(grad)
    return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()], kept


LAYOUTS = {  # (documents per row, T, window)
    "short-docs": ([[7], [9, 3]], 150, 0),  # shorter than a block, several per block
    "crossing-blocks": ([[70, 50], [100]], 200, 0),  # documents across block boundaries
    "one-doc-per-row": ([[1000], [1000]], 130, 0),  # nothing to skip
    "window": ([[30], [11, 40]], 150, 20),  # window < T: the window's bound and the documents'
    "aligned-short": ([[16], [16]], 256, 0),
}


@pytest.mark.parametrize("block", [64, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_narrowed_blocks_equal_the_unnarrowed_computation(layout, dtype, block, monkeypatch):
    """Output and all gradients against the same kernel computing every visible block's
    keys: the skipped keys' probabilities are exactly 0, so only the order of the sums over
    the remaining keys changes: fp32 within a few ulps, bf16 within one bf16 rounding."""
    monkeypatch.setattr(ma, "BLOCK", block)
    lengths, t, window = LAYOUTS[layout]
    ids = doc_ids(lengths, t)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, t, n, 16, generator=g).to(dtype).transpose(1, 2).requires_grad_()
               for n in (8, 4, 4))
    grad = torch.randn(2, 8, t, 16, generator=g).to(dtype)
    got, kept = _run(q, k, v, grad, window, ids)
    with monkeypatch.context() as m:
        m.setattr(ma, "_leading_hidden_keys", lambda hide: 0)
        ref, kept_all = _run(q, k, v, grad, window, ids)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2**-7, atol=1e-5)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(a, b, **tol, msg=name)
    widths, full = [s[-1] for s in kept], [s[-1] for s in kept_all]
    assert all(w <= f for w, f in zip(widths, full))
    assert (widths == full) == (layout == "one-doc-per-row")


def test_kept_probabilities_start_at_the_earliest_document_start_over_the_rows(monkeypatch):
    """Blocks of 64 over T = 256: documents of 16 tokens aligned to the blocks leave each
    block its own 64 keys (un-narrowed: 64, 128, 192, 256); with a row whose documents run
    40 tokens, a block's keys start at that row's document start (the least over rows)."""
    monkeypatch.setattr(ma, "BLOCK", 64)
    q, k, v = (torch.randn(2, n, 256, 8, requires_grad=True) for n in (4, 2, 2))

    def widths(ids):
        out = matmul_attention(q, k, v, 0, ids)
        return [p.shape[-1] for p in out.grad_fn.saved_tensors[3:]]

    assert widths(doc_ids([[16], [16]], 256)) == [64, 64, 64, 64]
    # row 1's documents start at 0, 40, 80, 120, 160, 200, 240: the block at 64 sees from
    # 40 (row 1), at 128 from 120, at 192 from 160; row 0's starts are 64, 128, 192
    assert widths(doc_ids([[16], [40]], 256)) == [64, 128 - 40, 192 - 120, 256 - 160]
    # window 30: the later of the two bounds; block 64's keys from 40 (window: 35), block
    # 128's from 120 (window: 99), block 192's from 163 (the window's; documents: 160)
    out = matmul_attention(q, k, v, 30, doc_ids([[16], [40]], 256))
    assert [p.shape[-1] for p in out.grad_fn.saved_tensors[3:]] == [64, 88, 72, 93]
    # non-contiguous ids (one document in two runs) are hidden the same: only leading keys
    # no query sees are skipped
    ids = torch.tensor([[0] * 100 + [1] * 100 + [0] * 56] * 2)
    assert widths(ids) == [64, 128, 192 - 100, 256]


def test_the_compiled_kernel_takes_doc_ids_in_one_graph(monkeypatch):
    """The skipped key count depends on the data: under torch.compile nothing is skipped
    (no graph break, fullgraph holds), and the result is the eager one."""
    monkeypatch.setattr(ma, "BLOCK", 5)
    torch._dynamo.reset()
    ids = doc_ids([[7, 9, 4], [3, 17]], 20)
    q, k, v = (torch.randn(2, n, 20, 8, requires_grad=True) for n in (4, 2, 2))
    eager = matmul_attention(q, k, v, 0, ids)
    compiled = torch.compile(matmul_attention, fullgraph=True)(q, k, v, 0, ids)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
