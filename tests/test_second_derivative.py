"""Kiln's hand-written backwards have no second derivative: a backward with create_graph=True
through them is refused by name. Before, RMSNorm's second derivative came out ~33% off and
matmul attention's as 0, without a word."""

import pytest
import torch

from kiln.model.fused_loss import linear_cross_entropy
from kiln.model.layers import RMSNorm, apply_rope, rope_tables
from kiln.model.matmul_attention import matmul_attention


def _rms(x):
    norm = RMSNorm(x.shape[-1]).double()
    return norm(x)


def _rope(x):
    cos, sin = rope_tables(x.shape[-1], x.shape[-2], 10000.0)
    return apply_rope(x, cos.double(), sin.double())


def _attention(q):
    kv = torch.randn(1, 1, q.shape[2], q.shape[3], dtype=torch.float64)
    return matmul_attention(q, kv, kv)


def _loss(h):
    weight = torch.randn(7, h.shape[-1], dtype=torch.float64)
    rows = h.reshape(-1, h.shape[-1])
    return linear_cross_entropy(rows, weight, torch.arange(rows.shape[0]) % 7)


@pytest.mark.parametrize("fn,name", [(_rms, "RMSNorm"), (_rope, "RoPE"),
                                     (_attention, "matmul attention"), (_loss, "fused LM head")])
def test_a_second_derivative_is_refused_by_name(fn, name):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    out = fn(x).pow(3).sum()
    with pytest.raises(RuntimeError, match=f"{name}.*no second derivative"):
        torch.autograd.grad(out, x, create_graph=True)


def test_first_derivatives_are_unchanged_by_the_guard():
    """The plain backward (create_graph=False) still matches an fp64 reference."""
    torch.manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    norm = RMSNorm(6).double()
    got, = torch.autograd.grad(norm(x).pow(3).sum(), x)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    want, = torch.autograd.grad(ref.pow(3).sum(), x)
    torch.testing.assert_close(got, want)
