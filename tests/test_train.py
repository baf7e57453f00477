"""Training invariants: accumulation invariance, exact resume, atomic checkpoints."""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import as_before_checksums, as_written, tiny_config

from kiln.errors import CheckpointError, ConfigError, TrainingDiverged
from kiln.report import read_metrics
from kiln.train import checkpoint as ckpt_mod
from kiln.train.checkpoint import load_checkpoint
from kiln.train.checkpoint_dirs import checkpoint_step, latest_checkpoint
from kiln.train.trainer import Trainer


def train_losses(run_dir, *extra, callbacks=None):
    trainer = Trainer(tiny_config(run_dir, *extra), callbacks=callbacks)
    return trainer, trainer.fit()


def stopped_after(step: int) -> list:
    """The default callbacks and one that "kills" the run right after step `step` (and its
    checkpoint, when one falls there)."""
    from kiln.train.callbacks import Callback, default_callbacks

    class StopAt(Callback):
        def on_step_end(self, t, record):
            if t.step == step:
                raise KeyboardInterrupt

    return [*default_callbacks(), StopAt()]


def logged_losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == "train"}


def test_loss_decreases_and_run_dir_is_complete(tiny_run):
    trainer, losses = train_losses(tiny_run, "train.steps=30", "optim.lr=1e-2")
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5
    for name in ("config.toml", "env.json", "model.json", "metrics.jsonl", "checkpoints/latest"):
        assert (tiny_run / name).exists(), name
    env = json.loads((tiny_run / "env.json").read_text())
    assert env["versions"]["torch"] and env["git_hash"]
    vals = [r for r in read_metrics(tiny_run / "metrics.jsonl") if r["kind"] == "val"]
    assert [v["step"] for v in vals] == [6, 12, 18, 24, 30] and vals[-1]["val_bpb"] > 0


def _first_step_gradients(trainer: Trainer) -> list[torch.Tensor]:
    """Filled with the gradients the optimizer's first step meets (summed over micro-batches,
    clipped)."""
    grads: list[torch.Tensor] = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        if not grads:
            grads.extend(p.grad.detach().clone() for p in trainer.model.parameters())
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    return grads


def test_micro_batch_times_accumulation_invariance(tiny_run, tmp_path):
    """One micro-batch of 8 and four of 2 give the same gradient (to fp32 rounding: ~7e-7 of
    each tensor's largest element measured), so the same losses and weights. The weights are
    compared in units of the peak learning rate: AdamW divides by sqrt(v), so an element
    whose gradient is near zero turns its rounding into a visible part of a step (up to 0.4%
    of one measured, on the stdlib corpus of Python 3.13; elementwise 1e-4 failed there)."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    a = Trainer(tiny_config(tiny_run, "train.micro_batch=8", "train.steps=6"))
    b = Trainer(tiny_config(other, "train.micro_batch=2", "train.steps=6"))
    ga, gb = _first_step_gradients(a), _first_step_gradients(b)
    la, lb = a.fit(), b.fit()
    assert a.accum_steps == 1 and b.accum_steps == 4
    assert len(ga) == len(list(a.model.parameters())) > 0
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5 * y.abs().max().item())
    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=1e-5, atol=1e-5)
    lr = a.cfg.optim.lr
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert (pa - pb).abs().max().item() <= 0.01 * lr
    # periodic validation measures the same windows whatever the (memory-only) micro-batch
    va, vb = ([r["val_loss"] for r in read_metrics(d / "metrics.jsonl") if r["kind"] == "val"]
              for d in (tiny_run, other))
    assert len(va) == 1 and va == pytest.approx(vb, rel=1e-5)


@pytest.mark.parametrize(("global_batch", "micro", "world", "expected"), [
    (16, 16, 1, 16), (16, 16, 2, 8), (16, 4, 2, 4), (24, 16, 2, 12), (24, 5, 2, 4), (8, 16, 4, 2),
    (16, 5, 1, 4), (4, 8, 1, 4),  # one process follows the same rule
])
def test_micro_batch_fits_each_ranks_share(global_batch, micro, world, expected):
    from kiln.train.train_setup import fit_micro_batch

    assert fit_micro_batch(global_batch, micro, world) == expected


class _CountedInt(int):
    """A batch size whose every `%` is counted (its `//` stays one): the divisor search's
    work, which a wall clock would measure only loosely."""

    mods = 0

    def __floordiv__(self, other):
        return _CountedInt(int(self) // other)

    def __mod__(self, other):
        type(self).mods += 1
        if type(self).mods > 3_000_000:
            raise AssertionError("the micro-batch search tried over 3,000,000 divisors")
        return int(self) % other


@pytest.mark.parametrize(("global_batch", "micro", "expected"), [
    (10**12, 10**12 - 1, 5 * 10**11), (2 * 999_983**2, 10**12, 999_983**2),
    (2 * 999_983**2, 999_983 * 3, 999_983 * 2), (2 * 999_983**2, 999_982, 2),
    (10**12, 10**12, 10**12)])
def test_a_huge_micro_batch_is_fitted_without_trying_every_size_below_it(global_batch, micro,
                                                                         expected):
    """`--set train.global_batch=1000000000 --set train.micro_batch=1000000000` tried every
    size from 1 up before anything was said: minutes of silence, where the memory check
    (or the allocation) refuses it at once. The search takes at most about the square root."""
    from kiln.train.train_setup import fit_micro_batch

    _CountedInt.mods = 0
    assert fit_micro_batch(_CountedInt(global_batch), micro, 1) == expected


def test_the_fitted_micro_batch_is_the_largest_share_divisor_up_to_micro_batch():
    from kiln.train.train_setup import fit_micro_batch

    for share in range(1, 150):
        for micro in range(1, 160):
            best = max(m for m in range(1, min(micro, share) + 1) if share % m == 0)
            assert fit_micro_batch(share * 2, micro, 2) == best, (share, micro)


def test_global_batch_that_ranks_cannot_share_is_refused():
    from kiln.config import ConfigError
    from kiln.train.train_setup import fit_micro_batch

    with pytest.raises(ConfigError, match="divisible by the number of ranks"):
        fit_micro_batch(16, 16, 3)


def test_resume_with_nothing_to_train_leaves_the_run_alone(tiny_run):
    train_losses(tiny_run, "train.steps=6")
    recorded = (tiny_run / "config.toml").read_text()
    trainer, losses = train_losses(tiny_run, "train.steps=3")
    assert losses == [] and trainer.step == 6
    assert (tiny_run / "config.toml").read_text() == recorded


def progress_log_driver(steps: int, log_every: int):
    """A ProgressLog on a stand-in trainer; returns (log, one-step function, logged records)."""
    from types import SimpleNamespace

    from kiln.train import callbacks

    logged = []
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(steps=steps, log_every=log_every)), step=0,
        tokens_seen=0, env=SimpleNamespace(is_main=False), log=logged.append, elapsed=lambda: 0)
    progress = callbacks.ProgressLog()
    progress.on_train_start(trainer)

    def step(loss: float, during=lambda: None) -> None:
        progress.on_step_start(trainer)
        during()
        trainer.step += 1
        progress.on_step_end(trainer, {"loss": loss, "lr": 0.1, "grad_norm": 1.0,
                                       "step_tokens": 100})

    return progress, step, logged


def test_throughput_window_leaves_out_validation_and_checkpoint_time(monkeypatch):
    """tokens/s counts only steps: the time callbacks spend after a logged step (validation,
    checkpoint) is not charged to the next window. Driven by a fake clock."""
    from kiln.train import callbacks

    clock = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])
    _, step, logged = progress_log_driver(steps=10, log_every=1)

    def the_step():
        clock[0] += 2.0

    for _ in range(2):
        step(1.0, during=the_step)
        clock[0] += 30.0  # validation and a checkpoint
    assert [r["tokens_per_s"] for r in logged] == [50.0, 50.0]


def test_throughput_window_leaves_out_validation_between_logged_steps(monkeypatch):
    """eval_every need not be a multiple of log_every: a slow validation after step 2 of a
    4-step window is not charged to that window's tokens/s either."""
    from kiln.train import callbacks

    clock = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])
    _, step, logged = progress_log_driver(steps=10, log_every=4)

    def the_step():
        clock[0] += 2.0

    for n in range(1, 5):
        step(1.0, during=the_step)
        if n == 2:
            clock[0] += 30.0  # a slow validation (train.eval_every = 2)
    assert [r["tokens_per_s"] for r in logged] == [50.0]


