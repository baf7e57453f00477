"""The matmul attention with document ids skips, in each batch row, the keys of earlier
documents that none of the row's queries in a block sees (`_row_runs`): the result is the
un-narrowed computation's, but for the order of float sums, and the kept probabilities get
narrower."""

import itertools
import math

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


def random_lengths(rows: int, mean: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(40, generator=g) * 2 * mean).long().add(1).tolist() for _ in range(rows)]


def _run(q, k, v, grad, window, ids):
    for x in (q, k, v):
        x.grad = None
    out = matmul_attention(q, k, v, window, ids)
    kept = [tuple(p.shape) for p in out.grad_fn.saved_tensors[3:]]
    out.backward(grad)
    return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()], kept


def row_widths(kept: list[tuple[int, ...]], rows: int, kv: int) -> list[list[int]]:
    """Per block, per batch row, the width of the kept probabilities (the keys computed)."""
    widths = [w for shape in kept for w in [shape[-1]] * (shape[0] // kv)]
    return [widths[i : i + rows] for i in range(0, len(widths), rows)]


LAYOUTS = {  # (documents per row, T, window)
    "short-docs": ([[7], [9, 3]], 150, 0),  # shorter than a block, several per block
    "crossing-blocks": ([[70, 50], [100]], 200, 0),  # documents across block boundaries
    "one-doc-per-row": ([[1000], [1000]], 130, 0),  # nothing to skip
    "window": ([[30], [11, 40]], 150, 20),  # window < T: the window's bound and the documents'
    "aligned-short": ([[16], [16]], 256, 0),
    "random-32": (random_lengths(5, 32, 0), 256, 0),  # rows of random lengths, mean 32
    "random-64-window": (random_lengths(4, 64, 1), 256, 48),
    "rows-differ": ([[1000], [16], [5, 90], [1000], [40]], 256, 0),  # one document, short, ...
}
# bf16 over these: when the softmax's fp32 sum changes in its last bit, the roundings of
# many probabilities of a long document flip together, which can move an output or key /
# value gradient that sums them by a few of its own ulps (the same as the un-narrowed one
# is off from fp64: tests/test_matmul_attention.py); so there elementwise within 2^-8 of
# the tensor's largest magnitude, and in norm within 2^-12 (seen: ~5e-5)
LONG_DOCUMENTS = {"random-32", "random-64-window", "rows-differ"}


@pytest.mark.parametrize("run_cost", [0, math.inf], ids=["per-row", "shared"])
@pytest.mark.parametrize("block", [64, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_narrowed_blocks_equal_the_unnarrowed_computation(layout, dtype, block, run_cost,
                                                          monkeypatch):
    """Output and all gradients against the same kernel computing every visible block's
    keys: the skipped keys' probabilities are exactly 0, so only the order of the sums over
    the remaining keys changes: fp32 within a few ulps, bf16 within one bf16 rounding (of
    the probabilities, over long documents: `LONG_DOCUMENTS`). With
    each row its own key range (RUN_COST 0) and with one range for all rows (infinite)."""
    monkeypatch.setattr(ma, "BLOCK", block)
    monkeypatch.setattr(ma, "RUN_COST", {dtype: run_cost, torch.float32: run_cost})
    lengths, t, window = LAYOUTS[layout]
    ids, b = doc_ids(lengths, t), len(lengths)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, t, n, 16, generator=g).to(dtype).transpose(1, 2).requires_grad_()
               for n in (8, 4, 4))
    grad = torch.randn(b, 8, t, 16, generator=g).to(dtype)
    got, kept = _run(q, k, v, grad, window, ids)
    with monkeypatch.context() as m:
        m.setattr(ma, "_leading_hidden_keys", lambda hide: [0] * hide.shape[0])
        ref, kept_all = _run(q, k, v, grad, window, ids)
    for name, a, r in zip(("out", "dq", "dk", "dv"), got, ref):
        if dtype == torch.float32:
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6, msg=name)
        elif layout in LONG_DOCUMENTS:
            torch.testing.assert_close(a, r, rtol=2**-7, atol=2**-8 * float(r.abs().max()), msg=name)
            assert (a - r).float().norm() <= 2**-12 * r.float().norm(), name
        else:
            torch.testing.assert_close(a, r, rtol=2**-7, atol=1e-5, msg=name)
    widths, full = row_widths(kept, b, 4), row_widths(kept_all, b, 4)
    assert all(w <= f for block_w, block_f in zip(widths, full) for w, f in zip(block_w, block_f))
    # shared: a row of one document holds every row's keys back
    assert (widths == full) == (layout == "one-doc-per-row" or (
        run_cost == math.inf and layout == "rows-differ"))
    whole = [i for i, lens in enumerate(lengths) if min(lens) >= t]  # one document: no skip
    for a, r in zip(got, ref):  # where nothing is skipped, the very same sums
        assert torch.equal(a[whole], r[whole])


def test_each_batch_row_starts_at_its_own_document_start(monkeypatch):
    """Blocks of 64 over T = 256, documents of 16 tokens in row 0 (aligned to the blocks:
    each block its own 64 keys) and of 40 in row 1 (starts 0, 40, 80, 120, 160, 200, 240):
    with each row its own range (RUN_COST 0), row 0 keeps 64 keys a block while row 1's
    start at its document start (block 64 at 40, 128 at 120, 192 at 160); with one range
    for both rows, both take row 1's, the earlier."""
    monkeypatch.setattr(ma, "BLOCK", 64)
    q, k, v = (torch.randn(2, n, 256, 8, requires_grad=True) for n in (4, 2, 2))

    def widths(ids, window=0):
        out = matmul_attention(q, k, v, window, ids)
        return row_widths([tuple(p.shape) for p in out.grad_fn.saved_tensors[3:]], 2, 2)

    ids = doc_ids([[16], [40]], 256)
    monkeypatch.setattr(ma, "RUN_COST", {torch.float32: 0})
    assert widths(ids) == [[64, 64], [64, 128 - 40], [64, 192 - 120], [64, 256 - 160]]
    # window 30: the later of the two bounds; row 1's block 64 keys from 40 (window: 35),
    # block 128's from 120 (window: 99), block 192's from 163 (the window's; documents: 160)
    assert widths(ids, 30) == [[64, 64], [64, 88], [64, 72], [64, 93]]
    # non-contiguous ids (one document in two runs) are hidden the same: only leading keys
    # no query of the row sees are skipped
    assert widths(torch.tensor([[0] * 100 + [1] * 100 + [0] * 56, [0] * 256])) == [
        [64, 64], [128, 128], [192 - 100, 192], [256, 256]]
    monkeypatch.setattr(ma, "RUN_COST", {torch.float32: math.inf})
    assert widths(ids) == [[64, 64], [88, 88], [72, 72], [96, 96]]


@pytest.mark.parametrize("seed", range(20))
def test_runs_of_rows_cost_the_least(seed, monkeypatch):
    """`_row_runs` splits the rows into the contiguous runs of least keys computed plus
    RUN_COST per run (the brute force over every split); each run starts at its rows'
    earliest first key, and of equal splits it takes no more runs than needed."""
    g = torch.Generator().manual_seed(seed)
    n, lo, stop = 6, 10, 74
    skips = torch.randint(0, stop - lo, (n,), generator=g).tolist()
    per_key = int(torch.randint(1, 4, (1,), generator=g)) * 1000
    run_cost = float(torch.randint(0, 200, (1,), generator=g)) * per_key
    monkeypatch.setattr(ma, "_leading_hidden_keys", lambda hide: skips)
    monkeypatch.setattr(ma, "RUN_COST", {torch.float32: run_cost})
    firsts = [lo + s for s in skips]

    def cost(runs):
        return sum(run_cost / per_key + (r1 - r0) * (stop - first) for r0, r1, first in runs)

    def runs_of(ends):
        starts = [0, *ends[:-1]]
        return [(r0, r1, min(firsts[r0:r1])) for r0, r1 in zip(starts, ends)]

    splits = [runs_of([*cuts, n]) for m in range(n) for cuts in itertools.combinations(range(1, n), m)]
    runs = ma._row_runs(torch.zeros(n, 1, 1, dtype=torch.bool), lo, stop, per_key)
    assert runs in splits
    least = min(cost(s) for s in splits)
    assert cost(runs) == pytest.approx(least)
    assert len(runs) == min(len(s) for s in splits if cost(s) == pytest.approx(least))


def test_the_compiled_kernel_takes_doc_ids_in_one_graph(monkeypatch):
    """The skipped key count depends on the data: under torch.compile nothing is skipped
    (no graph break, fullgraph holds), and the result is the eager one."""
    monkeypatch.setattr(ma, "BLOCK", 5)
    monkeypatch.setattr(ma, "RUN_COST", {torch.float32: 0})
    torch._dynamo.reset()
    ids = doc_ids([[7, 9, 4], [3, 17]], 20)
    q, k, v = (torch.randn(2, n, 20, 8, requires_grad=True) for n in (4, 2, 2))
    eager = matmul_attention(q, k, v, 0, ids)
    compiled = torch.compile(matmul_attention, fullgraph=True)(q, k, v, 0, ids)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_past_max_run_groups_runs_cut_only_between_groups(seed, monkeypatch):
    """Past MAX_RUN_GROUPS rows the dynamic program (B^2 / 2 Python steps a block: ~1.3 ms
    at B 128) weighs groups of adjacent rows: runs cut only at a group's edge, there are at
    most MAX_RUN_GROUPS of them, and of those splits it takes the cheapest (brute force)."""
    g = torch.Generator().manual_seed(seed)
    groups, size, lo, stop = 4, 3, 10, 74
    n = groups * size - int(torch.randint(0, 2, (1,), generator=g))  # the last group short
    skips = torch.randint(0, stop - lo, (n,), generator=g).tolist()
    per_key = 1000
    run_cost = float(torch.randint(0, 40, (1,), generator=g)) * per_key
    monkeypatch.setattr(ma, "_leading_hidden_keys", lambda hide: skips)
    monkeypatch.setattr(ma, "RUN_COST", {torch.float32: run_cost})
    monkeypatch.setattr(ma, "MAX_RUN_GROUPS", groups, raising=False)
    firsts = [lo + s for s in skips]
    edges = [*range(0, n, size), n]

    def cost(runs):
        return sum(run_cost / per_key + (r1 - r0) * (stop - first) for r0, r1, first in runs)

    def runs_of(ends):
        starts = [0, *ends[:-1]]
        return [(r0, r1, min(firsts[r0:r1])) for r0, r1 in zip(starts, ends)]

    splits = [runs_of([*cuts, n]) for m in range(groups)
              for cuts in itertools.combinations(edges[1:-1], m)]
    runs = ma._row_runs(torch.zeros(n, 1, 1, dtype=torch.bool), lo, stop, per_key)
    assert runs in splits  # cut at group edges only, each run from its rows' earliest key
    assert cost(runs) == pytest.approx(min(cost(s) for s in splits))


def test_grouped_rows_give_the_unnarrowed_result(monkeypatch):
    """With rows grouped (more rows than MAX_RUN_GROUPS), output and gradients are still the
    un-narrowed computation's (fp32, a few ulps)."""
    monkeypatch.setattr(ma, "BLOCK", 16)
    monkeypatch.setattr(ma, "RUN_COST", {torch.float32: 0})
    monkeypatch.setattr(ma, "MAX_RUN_GROUPS", 3, raising=False)
    lengths = [[1000], [1], [5, 30], [40], [3], [1000], [7, 2]]
    t, b = 70, len(lengths)
    ids = doc_ids(lengths, t)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(b, t, n, 8, generator=g).transpose(1, 2).requires_grad_()
               for n in (4, 2, 2))
    grad = torch.randn(b, 4, t, 8, generator=g)
    got, kept = _run(q, k, v, grad, 0, ids)
    with monkeypatch.context() as m:
        m.setattr(ma, "_leading_hidden_keys", lambda hide: [0] * hide.shape[0])
        ref, _ = _run(q, k, v, grad, 0, ids)
    for name, a, r in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6, msg=name)
    # groups of 3, 3 and 1 rows (2 kv heads a row): a run holds whole adjacent groups
    assert {shape[0] // 2 for shape in kept} <= {3, 1, 6, 4, 7}


def test_one_row_of_doc_ids_is_shared_by_every_batch_row():
    """A (1, T) doc_ids broadcast over the batch, as the un-narrowed mask would: with the
    skip worked out per row of doc_ids, rows past the first were left uncomputed."""
    torch.manual_seed(0)
    b, t = 3, 70
    q, k, v = (torch.randn(b, 2, t, 16) for _ in range(3))
    ids = torch.cat([torch.zeros(30), torch.ones(40)]).long()[None]
    shared = matmul_attention(q, k, v, doc_ids=ids)
    torch.testing.assert_close(shared, matmul_attention(q, k, v, doc_ids=ids.expand(b, t)),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="one row per batch row"):
        matmul_attention(q, k, v, doc_ids=ids[:, :-1])
