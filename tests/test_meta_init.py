"""A model built on the meta device and initialised where it lands (`parallel.meta_init`)
has bitwise the weights of a CPU build with the same seed (one process, DDP and FSDP2 on
2 gloo ranks; dense and MoE; tied embeddings or not), leaves the generator where the CPU
build did, and an FSDP2 rank never holds the whole model on the host while it is built.
Before, every rank built the whole fp32 model on the CPU (8 ranks of a 7B model: ~224 GB
of host memory per node) and FSDP2 then kept 1/world of it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from mp_helpers import run_function_on_ranks
from torch import nn

from kiln.config import ModelConfig, load_config
from kiln.model import Transformer
from kiln.parallel.distributed import DistEnv
from kiln.parallel.meta_init import build_on_meta, materialize
from kiln.parallel.model_wrapping import parallelize, unwrap

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
SEED = 7


def recipe_model(name: str, tied: bool) -> ModelConfig:
    """The recipe's model (trinity-tiny: MoE after a dense prefix, every Trinity option; dense-
    tiny: a Llama) with an odd vocabulary, so that FSDP2's shards of it are uneven."""
    return load_config(RECIPES / f"{name}.toml", [
        "model.vocab_size=301", "model.max_seq_len=128", f"model.tie_embeddings={str(tied).lower()}",
    ]).model


def cpu_build(cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The way every rank built the model before: on the CPU, in the constructor."""
    torch.manual_seed(SEED)
    model = Transformer(cfg)
    return model.state_dict(), torch.get_rng_state()


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v.detach().cpu()
            for k, v in unwrap(model).state_dict().items()}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    differ = [k for k in want if got[k].dtype != want[k].dtype or not torch.equal(got[k], want[k])]
    assert not differ, f"not bitwise the CPU build's: {differ[:5]}"


CASES = [("dense-tiny", True), ("dense-tiny", False), ("trinity-tiny", True),
         ("trinity-tiny", False)]


@pytest.mark.parametrize("name, tied", CASES)
def test_one_process_gets_the_cpu_builds_weights(name, tied):
    cfg = recipe_model(name, tied)
    want, rng_after = cpu_build(cfg)
    torch.manual_seed(SEED)
    model, init = build_on_meta(lambda: Transformer(cfg))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    torch.manual_seed(SEED + 1)  # draws between the build and its init do not move the weights
    model = parallelize(model, "ddp", DistEnv(), device=torch.device("cpu"), init=init)
    assert_same(full_state(model), want)
    assert torch.equal(torch.get_rng_state(), rng_after)  # later draws (data order) as before
    assert (model.head.weight is model.embed.weight) == tied


def _wrapped_on_ranks(rank: int, world: int, kind: str, name: str, tied: bool):
    cfg = recipe_model(name, tied)
    torch.manual_seed(SEED)
    model, init = build_on_meta(lambda: Transformer(cfg))
    model = parallelize(model, kind, DistEnv(rank, world, rank, launched=True),
                        device=torch.device("cpu"), init=init)
    shards = [p.to_local().numel() < p.numel() for p in model.parameters() if hasattr(p, "to_local")]
    return full_state(model), torch.get_rng_state(), shards


@pytest.mark.parametrize("kind, name, tied", [("fsdp", "trinity-tiny", False),
                                              ("fsdp", "dense-tiny", True),
                                              ("ddp", "trinity-tiny", True)])
def test_two_ranks_get_the_cpu_builds_weights(kind, name, tied):
    want, rng_after = cpu_build(recipe_model(name, tied))
    for state, rng, shards in run_function_on_ranks(_wrapped_on_ranks, 2, (kind, name, tied)):
        assert_same(state, want)
        assert torch.equal(rng, rng_after)
        assert (kind == "fsdp") == (len(shards) > 0 and all(shards))  # FSDP2: each a shard


def _peak_build_mb(build) -> tuple[float, object]:
    """Growth of this process's peak resident memory while `build()` runs (VmHWM, reset to
    the resident size first: Linux's clear_refs 5)."""
    def status(key: str) -> float:
        line = next(s for s in Path("/proc/self/status").read_text().splitlines()
                    if s.startswith(key))
        return int(line.split()[1]) / 1024

    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS:")
    kept = build()
    return status("VmHWM:") - before, kept


def _build_memory_on_ranks(rank: int, world: int) -> tuple[float, float, float]:
    torch.set_num_threads(1)
    cfg = ModelConfig(vocab_size=1000, dim=512, n_layers=12, n_heads=8, n_kv_heads=8,
                      max_seq_len=64, tie_embeddings=False)
    env = DistEnv(rank, world, rank, launched=True)
    cpu = torch.device("cpu")

    def meta_way(cfg: ModelConfig = cfg):
        torch.manual_seed(SEED)
        model, init = build_on_meta(lambda: Transformer(cfg))
        return parallelize(model, "fsdp", env, device=cpu, init=init)

    def cpu_way():  # the way before, measured alike: the bound below can be failed
        torch.manual_seed(SEED)
        return parallelize(Transformer(cfg), "fsdp", env, device=cpu)

    # first the code paths (FSDP2, the replay, lazy imports) on a small model: their pages,
    # faulted in at first use, are no part of the build (they read ~15 MB more in a fresh
    # clone's first run than in a warm checkout)
    small = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=2,
                        max_seq_len=16, tie_embeddings=False)
    meta_way(small)
    dist.barrier()
    new, kept = _peak_build_mb(meta_way)
    dist.barrier()
    old, _ = _peak_build_mb(cpu_way)
    model_mb = sum(p.numel() for p in kept.parameters()) * 4 / 2**20
    return new, old, model_mb


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
def test_an_fsdp_rank_never_holds_the_whole_model_on_the_host():
    """2 ranks: each holds half the weights, and its build adds little more (one parameter
    drawn in full at a time; the rest, ~20 MB, is FSDP2's and the allocator's whatever the
    model), where a CPU build held all of them first. ~150 MB of fp32 in 12 blocks, no
    parameter over 3 MB."""
    for new, old, model_mb in run_function_on_ranks(_build_memory_on_ranks, 2):
        print(f"rank build: {new:.0f} MB (CPU build {old:.0f} MB) for {model_mb:.0f} MB")
        assert old > 0.9 * model_mb, (old, model_mb)  # the measurement sees a whole build
        assert new < 0.5 * model_mb + 32, f"built {new:.0f} MB on a rank for a {model_mb:.0f} MB model"