def test_logged_loss_is_the_mean_of_the_window():
    """A train record's loss averages every step since the last record, not only the last."""
    _, step, logged = progress_log_driver(steps=7, log_every=3)
    for loss in (6.0, 3.0, 3.0, 2.0, 1.0, 0.0, 5.0):
        step(loss)
    assert [(r["step"], r["loss"], r["loss_steps"]) for r in logged] == [
        (3, 4.0, 3), (6, 1.0, 3), (7, 5.0, 1)]


def test_in_process_resume_is_bitwise(tiny_run, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    _, straight = train_losses(tiny_run)
    with pytest.raises(KeyboardInterrupt):  # "killed" right after the step-6 checkpoint
        train_losses(other, callbacks=stopped_after(6))
    _, resumed = train_losses(other)
    assert len(resumed) == 6
    assert resumed == straight[6:]  # bitwise: same floats


def test_kill_at_random_step_and_resume_is_bitwise(tiny_run, tmp_path):
    """SIGKILL a real `kiln train` process at a random step, resume, compare every loss."""
    import shutil

    reference = tmp_path / "reference"
    shutil.copytree(tiny_run, reference)
    args = ["--set", "train.checkpoint_every=1", "--set", "train.steps=16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "kiln.cli", "train", str(reference), *args]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    expected = logged_losses(reference)
    assert len(expected) == 16

    kill_after = random.Random().randint(2, 12)
    proc = subprocess.Popen([*cmd[:4], str(tiny_run), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tiny_run / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(logged_losses(tiny_run)) >= kill_after:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(logged_losses(tiny_run)) < 16, "the run finished before it could be killed"
    subprocess.run([*cmd[:4], str(tiny_run), *args], check=True, env=env, capture_output=True,
                   timeout=300)
    assert logged_losses(tiny_run) == expected, f"killed after step {kill_after}"


def test_interrupted_checkpoint_write_leaves_previous_loadable(tiny_run, monkeypatch):
    trainer, _ = train_losses(tiny_run, "train.steps=6")
    good = latest_checkpoint(tiny_run / "checkpoints")
    assert good.name.endswith("6")

    real_save = torch.save

    def crash_midway(obj, path, *a, **k):
        real_save(obj, path, *a, **k)
        if str(getattr(path, "name", path)).endswith("optimizer.pt"):  # a path or a file
            raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt_mod.torch, "save", crash_midway)
    trainer.step = 9
    # one clear error (a full disk fails inside torch.save as OSError or RuntimeError)
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*step_00000009.*disk full "
                       r"\(simulated\).*the last checkpoint, step_00000006, is intact"):
        ckpt_mod.save_checkpoint(tiny_run / "checkpoints", 9, trainer.model, trainer.optimizer,
                                 trainer.state_dict(), trainer.env)
    monkeypatch.undo()
    assert latest_checkpoint(tiny_run / "checkpoints") == good
    assert not (tiny_run / "checkpoints" / "step_00000009").exists()
    fresh = Trainer(tiny_config(tiny_run, "train.steps=6"), resume=False)
    state = load_checkpoint(good, fresh.model, fresh.optimizer)
    assert state["step"] == 6
    for p, q in zip(fresh.model.parameters(), trainer.model.parameters()):
        assert torch.equal(p, q)


def test_checkpoint_never_unpickles(tiny_run, monkeypatch):
    train_losses(tiny_run, "train.steps=6")
    path = latest_checkpoint(tiny_run / "checkpoints")
    calls = []
    real_load = torch.load
    monkeypatch.setattr(ckpt_mod.torch, "load",
                        lambda *a, **k: calls.append(k.get("weights_only")) or real_load(*a, **k))
    fresh = Trainer(tiny_config(tiny_run), resume=False)
    load_checkpoint(path, fresh.model, fresh.optimizer)
    assert calls and all(c is True for c in calls)


@pytest.mark.parametrize("keep", [True, False])
def test_trainer_keeps_host_memory_only_when_configured(tiny_run, monkeypatch, keep):
    import kiln.train.trainer as trainer_module

    calls = []
    monkeypatch.setattr(trainer_module, "keep_freed_memory", lambda: calls.append(1) or True)
    Trainer(tiny_config(tiny_run, f"train.keep_host_memory={str(keep).lower()}"), resume=False)
    assert calls == ([1] if keep else [])


def test_fsdp_asked_of_one_process_is_noted(tiny_run, capsys):
    """`kiln train RUN --set train.parallel=fsdp` without torchrun trained unwrapped, with
    no word that the setting did nothing."""
    Trainer(tiny_config(tiny_run, "train.parallel=fsdp"), resume=False)
    assert "note: train.parallel = 'fsdp' applies under torchrun" in capsys.readouterr().err
    Trainer(tiny_config(tiny_run), resume=False)  # the default, ddp: nothing to say
    assert "train.parallel" not in capsys.readouterr().err


def test_checkpoint_for_another_model_is_refused_by_name(tiny_run):
    train_losses(tiny_run, "train.steps=6")
    path = latest_checkpoint(tiny_run / "checkpoints")
    deeper = Trainer(tiny_config(tiny_run, "model.n_layers=3"), resume=False)
    with pytest.raises(CheckpointError, match="missing layers.2"):
        load_checkpoint(path, deeper.model, deeper.optimizer)
    wider = Trainer(tiny_config(tiny_run, "model.dim=128"), resume=False)
    with pytest.raises(CheckpointError, match=r"embed.weight: \(\d+, 64\) in the checkpoint"):
        load_checkpoint(path, wider.model)


@pytest.mark.parametrize("checksums", [True, False])
def test_damaged_checkpoint_names_the_previous_one(tiny_run, checksums):
    """Cut short: the checksum refuses it, and without one (an older checkpoint) safetensors."""
    train_losses(tiny_run, "train.steps=12")  # checkpoints at 6 and 12
    latest = latest_checkpoint(tiny_run / "checkpoints")
    with open(latest / "model.safetensors", "r+b") as f:
        f.truncate(100)
    if not checksums:
        as_before_checksums(latest)
    with pytest.raises(CheckpointError, match="unreadable.*previous one, step_00000006"):
        Trainer(tiny_config(tiny_run))


def test_resume_with_another_seq_len_is_a_clear_error(tiny_run):
    train_losses(tiny_run, "train.steps=6")
    with pytest.raises(CheckpointError, match="seq_len"):
        Trainer(tiny_config(tiny_run, "train.seq_len=16"))


def test_kiln_run_names_another_seq_len_before_its_data_stages(tiny_run):
    """`kiln run --set train.seq_len=...` on a trained run went through every data stage
    (hours on a large corpus) and then failed in the loader with 'loader state has
    seq_len=...', listing three possible causes; it is refused first, naming the key."""
    from kiln.commands.early_refusals import refuse_new_model_design

    train_losses(tiny_run, "train.steps=6")
    seq_len = tiny_config(tiny_run).train.seq_len
    with pytest.raises(CheckpointError, match=f"trained with other settings \\(train.seq_len: "
                                              f"{seq_len} -> 16\\)"):
        refuse_new_model_design(tiny_config(tiny_run, "train.seq_len=16"))


def test_val_split_shorter_than_a_window_fails_before_training(tiny_run):
    from kiln.config import ConfigError

    with pytest.raises(ConfigError, match="val split has .* fewer than one window"):
        Trainer(tiny_config(tiny_run, "train.seq_len=20000", "model.max_seq_len=20000"))
    assert not (tiny_run / "checkpoints").exists()


def test_resume_with_changed_training_settings_says_so(tiny_run, capsys):
    train_losses(tiny_run, "train.steps=6")
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, "train.steps=6", "optim.lr=0.01"))
    err = capsys.readouterr().err
    assert "resumed from" in err and "optim.lr: 0.003 -> 0.01" in err
    Trainer(tiny_config(tiny_run, "train.steps=6"))  # the same settings: nothing to say
    assert "settings changed" not in capsys.readouterr().err


