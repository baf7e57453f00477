"""Kiln's RMSNorm (hand-written backward) against F.rms_norm in fp64."""

import torch
import torch.nn.functional as F

from kiln.model.layers import RMSNorm


def _grads(norm_fn, x, w, g):
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    out = norm_fn(x, w)
    out.backward(g.to(out.dtype))
    return out.detach(), x.grad, w.grad


def test_values_and_gradients_match_fp64_reference():
    torch.manual_seed(0)
    x, g = torch.randn(3, 5, 32) * 3, torch.randn(3, 5, 32)
    w = 1 + 0.3 * torch.randn(32)
    norm = RMSNorm(32, eps=1e-5)

    def ref(a, b):
        return F.rms_norm(a, (32,), b, 1e-5)

    got = _grads(lambda a, b: torch.func.functional_call(norm, {"weight": b}, (a,)), x, w, g)
    exact = _grads(ref, x.double(), w.double(), g.double())
    for a, e in zip(got, exact):
        torch.testing.assert_close(a.double(), e, atol=1e-5, rtol=1e-5)


def test_bf16_input_gets_fp32_statistics_and_bf16_output_and_grad():
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * 1e-3).bfloat16().requires_grad_()
    norm = RMSNorm(64)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    # statistics in fp32, one rounding to bf16 at the end: bit for bit what fp32 math gives
    # (bf16 statistics differ in ~40% of the outputs)
    ref = F.rms_norm(x.detach().float(), (64,), eps=1e-5).bfloat16()
    assert torch.equal(y, ref)
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()


def test_bf16_gradients_match_fp64_reference_with_a_non_unit_gain():
    """A bf16 upstream gradient takes the backward's own fp32 copy (the branch every bf16
    training step runs); with a gain other than 1 both gradients must still be those of
    F.rms_norm in fp64, to bf16 rounding (dropping the gain from dx is a ~30% error)."""
    torch.manual_seed(0)
    x = (torch.randn(6, 64) * 2).bfloat16()
    g = torch.randn(6, 64).bfloat16()
    w = 1 + 0.3 * torch.randn(64)
    norm = RMSNorm(64)
    got = _grads(lambda a, b: torch.func.functional_call(norm, {"weight": b}, (a,)), x, w, g)
    assert got[0].dtype == got[1].dtype == torch.bfloat16 and got[2].dtype == torch.float32
    exact = _grads(lambda a, b: F.rms_norm(a, (64,), b, 1e-5), x.double(), w.double(), g.double())
    for a, e in zip(got, exact):
        torch.testing.assert_close(a.double(), e, atol=1e-2, rtol=1e-2)


def test_autocast_output_is_the_compute_dtype():
    norm = RMSNorm(16)
    x = torch.randn(2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(x).dtype == torch.bfloat16
    assert norm(x).dtype == torch.float32


def test_fp64_module_keeps_fp64_precision_and_passes_gradcheck():
    """fp32 statistics are for bf16/fp32 inputs; an fp64 model (gradient checks, reference
    runs) computes in fp64 throughout."""
    torch.manual_seed(0)
    x, g = torch.randn(3, 5, 32, dtype=torch.double), torch.randn(3, 5, 32, dtype=torch.double)
    w = 1 + 0.3 * torch.randn(32, dtype=torch.double)
    norm = RMSNorm(32, eps=1e-5).double()
    call = lambda a, b: torch.func.functional_call(norm, {"weight": b}, (a,))  # noqa: E731
    got = _grads(call, x, w, g)
    exact = _grads(lambda a, b: F.rms_norm(a, (32,), b, 1e-5), x, w, g)
    for a, e in zip(got, exact):
        assert a.dtype == torch.double
        torch.testing.assert_close(a, e, atol=1e-12, rtol=1e-12)
    small = (torch.randn(2, 8, dtype=torch.double, requires_grad=True),
             (1 + 0.3 * torch.randn(8, dtype=torch.double)).requires_grad_())
    norm8 = RMSNorm(8).double()
    assert torch.autograd.gradcheck(
        lambda a, b: torch.func.functional_call(norm8, {"weight": b}, (a,)), small)


def test_compiled_plain_path_matches_fp64_reference():
    """Under torch.compile RMSNorm is plain ops (the compiler fuses them; the hand-written
    backward would stay unfused): the same values and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, g = torch.randn(3, 5, 32) * 3, torch.randn(3, 5, 32)
    w = 1 + 0.3 * torch.randn(32)
    norm = RMSNorm(32, eps=1e-5)
    compiled = torch.compile(lambda a, b: torch.func.functional_call(norm, {"weight": b}, (a,)))
    got = _grads(compiled, x, w, g)
    exact = _grads(lambda a, b: F.rms_norm(a, (32,), b, 1e-5), x.double(), w.double(), g.double())
    for a, e in zip(got, exact):
        torch.testing.assert_close(a.double(), e, atol=1e-5, rtol=1e-5)
