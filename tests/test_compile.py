"""`train.compile = true` runs the model through torch.compile: the compiled step must
build and give the eager step's loss and gradients (fp32: SDPA, as on a GPU; bf16: the
matmul attention, whose eager fast path writes into views the compiler refuses; the
fused loss is plain ops under the compiler)."""

import pytest
import torch

import kiln.model.matmul_attention as ma
from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.train.precision import autocast


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("experts", [0, 4])  # dense, and MoE (grouped_mm compiles in bf16 only)
def test_compiled_model_matches_eager_loss_and_gradients(precision, experts, monkeypatch):
    monkeypatch.setattr(ma, "BLOCK", 5)  # the matmul attention in several query blocks
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16,
                      attn_kernel="matmul" if precision == "bf16" else "sdpa",
                      n_experts=experts, top_k=2, expert_hidden=32)
    model = Transformer(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17))
    device = torch.device("cpu")

    def loss_and_grads(fn):
        model.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = fn(tokens[:, :-1], targets=tokens[:, 1:])
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager_loss, eager_grads = loss_and_grads(model)
    compiled_loss, compiled_grads = loss_and_grads(torch.compile(model))
    tol = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(compiled_loss, eager_loss, **tol)
    for eager, compiled in zip(eager_grads, compiled_grads):
        torch.testing.assert_close(compiled, eager, **tol)


def test_unwrap_finds_the_model_inside_ddp_around_a_compiled_model():
    """DDP around torch.compile (train.compile under torchrun): `.module` is the compiled
    wrapper, whose truth test calls the model's __len__ and raises; checkpoints and resume
    unwrap through it."""
    from torch import nn

    from kiln.parallel.model_wrapping import unwrap

    model = Transformer(ModelConfig(vocab_size=97, dim=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                    max_seq_len=16))
    ddp_like = nn.Module()
    ddp_like.module = torch.compile(model)
    assert unwrap(ddp_like) is model


def test_train_compile_reaches_the_trained_model(tiny_run):
    """`train.compile = true` must compile what the trainer steps, not only a model a test
    compiles itself."""
    from conftest import tiny_config
    from torch._dynamo.eval_frame import OptimizedModule

    from kiln.train.trainer import Trainer

    assert isinstance(Trainer(tiny_config(tiny_run, "train.compile=true")).model, OptimizedModule)
    assert not isinstance(Trainer(tiny_config(tiny_run)).model, OptimizedModule)


def test_the_compiled_loss_does_not_run_the_hand_written_function(monkeypatch):
    """Compiled on CUDA, the fused head + loss Function gave every parameter an all-zero
    gradient (H200, torch 2.11: `train.compile = true` did not learn; CPU compiled it
    right). Under the compiler the loss is plain ops, with the fused loss's value and
    gradients."""
    from kiln.model import fused_loss

    def refuse(*args, **kwargs):
        raise AssertionError("the compiled loss ran the hand-written autograd Function")

    torch._dynamo.reset()
    torch.manual_seed(0)
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(97, 16, requires_grad=True)
    targets = torch.randint(0, 97, (40,))
    eager = fused_loss.linear_cross_entropy(hidden, weight, targets)
    eager_grads = torch.autograd.grad(eager, (hidden, weight))
    monkeypatch.setattr(fused_loss._LinearCrossEntropy, "forward", staticmethod(refuse))
    compiled = torch.compile(fused_loss.linear_cross_entropy, backend="eager", fullgraph=True)
    loss = compiled(hidden, weight, targets)
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_expert_backend_probe_is_a_constant_of_the_trace():
    """Which expert kernel runs is probed once (`grouped_mm_works`: tensors made with
    requires_grad, a backward). Traced through under the compiler, the probe broke the graph
    of every MoE layer in every compiled step; the compiler takes its answer as a constant."""
    from kiln.model.moe import RoutedExperts

    experts = RoutedExperts(16, 16, 2)

    def pick(x):
        return x * (2 if experts.resolved_backend(x) == "grouped_mm" else 3)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(pick)(torch.ones(4, 16, dtype=torch.bfloat16))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