def test_resume_with_changed_moe_losses_says_so(tiny_run, capsys):
    """The MoE losses and balancing may change on resume (Trinity Large added its z-loss
    mid-run); like another lr, the change is said, not applied silently, and an init-only
    setting is said to do nothing."""
    moe = ("train.steps=4", "model.n_experts=4", "model.top_k=2", "model.expert_hidden=16")
    train_losses(tiny_run, *moe)
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, *moe, "model.z_loss_coef=1e-4", "model.balance_rate=1e-3",
                        "model.router_init_std=0.0"))
    err = capsys.readouterr().err
    assert "resumed from" in err and "model.z_loss_coef: 0.0 -> 0.0001" in err
    assert "model.balance_rate: 0.0005 -> 0.001" in err
    assert ("model.router_init_std: 0.02 -> 0.0 (initial weights only: no effect on a "
            "resumed model)") in err
    Trainer(tiny_config(tiny_run, *moe))  # the recorded settings: nothing to say
    assert "settings changed" not in capsys.readouterr().err


def test_resume_with_more_steps_states_the_lr_jump(tiny_run, tmp_path, capsys):
    """A cosine schedule stretched to more steps raises the lr at the resume step; the note
    gives both values. A wsd run extended in its stable phase keeps its lr: no jump said."""
    from kiln.train.schedule import lr_multiplier

    train_losses(tiny_run, "train.steps=6", "schedule.warmup_steps=2")
    capsys.readouterr()
    t = Trainer(tiny_config(tiny_run, "train.steps=12", "schedule.warmup_steps=2"))
    err = capsys.readouterr().err
    before = 0.003 * lr_multiplier(6, 6, t.cfg.schedule)
    now = 0.003 * lr_multiplier(6, 12, t.cfg.schedule)
    assert now > 2 * before
    # the lr of the first step trained after the resume, logged as step 7 (the note said
    # "step 6", the checkpoint's, which was trained at the recorded lr)
    assert (f"the lr at step 7, the first trained, is {now:.3g} where the recorded settings "
            f"had {before:.3g}") in err
    t.fit()
    logged = {r["step"]: r["lr"] for r in read_metrics(tiny_run / "metrics.jsonl")
              if r["kind"] == "train"}
    assert logged[7] == pytest.approx(now)

    import shutil

    from kiln.train.callbacks import Callback, default_callbacks

    class StopAt(Callback):
        def on_step_end(self, t, record):
            if t.step == 6:
                raise KeyboardInterrupt

    wsd_run = tmp_path / "wsd"
    shutil.copytree(tiny_run, wsd_run, ignore=shutil.ignore_patterns("checkpoints", "*.jsonl"))
    wsd = ("schedule.name=wsd", "schedule.warmup_steps=2", "schedule.decay_fraction=0.2")
    with pytest.raises(KeyboardInterrupt):
        train_losses(wsd_run, "train.steps=10", *wsd, callbacks=[*default_callbacks(), StopAt()])
    capsys.readouterr()
    Trainer(tiny_config(wsd_run, "train.steps=20", *wsd))
    err = capsys.readouterr().err
    assert "train.steps: 10 -> 20" in err and "lr at step" not in err


def test_a_killed_write_left_behind_is_cleared_by_the_next_save(tiny_run):
    """Half-written folders of dead writers go (today's `.step_N.tmp-PID`, and an older
    Kiln's `.tmp-step_N-PID`); a live writer's is left to it."""
    root = tiny_run / "checkpoints"
    stale = [root / ".tmp-step_00000003-99999999", root / ".step_00000003.tmp-99999999"]
    live = root / f".step_00000004.tmp-{os.getppid()}"
    for folder in (*stale, live):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half")
    train_losses(tiny_run, "train.steps=6")
    assert not any(p.exists() for p in stale) and live.exists()
    assert latest_checkpoint(root).name == "step_00000006"


def test_a_replaced_checkpoint_moved_aside_by_a_killed_writer_comes_back(tiny_run):
    """A re-saved step moves its old copy aside, then renames the new one in; a writer
    killed between the two leaves `.step_N.old-PID`: the next save puts it back."""
    train_losses(tiny_run, "train.keep_checkpoints=0")  # steps 6 and 12
    root = tiny_run / "checkpoints"
    (root / "step_00000006").rename(root / ".step_00000006.old-99999999")
    _, resumed = train_losses(tiny_run, "train.keep_checkpoints=0", "train.steps=15")
    assert len(resumed) == 3  # from step 12
    assert (root / "step_00000006" / "trainer.pt").exists()
    assert not list(root.glob(".step_*"))


