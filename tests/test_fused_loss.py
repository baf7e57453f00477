"""The fused head + cross-entropy against the plain F.linear + F.cross_entropy path."""

import pytest
import torch
import torch.nn.functional as F

import kiln.model.fused_loss as fl
from kiln.model.fused_loss import linear_cross_entropy


def _reference(h, w, y):
    return F.cross_entropy(F.linear(h, w).float(), y, reduction="sum")


def _grads(fn, h, w, y, scale):
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = fn(h, w, y)
    (loss * scale).backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk, group_bytes", [(7, 1 << 30), (7, 7 * 13 * 8), (64, 1 << 30)])
def test_fp32_loss_and_gradients_match_reference(monkeypatch, chunk, group_bytes):
    monkeypatch.setattr(fl, "GROUP_BYTES", group_bytes)  # small: several groups accumulate dW
    torch.manual_seed(0)
    h, w = torch.randn(45, 16), torch.randn(13, 16)
    y = torch.randint(0, 13, (45,))
    got = _grads(lambda a, b, c: linear_cross_entropy(a, b, c, chunk=chunk), h, w, y, 0.37)
    ref = _grads(_reference, h, w, y, 0.37)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bf16_autocast_is_as_close_to_fp64_as_the_plain_autocast_path():
    torch.manual_seed(0)
    h, w = torch.randn(300, 64) * 0.5, torch.randn(500, 64) * 0.2
    y = torch.randint(0, 500, (300,))
    exact = _grads(_reference, h.double(), w.double(), y, 1 / 300)

    def under_autocast(fn):
        def run(a, b, c):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(a, b, c)
        return run

    fused = _grads(under_autocast(lambda a, b, c: linear_cross_entropy(a, b, c, chunk=64)),
                   h, w, y, 1 / 300)
    plain = _grads(under_autocast(_reference), h, w, y, 1 / 300)
    for f, p, e in zip(fused, plain, exact):
        err_fused = ((f.double() - e).norm() / e.norm()).item()
        err_plain = ((p.double() - e).norm() / e.norm()).item()
        assert err_fused < 1.5 * err_plain + 1e-6, (err_fused, err_plain)
        assert err_fused < 2e-2
    assert fused[2].dtype == torch.float32  # the grad reaches the fp32 weight in fp32


def test_no_grad_path_gives_the_same_loss_and_keeps_no_buffers():
    torch.manual_seed(0)
    h, w = torch.randn(40, 8), torch.randn(11, 8, requires_grad=True)
    y = torch.randint(0, 11, (40,))
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, y, chunk=16)
    torch.testing.assert_close(loss, _reference(h, w, y).detach())
    assert not loss.requires_grad


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="must be"):
        linear_cross_entropy(torch.randn(4, 8), torch.randn(5, 7), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one row"):
        linear_cross_entropy(torch.randn(0, 8), torch.randn(5, 8), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(torch.randn(4, 8), torch.randn(5, 8), torch.zeros(3, dtype=torch.long))


def test_fp64_inputs_stay_fp64(monkeypatch):
    """An fp64 model's loss is fp64 throughout (its softmax and dW accumulation too): equal
    to F.cross_entropy in fp64 to 1e-12, over several groups and chunks."""
    monkeypatch.setattr(fl, "GROUP_BYTES", 32 * 37 * 8)  # groups of 32 rows: dW accumulates
    torch.manual_seed(0)
    h = torch.randn(70, 16, dtype=torch.double, requires_grad=True)
    w = torch.randn(37, 16, dtype=torch.double, requires_grad=True)
    y = torch.randint(0, 37, (70,))
    loss = linear_cross_entropy(h, w, y, chunk=16)
    assert loss.dtype == torch.double
    loss.backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = F.cross_entropy(h2 @ w2.T, y, reduction="sum")
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(h.grad, h2.grad, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(w.grad, w2.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_target_whose_probability_underflows_still_gets_its_exact_loss(dtype):
    """Logits 150 apart: the target's softmax probability, exp(-150), is 0 in fp32, yet its
    loss is the finite 150 (from the largest logit and log S, not from log p_y), and
    the gradient is the plain one."""
    h = torch.eye(4)[:3] * 10.0  # three rows picking columns of w
    w = torch.zeros(6, 4)
    w[0, 0], w[1, 1], w[2, 2] = 15.0, -5.0, 3.0  # logits: row 0 (150, 0, ...), row 1 (0, -50, ...)
    y = torch.tensor([1, 0, 2])
    exact = _grads(_reference, h.double(), w.double(), y, 1.0)
    got = _grads(lambda a, b, c: linear_cross_entropy(a.to(dtype), b.to(dtype), c, chunk=2),
                 h, w, y, 1.0)
    assert torch.isfinite(got[0]) and abs(float(got[0]) - float(exact[0])) < 1e-3 * float(exact[0])
    assert float(got[0]) > 150
    for g, e in zip(got[1:], exact[1:]):
        torch.testing.assert_close(g.double(), e, atol=0.02, rtol=0.02)


@pytest.mark.parametrize("n", [255, 300, 1000])
def test_the_upstream_gradient_scales_in_fp32_under_bf16_autocast(n):
    """The mean's 1/N reaches the stored bf16 gradients in fp32. Rounded to bf16 first, it
    scaled every gradient by one common factor bf16(1/N) N: +0.36% at N = 255, -0.20% at
    300 on average here (the plain autocast path scales the fp32 softmax gradient)."""
    torch.manual_seed(0)
    h, w = torch.randn(256, 64) * 0.5, torch.randn(500, 64) * 0.2
    y = torch.randint(0, 500, (256,))

    def grads(scale: float):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _grads(linear_cross_entropy, h, w, y, scale)[1:]

    for one, scaled in zip(grads(1.0), grads(1 / n), strict=True):
        assert scaled.dtype == torch.float32  # reaches the fp32 leaves in fp32
        mask = one != 0
        ratio = scaled.double()[mask] / (one.double()[mask] / n)
        assert (ratio - 1).abs().max().item() <= 2 ** -8 + 1e-9  # one bf16 rounding each
        assert abs((ratio - 1).mean().item()) < 2 ** -9


def test_a_second_backward_gives_the_same_gradients():
    """Scaling must not change the stored gradients in place (retain_graph)."""
    torch.manual_seed(0)
    h = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    y = torch.randint(0, 11, (20,))
    loss = linear_cross_entropy(h, w, y) / 20
    first = torch.autograd.grad(loss, (h, w), retain_graph=True)
    second = torch.autograd.grad(loss, (h, w))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