def test_a_compiled_model_sharded_whole_gets_the_cpu_builds_weights_and_runs(monkeypatch):
    """train.compile with fsdp: torch.compile's wrapper is FSDP2's root unit, around the
    model whose weights are placed. One in-process gloo rank; dynamo's eager backend (the
    same ops, no compiler)."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m: real_compile(m, backend="eager"))
    cfg = recipe_model("dense-tiny", False)
    torch.manual_seed(SEED)
    reference = Transformer(cfg)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(SEED)
        model, init = build_on_meta(lambda: Transformer(cfg))
        model = parallelize(model, "fsdp", DistEnv(launched=True), compile=True,
                            device=torch.device("cpu"), init=init)
        tokens = torch.randint(0, cfg.vocab_size, (2, 9))
        with torch.no_grad():  # to rounding: dynamo's graph may order a reduction otherwise
            torch.testing.assert_close(model(tokens), reference(tokens), rtol=1e-5, atol=1e-6)
        assert_same(full_state(model), reference.state_dict())
    finally:
        dist.destroy_process_group()


class _DrawsAFreshTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))


class _WritesPartOfAParameter(nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 4)
        with torch.no_grad():
            self.weight[0].fill_(1.0)


class _KeepsItsConstructorsValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((4,), 2.0))


class _BufferOfItsWeights(nn.Linear):
    """A buffer made from a parameter is on the meta device too (no values): `materialize`
    failed copying it ("Cannot copy out of meta tensor"), after the wrapping."""
    def __init__(self) -> None:
        super().__init__(4, 4)
        self.register_buffer("col_norms", self.weight.detach().norm(dim=0))


class _AttributeOfItsWeights(nn.Module):
    """A plain tensor attribute made from a parameter stayed on the meta device unseen,
    to fail (or give meta results) only where the forward used it."""
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.inner.scale = self.inner.weight.detach().abs().mean()


class _SeedsItsOwnInit(nn.Linear):
    """The replay drew from the state the build began with, not from this seed: silently
    other weights than the CPU build's."""
    def __init__(self) -> None:
        torch.manual_seed(1234)
        super().__init__(4, 4)