def test_a_record_after_a_torn_last_line_starts_on_its_own_line(tmp_path):
    """A run killed mid-write leaves a last line without its newline; the resumed run's first
    record must not be glued to it (and lost with it)."""
    from kiln.train.callbacks import append_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1, "loss": 4.0}\n{"kind": "val", "step": 2, "va')
    append_jsonl(path, {"kind": "train", "step": 3, "loss": 3.0})
    append_jsonl(path, {"kind": "train", "step": 4, "loss": 2.0})
    assert [r["step"] for r in read_metrics(path)] == [1, 3, 4]
    append_jsonl(tmp_path / "new.jsonl", {"kind": "train", "step": 1, "loss": 1.0})
    assert (tmp_path / "new.jsonl").read_text() == '{"kind": "train", "step": 1, "loss": 1.0}\n'


@pytest.mark.parametrize("texts,expect", [
    # one long and one short document: the held-out fallback puts the long one in val
    (["x = 1\n" * 3000, "notes."], "train split has .* whole document .* run.seed"),
    (["x = 1\n" * 3000], "val split has .* holds 1 document"),
])
def test_a_split_too_short_to_train_is_refused_with_what_to_do(tmp_path, texts, expect):
    from datatrove.data import Document

    from kiln.config import ConfigError
    from kiln.data.shards import write_shards
    from kiln.data.tokenizer import train_tokenizer

    tok = train_tokenizer(texts, 300, tmp_path / "tokenizer" / "tokenizer.json",
                          show_progress=False)
    docs = [Document(text=t, id=f"d{i}") for i, t in enumerate(texts)]
    index = write_shards(docs, tok, tmp_path / "tokens", val_fraction=0.01, progress=False)
    assert index["val"]["documents"] == (1 if len(texts) == 2 else 0)
    with pytest.raises(ConfigError, match=expect):
        Trainer(tiny_config(tmp_path))
    assert not (tmp_path / "checkpoints").exists()


def test_a_checkpoint_moved_aside_is_neither_resumed_nor_pruned(tiny_run):
    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3", "train.keep_checkpoints=2")
    ckpts = tiny_run / "checkpoints"
    (ckpts / "step_00000006").rename(ckpts / "step_00000099.bad")
    (ckpts / "latest").write_text("step_00000099.bad\n")
    assert latest_checkpoint(ckpts).name == "step_00000003"  # the newest complete one
    train_losses(tiny_run, "train.steps=9", "train.checkpoint_every=3", "train.keep_checkpoints=1")
    assert (ckpts / "step_00000099.bad").is_dir()  # the user's folder is kept
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000009", "step_00000099.bad"]
    # with no complete checkpoint left, the pointer says a run was here: no silent restart
    (ckpts / "step_00000009").rename(ckpts / "step_00000009.bad")
    with pytest.raises(CheckpointError, match="no complete checkpoint is left .* --fresh"):
        train_losses(tiny_run, "train.steps=9")


def test_a_run_stopped_before_its_first_checkpoint_starts_over_with_its_outputs_archived(
        tiny_run, capsys):
    """No checkpoint, but an earlier run's metrics.jsonl (stopped before its first
    checkpoint, or its checkpoints moved away): `kiln train` / `kiln run` again start at
    step 0, as the Ctrl-C message says, and the old records move to archive/ instead of
    mixing with the new run's in its report."""
    import shutil

    _, first = train_losses(tiny_run, "train.steps=6")
    old_metrics = (tiny_run / "metrics.jsonl").read_text()
    shutil.rmtree(tiny_run / "checkpoints")
    (tiny_run / "report.html").write_text("<html>")  # `kiln run` reports a run that diverged early
    _, again = train_losses(tiny_run, "train.steps=6")
    assert again == first  # the same run from step 0
    assert "training starts at step 0, and the earlier outputs move to archive/" in capsys.readouterr().err
    [archived] = (tiny_run / "archive").iterdir()
    assert archived.name.startswith("before-restart-")  # not a --fresh the user asked for
    assert (archived / "metrics.jsonl").read_text() == old_metrics
    assert sorted(logged_losses(tiny_run)) == list(range(1, 7))  # one run's records, not two


def test_a_fresh_start_moves_every_eval_file_aside(tmp_path):
    """`kiln eval --set eval.split=train` writes eval-train.json beside eval.json: the old
    model's score too, so `--fresh` (or a restart) moves it aside with the rest rather than
    leaving it beside the new model's outputs."""
    from kiln.eval import eval_file

    made = ["metrics.jsonl", eval_file("val"), eval_file("train"), "samples.json"]
    for name in made:
        (tmp_path / name).write_text("{}")
    archived = ckpt_mod.archive_checkpoints(tmp_path, "fresh")
    assert sorted(p.name for p in archived.iterdir()) == sorted(made)
    assert not any((tmp_path / name).exists() for name in made)


def test_a_fresh_start_moves_the_window_losses_aside(tmp_path):
    """`kiln eval`'s per-window losses are the old model's too: a fresh start moves them
    aside with eval.json, or `kiln report --compare` would pair them with the new model."""
    made = ["eval.json", "eval_windows.npy", "eval-train.json", "eval-train_windows.npy"]
    for name in made:
        (tmp_path / name).write_text("{}")
    archived = ckpt_mod.archive_checkpoints(tmp_path, "fresh")
    assert sorted(p.name for p in archived.iterdir()) == sorted(made)


def test_pruning_counts_only_complete_checkpoints(tiny_run):
    """Empty or half-copied step_* folders are not checkpoints: counting them would prune
    every real one (and the next run would then start again from step 0)."""
    ckpts = tiny_run / "checkpoints"
    for junk in ("step_00000900", "step_00000901"):
        (ckpts / junk).mkdir(parents=True)
    train_losses(tiny_run, "train.steps=9", "train.checkpoint_every=3", "train.keep_checkpoints=2")
    assert sorted(p.name for p in ckpts.glob("step_*")) == [
        "step_00000006", "step_00000009", "step_00000900", "step_00000901"]
    assert latest_checkpoint(ckpts).name == "step_00000009"


def test_a_damaged_pickle_in_a_checkpoint_is_refused_without_unsafe_advice(tiny_run):
    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3")
    path = tiny_run / "checkpoints" / "step_00000006" / "trainer.pt"
    import zipfile

    data = bytearray(path.read_bytes())
    member = next(i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith("data.pkl"))
    start = member.header_offset + 30 + len(member.filename) + len(member.extra)
    data[start + 20 : start + 40] = b"A" * 20
    path.write_bytes(bytes(data))
    as_written(path.parent)  # a pickle written damaged (its checksum matches): torch's error
    with pytest.raises(CheckpointError, match="damaged pickle data.*previous one, step_00000003") as e:
        train_losses(tiny_run, "train.steps=9")
    assert "weights_only" not in str(e.value)


def test_a_checkpoint_of_non_finite_weights_is_refused_on_resume(tiny_run):
    from safetensors.torch import load_file, save_file

    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3")
    path = tiny_run / "checkpoints" / "step_00000006" / "model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, path)
    as_written(path.parent)
    with pytest.raises(TrainingDiverged, match=f"holds non-finite weights \\({name}\\)"):
        train_losses(tiny_run, "train.steps=9")


def test_an_unwritable_checkpoints_folder_is_refused_before_step_1(tiny_run):
    import os

    if os.geteuid() == 0:  # root writes anywhere: a file where the folder should be instead
        (tiny_run / "checkpoints").write_text("not a folder")
    else:
        (tiny_run / "checkpoints").mkdir()
        (tiny_run / "checkpoints").chmod(0o500)
    with pytest.raises(CheckpointError, match="cannot write checkpoints to"):
        train_losses(tiny_run, "train.steps=3")
    assert not (tiny_run / "metrics.jsonl").exists()  # refused before any step


def test_resume_refuses_model_and_optimizer_changes_that_keep_the_shapes(tiny_run):
    """rope_theta or top_k keep every tensor's shape, so the shape check passes: the resume
    compares the recorded settings. Another optimizer cannot take the optimizer state."""
    train_losses(tiny_run, "train.steps=6")
    for change in ("model.rope_theta=500000.0", "model.norm_eps=0.001", "optim.name=muon"):
        key = change.split("=")[0]
        with pytest.raises(CheckpointError,  # `kiln run` has no --fresh: the verb that has
                           match=f"trained with other settings \\({key}.*`kiln train --fresh`"):
            Trainer(tiny_config(tiny_run, change))
    Trainer(tiny_config(tiny_run, "model.attn_kernel=sdpa"))  # the same function: allowed
    # how the data is made (not what), and what only steers training: allowed
    Trainer(tiny_config(tiny_run, "prepare.workers=2", "prepare.keep_rejected=true",
                        "model.z_loss_coef=0.001"))


def test_a_resume_refused_for_data_settings_advises_the_start_over_that_remakes_them(tmp_path):
    """`kiln train RUN --set data.val_fraction=0.1` was told to start over with `kiln train
    --fresh`, which trains on the shards on disk and refuses them as made with 0.05: the
    advice led to a second refusal. Data changes now advise `kiln run --fresh`; model ones
    keep `kiln train --fresh`."""
    from kiln.train.resume_settings import refuse_changed_model

    old = tiny_config(tmp_path)
    with pytest.raises(CheckpointError) as e:
        refuse_changed_model(tmp_path / "step_1", old, tiny_config(tmp_path, "data.val_fraction=0.1"))
    assert "`kiln run --fresh`" in str(e.value) and "`kiln train --fresh`" not in str(e.value)
    with pytest.raises(CheckpointError, match="`kiln train --fresh`"):
        refuse_changed_model(tmp_path / "step_1", old, tiny_config(tmp_path, "model.norm_eps=0.001"))


def test_a_data_verb_keeps_a_trained_runs_config(tiny_run, capsys):
    """`kiln run` records the data stages' config before training; with checkpoints there it
    must not, or the resume would compare the new settings with themselves (no note) and a
    refused resume would leave a config.toml that no longer fits the checkpoints."""
    from kiln.commands.data_stages import record_config

    train_losses(tiny_run, "train.steps=6")
    recorded = (tiny_run / "config.toml").read_text()
    record_config(tiny_config(tiny_run, "optim.lr=0.01", "model.n_layers=3"))
    assert (tiny_run / "config.toml").read_text() == recorded
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, "train.steps=6", "optim.lr=0.01"))
    assert "optim.lr: 0.003 -> 0.01" in capsys.readouterr().err


def test_resume_between_two_records_logs_the_same_window(tiny_run, tmp_path):
    """A checkpoint between two train records carries the open window: the first record
    after a resume averages the same steps, to the bit, as an uninterrupted run's."""
    import shutil

    from kiln.train.callbacks import Callback, default_callbacks

    settings = ("train.log_every=4", "train.checkpoint_every=6")
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    train_losses(tiny_run, *settings)

    class StopAt(Callback):  # "killed" right after the step-6 checkpoint
        def on_step_end(self, t, record):
            if t.step == 6:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_losses(other, *settings, callbacks=[*default_callbacks(), StopAt()])
    train_losses(other, *settings)

    def records(run_dir):
        return {r["step"]: (r["loss"], r["loss_steps"], r["tokens"]) for r in
                read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}

    assert records(other) == records(tiny_run)
    assert records(other)[8][1] == 4


def test_a_diverged_run_stops_and_keeps_its_finite_checkpoints(tiny_run):
    """lr 1e4 without clipping turns the loss into NaN within a few steps: training stops
    with a message naming the last checkpoint, which (like every one kept) is finite, and
    no record of the poisoned step is logged."""
    from safetensors.torch import load_file

    from kiln.errors import TrainingDiverged

    # the message names the lr the run dir now records: a plain re-run would diverge again
    with pytest.raises(TrainingDiverged, match=r"diverged at step (\d+): loss nan.*lower optim.lr "
                       r"\(`--set optim.lr=...`: 10000 is what config.toml records now\).*step_0*\d+"):
        train_losses(tiny_run, "optim.lr=1e4", "optim.grad_clip=0", "train.checkpoint_every=1",
                     "train.keep_checkpoints=2", "schedule.warmup_steps=0")
    from kiln.config import load_config

    assert load_config(tiny_run / "config.toml", []).optim.lr == 1e4  # what the message says
    kept = [p for p in (tiny_run / "checkpoints").glob("step_*")]
    assert kept
    for ckpt in kept:
        assert all(torch.isfinite(t).all() for t in load_file(ckpt / "model.safetensors").values())
    assert all(math.isfinite(loss) for loss in logged_losses(tiny_run).values())
    assert max(logged_losses(tiny_run)) == checkpoint_step(latest_checkpoint(tiny_run / "checkpoints"))


def test_a_stopped_run_ends_its_progress_line_before_the_error(tiny_run, capsys):
    """Off a terminal the bar is one line redrawn in place; a run that stops with an error
    ends that line (and closes the bar), so the one-line error starts its own."""
    from kiln.train.callbacks import Callback, default_callbacks

    class Fail(Callback):
        def on_step_end(self, trainer, record):
            if trainer.step == 3:
                raise OSError("the disk is full")

    callbacks = default_callbacks()
    with pytest.raises(OSError, match="disk is full"):
        train_losses(tiny_run, callbacks=[*callbacks, Fail()])
    err = capsys.readouterr().err
    assert "train:" in err and err.endswith("\n")
    bar = next(cb for cb in callbacks if hasattr(cb, "bar")).bar
    assert bar.disable  # tqdm sets it when the bar is closed


def test_a_non_finite_validation_loss_stops_training_before_it_is_logged(tiny_run):
    """lr 1e39 overflows the weights in step 1's update; validation after it sees them
    first (the checkpoint is written after): it stops instead of logging val_loss NaN."""
    with pytest.raises(TrainingDiverged, match="step 1: the validation loss is not finite"):
        train_losses(tiny_run, "train.steps=4", "train.eval_every=1", "train.checkpoint_every=2",
                     "optim.lr=1e39", "optim.grad_clip=0", "schedule.warmup_steps=0")
    records = read_metrics(tiny_run / "metrics.jsonl")
    assert all(math.isfinite(v) for r in records for k, v in r.items()
               if k in ("loss", "val_loss", "val_bpb"))


def test_weights_overflowed_by_an_update_are_never_checkpointed(tiny_run):
    """lr 1e39 (past fp32's largest number) overflows the weights in the update itself,
    while the loss and gradient norm of that step are finite: the checkpoint callback checks
    the weights, and the message names the checkpoint before the last when there is one."""
    from safetensors.torch import load_file

    train_losses(tiny_run, "train.steps=4", "train.checkpoint_every=2")
    with pytest.raises(TrainingDiverged, match="step 5: the weights became non-finite.*step_00000004"
                       ".*if that diverges again at once, move step_00000004 .* from step_00000002"):
        train_losses(tiny_run, "train.steps=8", "train.checkpoint_every=1", "optim.lr=1e39",
                     "optim.grad_clip=0", "schedule.warmup_steps=0")
    for ckpt in (tiny_run / "checkpoints").glob("step_*"):
        assert all(torch.isfinite(t).all() for t in load_file(ckpt / "model.safetensors").values())


def test_generate_from_non_finite_weights_says_so():
    from kiln.config import ModelConfig
    from kiln.errors import TrainingDiverged
    from kiln.model import Transformer
    from kiln.model.sampling import generate

    model = Transformer(ModelConfig(vocab_size=50, dim=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                    max_seq_len=16))
    with torch.no_grad():
        model.embed.weight[3] = float("nan")
    for temperature in (0.0, 1.0):
        with pytest.raises(TrainingDiverged, match="not finite"):
            generate(model, [3, 4], 4, temperature=temperature)


def test_resume_refuses_data_made_otherwise(tiny_run):
    """The checkpoints were trained on the data on disk: a resume naming other data
    settings is refused, and so is data re-made since (other files, same settings), which
    the loader state's fingerprint of tokens/index.json tells."""
    train_losses(tiny_run, "train.steps=6")
    with pytest.raises(CheckpointError, match=r"other settings \(data.max_bytes"):
        Trainer(tiny_config(tiny_run, "data.max_bytes=300000"))
    index = json.loads((tiny_run / "tokens/index.json").read_text())
    index["train"]["documents"] += 1
    (tiny_run / "tokens/index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="re-made since"):
        Trainer(tiny_config(tiny_run))


def test_the_step_sets_muon_and_adamw_learning_rates_from_the_schedule(tiny_run):
    """Muon's matrices train at optim.muon_lr and the rest at optim.lr, both times the
    schedule's multiplier (a trainer that set one lr for all groups would train Muon at
    AdamW's rate)."""
    from kiln.train.schedule import lr_multiplier

    trainer = Trainer(tiny_config(tiny_run, "optim.name=muon", "optim.muon_lr=0.02"))
    trainer.train_step()
    mult = lr_multiplier(0, trainer.cfg.train.steps, trainer.cfg.schedule)
    assert 0 < mult < 1
    groups = trainer.optimizer.param_groups
    assert sorted(bool(g.get("use_muon")) for g in groups) == [False, False, True]
    for g in groups:  # every group, the no-decay one included: none left at its built lr
        assert g["lr"] == pytest.approx((0.02 if g.get("use_muon") else 3e-3) * mult)


def test_a_rank_left_on_one_thread_of_many_cores_is_noted(tiny_run, monkeypatch, capsys):
    threads = torch.get_num_threads()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    torch.set_num_threads(1)
    try:
        Trainer(tiny_config(tiny_run))
        assert "launch with OMP_NUM_THREADS=8" in capsys.readouterr().err
        torch.set_num_threads(8)
        Trainer(tiny_config(tiny_run))
        assert "OMP_NUM_THREADS" not in capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch):
    from kiln.config import ConfigError
    from kiln.parallel.distributed import init_distributed

    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # no GPU chosen per process
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="local rank 1 has no GPU of its own: 1 are visible"):
        init_distributed(torch.device("cuda"))


@pytest.mark.parametrize("torchrun", [False, True])
def test_a_process_given_one_gpu_of_its_own_trains_on_it(monkeypatch, torchrun):
    """srun --gpus-per-task (no torchrun): each task sees its GPU alone, as cuda:0, whatever
    its LOCAL_RANK; refused before. Under torchrun every worker sees every GPU of the node:
    local rank 1 of one GPU is a process too many, refused still."""
    import torch.distributed as dist

    import kiln.parallel.distributed as distributed
    from kiln.config import ConfigError
    from kiln.parallel import rank_stops
    from kiln.parallel.distributed import init_distributed, local_device

    for key, value in {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3",
                       "CUDA_VISIBLE_DEVICES": "3"}.items():
        monkeypatch.setenv(key, value)
    if torchrun:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    chosen: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: chosen.append(kw["device_id"]))
    monkeypatch.setattr(distributed, "_rendezvous", lambda backend: dist.HashStore())
    monkeypatch.setattr(rank_stops, "_kept", None)  # the store kept, given back after
    monkeypatch.setattr(rank_stops, "_launcher", None)  # and its host's pid
    monkeypatch.setattr(distributed, "long_wait_group", lambda: None)
    monkeypatch.setattr(distributed, "die_with_launcher", lambda: None)
    if torchrun:
        with pytest.raises(ConfigError, match="local rank 3 has no GPU of its own"):
            init_distributed(torch.device("cuda"))
        return
    env = init_distributed(torch.device("cuda"))
    assert chosen == [0, torch.device("cuda", 0)]
    assert (env.rank, env.local_rank) == (3, 3)
    assert local_device(torch.device("cuda"), env) == torch.device("cuda", 0)