@pytest.mark.parametrize("module, says", [
    (_DrawsAFreshTensor, "draws random numbers"),
    (_WritesPartOfAParameter, "part of parameter 'weight'"),
    (_KeepsItsConstructorsValue, "parameter 'scale' is not set"),
    (_BufferOfItsWeights, "'col_norms' is computed from a parameter"),
    (_AttributeOfItsWeights, "'inner.scale' is computed from a parameter"),
    (_SeedsItsOwnInit, "set the CPU generator"),
])
def test_an_init_that_cannot_be_replayed_is_refused_at_the_build(module, says):
    with pytest.raises(NotImplementedError, match=says):
        build_on_meta(module)


class _CopiesFromATensorItReuses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(2, 3))
        source = torch.ones(2, 3)
        with torch.no_grad():
            self.w.copy_(source)
        source.zero_()  # reused after the copy: the weight keeps the ones


def test_a_tensor_an_init_copies_from_is_replayed_as_it_was_then():
    """The replay copied the source as it was at the replay (zeros): silently not the CPU
    build's weights."""
    torch.manual_seed(SEED)
    want = _CopiesFromATensorItReuses().state_dict()
    torch.manual_seed(SEED)
    model, init = build_on_meta(_CopiesFromATensorItReuses)
    model = parallelize(model, "ddp", DistEnv(), device=torch.device("cpu"), init=init)
    assert_same(full_state(model), want)


def test_the_trainer_builds_on_the_meta_device_with_the_cpu_builds_weights(tiny_run,
                                                                          monkeypatch):
    """One launched gloo rank in this process, FSDP2: the model the trainer made had no
    weights on the host until they were placed, and they are the CPU build's."""
    from conftest import tiny_config

    import kiln.parallel.distributed as distributed
    from kiln.parallel.distributed import shutdown
    from kiln.train.trainer import Trainer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                       "TORCHELASTIC_RUN_ID": "test", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed, "die_with_launcher", lambda: None)  # not pytest's parent
    made_on: list[str] = []
    real_init = Transformer.__init__

    def spy(self, cfg):
        real_init(self, cfg)
        made_on.append(self.embed.weight.device.type)

    monkeypatch.setattr(Transformer, "__init__", spy)
    cfg = tiny_config(tiny_run, "train.parallel=fsdp", "model.tie_embeddings=false")
    trainer = Trainer(cfg, resume=False)
    try:
        got = full_state(trainer.model)
    finally:
        shutdown(trainer.env)
    assert made_on and set(made_on) == {"meta"}  # (memory_fit counts on a meta build too)
    monkeypatch.setattr(Transformer, "__init__", real_init)
    torch.manual_seed(cfg.run.seed)
    assert_same(got, Transformer(trainer.model_cfg).state_dict())


def test_a_meta_parameter_added_after_the_build_is_refused_by_materialize():
    """A parameter with no recorded init got to_empty's memory, whatever it held, and was
    trained as weights without a word."""
    model, init = build_on_meta(lambda: nn.Linear(4, 4))
    model.extra = nn.Parameter(torch.empty(3, device="meta"))
    with pytest.raises(RuntimeError, match="parameter 'extra' is on the meta device with no "
                                           "recorded init"):
        materialize(model, init, torch.device("cpu"))


def test_a_parameter_given_values_after_the_build_keeps_them_through_materialize():
    """One added with values (not on the meta device) has no init to replay: it keeps them,
    as buffers do (to_empty dropped them); a new name of a planned parameter is no new one."""
    torch.manual_seed(SEED)
    want = nn.Linear(4, 4).state_dict()
    torch.manual_seed(SEED)
    model, init = build_on_meta(lambda: nn.Linear(4, 4))
    model.extra = nn.Parameter(torch.arange(1.0, 6.0))
    model.register_parameter("same_weight", model.weight)
    materialize(model, init, torch.device("cpu"))
    assert torch.equal(model.extra, torch.arange(1.0, 6.0))
    assert model.same_weight is model.weight
    assert_same({k: model.state_dict()[k] for k in want}, want)