def test_gradients_are_clipped_to_grad_clip_and_the_log_keeps_the_norm_before(tiny_run):
    """The optimizer sees the gradient scaled to norm `optim.grad_clip` (same direction);
    the logged grad_norm is the norm before clipping."""
    def first_step_grads(clip: float):
        trainer = Trainer(tiny_config(tiny_run, f"optim.grad_clip={clip}"))
        seen = []
        trainer.optimizer.register_step_pre_hook(
            lambda opt, *_: seen.append([p.grad.clone() for p in trainer.model.parameters()]))
        record = trainer.train_step()
        return record["grad_norm"], seen[0]

    norm, raw = first_step_grads(0.0)  # 0: no clipping
    clip = norm / 10
    logged, clipped = first_step_grads(clip)
    assert logged == pytest.approx(norm, rel=1e-6)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in clipped]))
    assert total.item() == pytest.approx(clip, rel=1e-5)
    for g, r in zip(clipped, raw, strict=True):
        torch.testing.assert_close(g, r * (clip / norm), rtol=1e-4, atol=1e-9)


def test_clipping_with_accumulation_clips_the_accumulated_gradient_once(tiny_run):
    """With 4 micro-batches a step, the norm clipped (and logged) is the whole step's
    gradient's, as one micro-batch of 8 gives it: not each micro-batch's, clipped apart."""
    def first_step(micro: int, clip: float):
        trainer = Trainer(tiny_config(tiny_run, f"train.micro_batch={micro}",
                                      f"optim.grad_clip={clip}"))
        seen = []
        trainer.optimizer.register_step_pre_hook(
            lambda opt, *_: seen.append([p.grad.clone() for p in trainer.model.parameters()]))
        record = trainer.train_step()
        return trainer.accum_steps, record["grad_norm"], seen[0]

    accum, norm, whole = first_step(8, 0.0)  # one micro-batch, unclipped: the reference
    assert accum == 1
    clip = norm / 10
    accum, logged, clipped = first_step(2, clip)
    assert accum == 4 and logged == pytest.approx(norm, rel=1e-5)
    for g, w in zip(clipped, whole, strict=True):
        torch.testing.assert_close(g, w * (clip / norm), rtol=1e-4, atol=1e-8)


def test_a_finished_model_without_its_checkpoints_is_not_retrained_silently(tiny_run):
    """Checkpoints deleted after export to save disk: `kiln run` again (to refresh a report)
    must not retrain from scratch and archive the model's eval and export."""
    import shutil

    train_losses(tiny_run, "train.steps=6")
    shutil.rmtree(tiny_run / "checkpoints")
    (tiny_run / "eval.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"holds a trained model's outputs \(eval.json\) but "
                       "no checkpoint .* --fresh"):
        train_losses(tiny_run, "train.steps=6")
    assert (tiny_run / "eval.json").exists() and not (tiny_run / "archive").exists()


def test_model_json_keeps_how_each_stretch_of_a_resumed_run_trained(tiny_run):
    """A run resumed on another number of ranks says so in model.json and the report, not
    only how its last stretch ran; resumed the same way it records nothing extra."""
    from kiln.report import build_report

    train_losses(tiny_run, "train.steps=4", "train.checkpoint_every=2")
    model = json.loads((tiny_run / "model.json").read_text())
    assert "launches" not in model
    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=2")  # resumed alike
    assert "launches" not in json.loads((tiny_run / "model.json").read_text())
    # as if steps 1-6 had run on 2 DDP ranks (the 2-rank tests train that way for real)
    (tiny_run / "model.json").write_text(json.dumps({**model, "world_size": 2, "parallel": "ddp"}))
    train_losses(tiny_run, "train.steps=8", "train.checkpoint_every=2")
    model = json.loads((tiny_run / "model.json").read_text())
    assert model["launches"] == [
        {"from_step": 1, "precision": "fp32", "world_size": 2, "accum_steps": 2, "parallel": "ddp"},
        {"from_step": 7, "precision": "fp32", "world_size": 1, "accum_steps": 2, "parallel": "none"}]
    assert model["world_size"] == 1
    page = build_report(tiny_run).read_text(encoding="utf-8")
    assert "from step 1: ddp on 2 ranks, fp32; from step 7: 1 process, fp32" in page
    # a launch on 2 ranks stopped before its first checkpoint left no steps: the next
    # launch from the same step replaces it
    launches = model["launches"] + [{**model["launches"][0], "from_step": 9}]
    (tiny_run / "model.json").write_text(json.dumps({**model, "launches": launches,
                                                    "world_size": 2, "parallel": "ddp"}))
    train_losses(tiny_run, "train.steps=10", "train.checkpoint_every=2")
    assert json.loads((tiny_run / "model.json").read_text())["launches"] == model["launches"]


@pytest.mark.parametrize("damaged", ['[]', '"text"', '{"launches": "x"}',
                                     '{"launches": [1, {"from_step": "a"}], "world_size": 2}'])
def test_a_model_json_of_other_types_does_not_stop_a_resume(tiny_run, damaged):
    """model.json is Kiln's own record, read back on a resume for the launches: one of other
    JSON types (edited by hand) stopped the resume with an AttributeError or TypeError
    traceback; it is written anew, its launch history lost, not the run."""
    train_losses(tiny_run, "train.steps=2", "train.checkpoint_every=2")
    (tiny_run / "model.json").write_text(damaged)
    train_losses(tiny_run, "train.steps=4", "train.checkpoint_every=2")
    model = json.loads((tiny_run / "model.json").read_text())
    assert model["world_size"] == 1 and model["params"] > 0
    assert model.get("launches", [{}])[-1].get("from_step", 3) == 3

def test_a_design_that_trains_wrong_is_refused_for_a_new_model_only(tiny_run, capsys,
                                                                    monkeypatch):
    """MoE top_k = 1 (a constant gate: the router learns nothing) is refused when training
    starts from step 0; a run trained so before Kiln checked resumes with a note, and its
    checkpoints still evaluate."""
    from kiln.cli import main
    from kiln.config import ConfigError
    from kiln.run_dir import write_run_metadata

    moe = ["model.n_experts=4", "model.top_k=1", "model.n_shared=0", "train.steps=2",
           "train.checkpoint_every=2"]
    with pytest.raises(ConfigError, match=r"model\.top_k = 1"):
        Trainer(tiny_config(tiny_run, *moe))
    assert not (tiny_run / "checkpoints").exists() or not any((tiny_run / "checkpoints").iterdir())
    assert main(["run", str(tiny_run), *[a for kv in moe for a in ("--set", kv)]]) == 2
    assert "model.top_k = 1" in capsys.readouterr().err
    # as if trained before the check: the design check is skipped to make the checkpoint
    import kiln.train.train_setup as train_setup

    with monkeypatch.context() as patch:
        patch.setattr(train_setup, "design_problems", lambda m: [])
        cfg = tiny_config(tiny_run, *moe)
        write_run_metadata(cfg)
        Trainer(cfg).fit()
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, *moe[:-2], "train.steps=3"))  # resumes, with a note
    assert "note: model.top_k = 1" in capsys.readouterr().err
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=1"]) == 0


def test_a_cut_short_local_global_pattern_is_noted_once_when_the_model_is_made(tiny_run, capsys):
    """3 layers at 1 local : 1 global end on a local layer: training starts with a note
    naming the layers (not an error: it trains what it says); a resume does not repeat it."""
    settings = ("model.n_layers=3", "model.local_per_global=1", "model.sliding_window=8",
                "train.steps=2", "train.checkpoint_every=2", "train.eval_every=0")
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, *settings)).fit()
    err = capsys.readouterr().err
    assert err.count("note: model.n_layers = 3 is not a multiple of model.local_per_global + 1 "
                     "= 2: the pattern (1 sliding-window layer, then one global) is cut short, "
                     "so layer 1 is global and the last layer 2 is local") == 1
    Trainer(tiny_config(tiny_run, *settings[:-3], "train.steps=3"))  # resumes at step 2
    assert "cut short" not in capsys.readouterr().err


def test_a_window_no_training_sequence_exceeds_is_noted(tiny_run, capsys):
    """sliding_window >= train.seq_len (below max_seq_len, else refused): every key of a
    training window is in reach, so the local layers train exactly as global ones and the
    window is met only in generation; a new model is told, once."""
    settings = ("model.local_per_global=1", "model.n_layers=2", "train.steps=1")
    capsys.readouterr()
    Trainer(tiny_config(tiny_run, *settings, "model.sliding_window=32"))  # seq_len 32
    assert capsys.readouterr().err.count(
        "note: model.sliding_window = 32 is not below train.seq_len = 32: every training "
        "window fits inside it, so the local layers train as global ones") == 1
    Trainer(tiny_config(tiny_run, *settings, "model.sliding_window=31"))
    assert "sliding_window" not in capsys.readouterr().err


def test_records_past_the_resumed_checkpoint_move_to_the_archive(tiny_run):
    """A run killed after logging steps its last checkpoint does not hold, resumed with
    other settings (here fewer steps, another log_every), logs its own records for those
    steps: the abandoned stretch's later records leave metrics.jsonl (to archive/), so the
    report's last step, loss and lr curve are the resumed run's."""
    from kiln.train.callbacks import Callback, default_callbacks

    settings = ("train.log_every=1", "train.checkpoint_every=4", "train.eval_every=0")

    class StopAt(Callback):  # "killed" at step 7: steps 5-7 logged, the checkpoint is step 4
        def on_step_end(self, t, record):
            if t.step == 7:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_losses(tiny_run, *settings, "train.steps=12",
                     callbacks=[*default_callbacks(), StopAt()])
    abandoned = logged_losses(tiny_run)
    assert sorted(abandoned) == [1, 2, 3, 4, 5, 6, 7]
    foreign = b'\xff\x1c not json \r\xc2\x85 kept as it is\n'  # bytes no decoder round-trips
    with open(tiny_run / "metrics.jsonl", "ab") as f:
        f.write(foreign)
    train_losses(tiny_run, "train.log_every=5", "train.checkpoint_every=4", "train.eval_every=0",
                 "train.steps=6")
    assert foreign in (tiny_run / "metrics.jsonl").read_bytes()
    records = read_metrics(tiny_run / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert max(r["step"] for r in records) == 6  # nothing of the abandoned step 7
    archived = list((tiny_run / "archive").glob("after-step-4-*/metrics.jsonl"))
    assert len(archived) == 1
    moved = [json.loads(line) for line in archived[0].read_text().splitlines()]
    assert {r["step"]: r["loss"] for r in moved} == {s: abandoned[s] for s in (5, 6, 7)}
    # an uninterrupted resume with nothing past the checkpoint archives nothing more
    train_losses(tiny_run, "train.log_every=5", "train.checkpoint_every=4", "train.eval_every=0",
                 "train.steps=8")
    assert len(list((tiny_run / "archive").iterdir())) == 1


def test_a_full_disk_in_any_writer_is_one_clear_error(tiny_run, monkeypatch):
    """safetensors reports a full disk as its own error type, metrics.jsonl as OSError, the
    writability probe is created before its write fails: each is the one-line checkpoint
    error naming the checkpoint the run resumes from, and the probe does not stay behind."""
    from safetensors import SafetensorError

    trainer, _ = train_losses(tiny_run, "train.steps=6")

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr(ckpt_mod, "save_tensors", full)
    trainer.step = 9
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*step_00000009 "
                       r"\(SafetensorError: .*No space.*the last checkpoint, step_00000006"):
        ckpt_mod.save_checkpoint(tiny_run / "checkpoints", 9, trainer.model, trainer.optimizer,
                                 trainer.state_dict(), trainer.env)
    monkeypatch.undo()

    import kiln.train.run_records as run_records

    def no_space(path, record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_records, "append_jsonl", no_space)
    with pytest.raises(CheckpointError, match="cannot write .*metrics.jsonl .*No space.*the "
                       "last checkpoint, step_00000006, is intact"):
        trainer.log({"kind": "train", "step": 9})
    monkeypatch.undo()

    real_write = type(tiny_run).write_bytes

    def created_then_full(self, data):
        real_write(self, b"")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(tiny_run), "write_bytes", created_then_full)
    with pytest.raises(CheckpointError, match="cannot write checkpoints to"):
        ckpt_mod.check_writable(tiny_run / "checkpoints")
    monkeypatch.undo()
    assert not list((tiny_run / "checkpoints").glob(".write-test-*"))


@pytest.mark.parametrize("tamper", ["no rng", "no loader", "short rng", "step as text",
                                    "loader of another shape", "not a dict", "callbacks as a list",
                                    "a callback state of another shape",
                                    "a callback state of other types", "elapsed time NaN"])
def test_an_altered_trainer_state_is_refused_naming_the_previous_checkpoint(tiny_run, tamper):
    """A trainer.pt that still unpickles but is not what Kiln wrote fails as unreadable, like
    a truncated one, not as a KeyError or TypeError traceback deep in the resume."""
    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3")
    path = tiny_run / "checkpoints" / "step_00000006" / "trainer.pt"
    state = torch.load(path, weights_only=True)
    if tamper == "no rng":
        del state["rng"]
    elif tamper == "no loader":
        del state["loader"]
    elif tamper == "short rng":
        state["rng"] = torch.zeros(3, dtype=torch.uint8)
    elif tamper == "step as text":
        state["step"] = "6"
    elif tamper == "loader of another shape":
        state["loader"] = {"position": 3}
    elif tamper == "callbacks as a list":
        state["callbacks"] = []
    elif tamper == "a callback state of another shape":
        state["callbacks"] = {"ProgressLog": {"x": 1}}
    elif tamper == "a callback state of other types":  # failed the first step: a traceback
        state["callbacks"] = {"ProgressLog": {"loss": "x", "steps": 1, "tokens": 0,
                                              "seconds": 0.0}}
    elif tamper == "elapsed time NaN":  # every later record's elapsed_s and tok/s were NaN
        state["elapsed_s"] = math.nan
    else:
        state = [state]
    torch.save(state, path)
    as_written(path.parent)  # written so: the state's own checks refuse it
    recorded = {name: (tiny_run / name).read_bytes()
                for name in ("config.toml", "model.json", "metrics.jsonl")}
    with pytest.raises(CheckpointError, match="step_00000006 is unreadable.*previous one, "
                       "step_00000003"):
        train_losses(tiny_run, "train.steps=9")
    # refused before anything is written: the run still records what trained it (steps = 6)
    assert {name: (tiny_run / name).read_bytes() for name in recorded} == recorded


def test_weights_of_another_dtype_are_refused(tiny_run):
    from safetensors.torch import load_file, save_file

    train_losses(tiny_run, "train.steps=6")
    path = latest_checkpoint(tiny_run / "checkpoints") / "model.safetensors"
    tensors = load_file(path)
    tensors["norm.weight"] = tensors["norm.weight"].to(torch.int64)
    save_file(tensors, path)
    as_written(path.parent)
    with pytest.raises(CheckpointError, match=r"norm.weight: \(64,\) int64 in the checkpoint, "
                       r"\(64,\) float32 in the model"):
        train_losses(tiny_run, "train.steps=9")


def test_records_past_the_checkpoint_move_aside_even_with_nothing_left_to_train(tiny_run):
    """Killed at step 7 with the last checkpoint at 4, then resumed with train.steps = 4:
    nothing trains, yet the report must end at the checkpoint the run now is."""
    from kiln.train.callbacks import Callback, default_callbacks

    class StopAt(Callback):
        def on_step_end(self, t, record):
            if t.step == 7:
                raise KeyboardInterrupt

    settings = ("train.log_every=1", "train.checkpoint_every=4", "train.eval_every=0")
    with pytest.raises(KeyboardInterrupt):
        train_losses(tiny_run, *settings, "train.steps=12", callbacks=[*default_callbacks(), StopAt()])
    _, losses = train_losses(tiny_run, *settings, "train.steps=4")
    assert losses == [] and sorted(logged_losses(tiny_run)) == [1, 2, 3, 4]
    assert len(list((tiny_run / "archive").glob("after-step-4-*/metrics.jsonl"))) == 1


@pytest.mark.parametrize(("override", "named"), [
    ("run.seed=1", "run.seed: made with 0, set to 1"),
    ("data.val_fraction=0.3", "data.val_fraction: made with 0.05, set to 0.3"),
    ("tokenizer.vocab_size=1024", "tokenizer.vocab_size: made with 512, set to 1024"),
    # the documents' own settings: trained on documents of the code filters, the run said
    # prose, and the next `kiln run` re-made the documents under the trained model
    ("prepare.quality.domain=prose", "prepare.quality.domain: made with 'code', set to 'prose'"),
    ("data.max_bytes=300000", "data.max_bytes: made with 400000, set to 300000"),
    ("data.text_field=content", "data.text_field: made with 'text', set to 'content'"),
])
def test_a_new_model_on_data_made_otherwise_is_refused_before_anything_moves(tiny_run, override,
                                                                             named):
    """`kiln train --fresh --set run.seed=1` on shards split with seed 0 would record seed 1:
    the next `kiln run` would re-split the data under the trained model. Refused, naming the
    setting, before --fresh archives the trained checkpoints."""
    train_losses(tiny_run, "train.steps=3", "train.checkpoint_every=3")
    with pytest.raises(ConfigError, match=re.escape(named)):
        Trainer(tiny_config(tiny_run, override), resume=False)
    assert latest_checkpoint(tiny_run / "checkpoints").name == "step_00000003"
    Trainer(tiny_config(tiny_run), resume=False)  # the data's own settings: a new model is fine


def test_a_new_model_may_change_what_did_not_make_the_data(tiny_run):
    """How the documents were made (workers, kept rejects) and the options of a stage that
    does not run describe the same data: a new model trains on it."""
    Trainer(tiny_config(tiny_run, "prepare.workers=2", "prepare.keep_rejected=true",
                        "prepare.decontaminate.n=8", "prepare.arxiv.min_year=2000"),
            resume=False)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "trainer.pt"])
def test_bytes_flipped_on_disk_are_refused_not_loaded(tiny_run, name):
    """A flipped byte inside a tensor still parses: without the recorded sha256 the resume
    (and eval) would go on from other weights or moments without a word."""
    from kiln.train.checkpoint import CHECKSUMS
    from kiln.train.trained_run import load_trained_model

    train_losses(tiny_run, "train.steps=6", "train.checkpoint_every=3")
    ckpt = tiny_run / "checkpoints" / "step_00000006"
    assert set(json.loads((ckpt / CHECKSUMS).read_text())) == {
        "model.safetensors", "optimizer.pt", "trainer.pt"}
    path = ckpt / name
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x10  # inside the tensor data: the file still parses
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"step_00000006 is unreadable .*{name} is not "
                       "what was written.*previous one, step_00000003"):
        train_losses(tiny_run, "train.steps=9")
    if name == "model.safetensors":  # eval, generate and export read the weights alone
        with pytest.raises(CheckpointError, match="is not what was written"):
            load_trained_model(tiny_config(tiny_run))


def test_a_checkpoint_without_checksums_still_resumes(tiny_run, tmp_path):
    """Checkpoints written before Kiln recorded checksums load as they did: the resume is
    exact, to the bit, as from a checkpoint with them."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    every = ("train.steps=8", "train.checkpoint_every=3")
    _, straight = train_losses(other, *every)
    with pytest.raises(KeyboardInterrupt):
        train_losses(tiny_run, *every, callbacks=stopped_after(6))
    as_before_checksums(tiny_run / "checkpoints" / "step_00000006")
    _, more = train_losses(tiny_run, *every)
    assert len(straight) == 8 and more == straight[6:]  # bitwise: same floats


def test_a_train_split_smaller_than_one_batch_is_noted(tiny_run, capsys):
    """Too few windows for one global batch trains (the loader wraps into the next epoch
    within the batch), but every step then repeats windows: the run says so."""
    windows = Trainer(tiny_config(tiny_run)).loader.n_windows
    assert "fewer than one batch" not in capsys.readouterr().err
    Trainer(tiny_config(tiny_run, f"train.global_batch={windows + 1}"))
    assert (f"the train split holds {windows} windows of train.seq_len = 32, fewer than one "
            f"batch of train.global_batch = {windows + 1}") in capsys.readouterr().err


def test_steps_that_pass_over_the_train_split_more_than_once_are_noted(tiny_run, capsys):
    """The loader wraps into a reshuffled next pass when the steps outrun the split: a run
    sized by train.steps that repeats its data says how many times."""
    windows = Trainer(tiny_config(tiny_run)).loader.n_windows
    assert "passes over" not in capsys.readouterr().err
    steps = windows // 8 * 3  # global_batch 8: just under three passes
    Trainer(tiny_config(tiny_run, f"train.steps={steps}"))
    assert (f"train.steps = {steps} of train.global_batch = 8 windows make "
            f"{steps * 8 / windows:.2f} passes over the train split's {windows} windows"
            in capsys.readouterr().err)


def test_progress_lines_in_a_log_file_thin_out_over_a_long_run(monkeypatch):
    """Off a terminal every redraw is a new line of the log: 15 s apart at first, then a
    twentieth of the time trained, at most 5 minutes (a 3-day run: ~900 lines, not 17,000 at
    a fixed 15 s). The bar's own interval follows the run's clock."""
    from kiln.train import callbacks
    from kiln.train.callbacks import progress_interval

    assert progress_interval(1e6, on_terminal=True) == 0.5
    assert [progress_interval(t, False) for t in (0, 60, 300, 1200, 6000, 86400)] == [
        15.0, 15.0, 15.0, 60.0, 300.0, 300.0]
    lines, t, last = 0, 0.0, 0.0
    while t < 3 * 86400:  # redraws over 3 days of 1-second steps, as tqdm spaces them
        t += 1.0
        if t - last >= progress_interval(t, False):
            lines, last = lines + 1, t
    assert 800 < lines < 1000

    clock = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(callbacks.sys.stderr, "isatty", lambda: False, raising=False)
    progress, step, _ = progress_log_driver(steps=10, log_every=5)
    clock[0] = 3600.0
    step(1.0)
    assert progress.bar.mininterval == 180.0


def test_logged_steps_do_not_redraw_the_bar_in_a_log_file(monkeypatch):
    """Off a terminal the bar draws on its interval only: the loss and tokens/s of a logged
    step wait for the next draw (each postfix refresh was a new line of the log, one per
    `log_every` steps, whatever the interval). 60 logged steps in well under the first
    interval: the first draw and the last."""
    import io
    from types import SimpleNamespace

    from kiln.train import callbacks

    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(callbacks.sys, "stderr", log)
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(steps=60, log_every=1)), step=0,
        tokens_seen=0, env=SimpleNamespace(is_main=True), log=lambda record: None,
        elapsed=lambda: 0)
    progress = callbacks.ProgressLog()
    progress.on_train_start(trainer)
    for _ in range(60):
        progress.on_step_start(trainer)
        trainer.step += 1
        progress.on_step_end(trainer, {"loss": 1.0, "lr": 0.1, "grad_norm": 1.0,
                                       "step_tokens": 100})
    progress.on_train_end(trainer)
    draws = [d for d in log.getvalue().split("\r") if d.strip()]
    assert len(draws) <= 3, draws
    assert "60/60" in draws[-1] and "loss=1.000" in draws[-1]


def test_the_eta_counts_validation_and_checkpoint_time(monkeypatch):
    """The bar's ETA is the wall time per step so far (steps, validation, checkpoints) times
    the steps left. tqdm's default, an average weighted to the last redraws, forgot a
    validation a few redraws after it: on a terminal the ETA was that of the steps alone.
    Fake clocks: 1 s steps, a 10 s validation after every 5th, so 10 steps take 30 s."""
    import io
    from types import SimpleNamespace

    import tqdm.std

    from kiln.train import callbacks

    clock = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(callbacks.sys, "stderr", io.StringIO())
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(steps=20, log_every=1)), step=0,
        tokens_seen=0, env=SimpleNamespace(is_main=True), log=lambda record: None,
        elapsed=lambda: 0)
    progress = callbacks.ProgressLog()
    progress.on_train_start(trainer)
    progress.bar.mininterval = 0.5  # a terminal's redraws
    for _ in range(10):
        progress.on_step_start(trainer)
        clock[0] += 1.0
        trainer.step += 1
        progress.on_step_end(trainer, {"loss": 1.0, "lr": 0.1, "grad_norm": 1.0,
                                       "step_tokens": 100})
        if trainer.step % 5 == 0:
            clock[0] += 10.0
    figures = progress.bar.format_dict
    rate = figures["rate"] or (figures["n"] - figures["initial"]) / figures["elapsed"]
    assert (figures["total"] - figures["n"]) / rate == pytest.approx(30.0)
    progress.on_train_end(trainer)
