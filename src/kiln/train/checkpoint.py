"""Atomic, exact checkpoints: model (safetensors), optimizer, RNG, step and loader position.

A checkpoint is written into a temporary folder and renamed into place only when every
file is on disk, then the `latest` pointer is swapped atomically; a crash mid-write leaves
the previous checkpoint untouched and loadable. Nothing is ever unpickled: weights are
safetensors and the rest is read with `torch.load(weights_only=True)`. Each file's sha256 is
recorded beside it (checksums.json) and checked before it is read: bytes flipped on disk
would otherwise load as other weights, or other moments, without a word.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from kiln.atomic import (
    atomic_dir,
    fsync_dir,
    new_archive_folder,
    recover_killed_swaps,
    write_text_atomic,
    writer_killed,
)
from kiln.errors import CheckpointError, KilnError
from kiln.eval import EVAL_FILES
from kiln.export_recovery import recover_export
from kiln.hashing import HashingWriter, file_sha256
from kiln.parallel.distributed import DistEnv, lost_a_rank
from kiln.parallel.model_wrapping import unwrap
from kiln.parallel.rank_waits import run_on_every_rank, run_on_main
from kiln.tensor_files import save_tensors
from kiln.train import earlier_outputs
from kiln.train.checkpoint_dirs import (
    PREFIX,
    checkpoint_step,
    complete_checkpoints,
    latest_checkpoint,
)
from kiln.train.checkpoint_weights import (
    FULL_ON_CPU,
    load_model_tensors,
    model_tensors,
    refuse_non_finite,
)

CHECKSUMS = "checksums.json"  # file name -> sha256, written with the checkpoint
# trainer.pt's "format": 2 since checkpoints record CHECKSUMS (none: written before); without
# it, a checkpoint whose CHECKSUMS was removed read as one from before, unchecked
FORMAT = 2


def verified(path: Path, name: str) -> Path:
    """`path / name`, refused as unreadable when its bytes are not those the checkpoint was
    written with (checkpoints from before Kiln recorded checksums are read unchecked), or
    when its CHECKSUMS is missing from a checkpoint written with one."""
    sums = path / CHECKSUMS
    if not sums.is_file():
        if _written_with_checksums(path):
            raise unreadable(path, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                                     str(sums)), CHECKSUMS)
        return path / name
    try:
        want = json.loads(sums.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise unreadable(path, e, CHECKSUMS) from e
    if not isinstance(want, dict) or not isinstance(want.get(name), str):
        raise unreadable(path, ValueError(f"{CHECKSUMS} records no sha256 for {name}"))
    try:
        want, got = want[name], file_sha256(path / name)
    except OSError as e:
        raise unreadable(path, e, name) from e
    if got != want:
        raise unreadable(path, ValueError(f"{name} is not what was written: its sha256 differs "
                                          f"from the one recorded in {CHECKSUMS}"))
    return path / name


def _written_with_checksums(path: Path) -> bool:
    """Whether checkpoint `path`'s trainer.pt says it was written with CHECKSUMS (its own
    damage, if any, is refused where it is read)."""
    try:
        state = torch.load(path / "trainer.pt", weights_only=True)
    except Exception:  # refused, naming the file, where trainer.pt is read
        return False
    return isinstance(state, dict) and state.get("format") == FORMAT


def _read_weights(path: Path, checked: bool = False) -> dict[str, torch.Tensor]:
    file = path / "model.safetensors" if checked else verified(path, "model.safetensors")
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors raises its own error type for a damaged file
        raise unreadable(path, e, "model.safetensors") from e


def unreadable(path: Path, e: Exception, name: str = "") -> CheckpointError:
    """The error for checkpoint `path` that cannot be loaded, naming the one before it, and
    its file `name` where `e` does not (torch's and safetensors' own texts name none)."""
    step = checkpoint_step(path)  # by number: step_100000000 sorts before step_99999000 as text
    older = [p.name for p in complete_checkpoints(path.parent)
             if (checkpoint_step(p) < step if step is not None else p.name < path.name)]
    hint = (f"move it aside to resume from the previous one, {older[-1]}" if older
            else "no earlier checkpoint is left; --fresh starts over")
    # torch's own text for a damaged pickle advises weights_only=False: never do that here
    if isinstance(e, pickle.UnpicklingError):
        why = f"damaged pickle data in {name}" if name else "damaged pickle data"
    else:
        why = f"{type(e).__name__}: {'' if name in str(e) else f'{name}: '}{e}"
    return CheckpointError(f"checkpoint {path} is unreadable ({why}); {hint}")


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    env: DistEnv,
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` (every rank calls this; rank 0 writes). A write that fails
    on rank 0 (a full disk) raises its error on every rank, not on rank 0 alone; one
    interrupted there (a second Ctrl-C) stops every rank as interrupted."""
    weights = model_tensors(model)
    optim_state = get_optimizer_state_dict(model, optimizer, options=FULL_ON_CPU)
    final = ckpt_root / f"{PREFIX}{step:08d}"
    run_on_main(env, lambda: _write(ckpt_root, final, weights, optim_state, trainer_state, keep),
                lambda e: _as_told(e, final), CheckpointError)
    return final


def _as_told(e: BaseException, final: Path) -> str:
    """Rank 0's failure as the other ranks raise it: a CheckpointError's own line."""
    if isinstance(e, CheckpointError):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return (f"rank 0 was interrupted while it wrote checkpoint {final} "
                f"({type(e).__name__}{f': {e}' if str(e) else ''}); that step is not saved")
    return f"rank 0 could not write checkpoint {final} ({type(e).__name__}: {e})"


def _write(ckpt_root: Path, final: Path, weights: dict[str, torch.Tensor], optim_state: Any,
           trainer_state: dict[str, Any], keep: int) -> None:
    """Rank 0's part of `save_checkpoint`: the folder, the `latest` pointer, the pruning."""
    clear_killed_writes(ckpt_root)
    try:
        with atomic_dir(final) as tmp:  # a re-saved step (after a resume) replaces its copy
            # torch.save's files (the optimizer's moments: most of the bytes) hashed as
            # they are written; safetensors offers no such hook, so its file is read back
            save_tensors(weights, tmp / "model.safetensors")
            sums = {"model.safetensors": file_sha256(tmp / "model.safetensors"),
                    "optimizer.pt": _save_hashed(optim_state, tmp / "optimizer.pt"),
                    "trainer.pt": _save_hashed({**trainer_state, "rng": torch.get_rng_state(),
                                                "format": FORMAT}, tmp / "trainer.pt")}
            (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=1))
    except (OSError, RuntimeError, SafetensorError) as e:  # a full disk: any of the three
        raise cannot_write(ckpt_root, f"checkpoint {final}", e) from e
    try:
        _point_to(final)
    except OSError as e:
        raise cannot_write(ckpt_root, str(ckpt_root / "latest"), e) from e
    _prune(ckpt_root, keep, final)


def _point_to(ckpt: Path) -> None:
    """Make `latest` name `ckpt`, complete on disk. A full disk can fail this small write
    after the checkpoint's: the stale pointer then goes too, so that a resume takes the
    newest complete checkpoint, this one, not the older one it named (steps lost)."""
    pointer = ckpt.parent / "latest"
    try:
        write_text_atomic(pointer, ckpt.name + "\n")
    except OSError:
        with contextlib.suppress(OSError):  # a read-only disk: the error says what is kept
            pointer.unlink(missing_ok=True)
        raise


def _save_hashed(obj: object, path: Path) -> str:
    """`torch.save` to `path`; returns the file's sha256, taken as it was written."""
    with HashingWriter(path) as f:
        try:
            torch.save(obj, f)
        except RuntimeError:  # "[enforce fail at inline_container.cc] unexpected pos"
            if f.failure is None:
                raise
            raise f.failure from None  # the disk's error (No space left on device)
        return f.hexdigest()


def cannot_write(ckpt_root: Path, what: str, e: Exception) -> CheckpointError:
    """The error for a run file that could not be written mid-training (a full or read-only
    disk), saying which checkpoint the run will resume from."""
    last = latest_checkpoint(ckpt_root)
    kept = f"the last checkpoint, {last.name}, is intact" if last else "no checkpoint was written"
    return CheckpointError(f"cannot write {what} ({type(e).__name__}: {e}): is the disk full or "
                           f"read-only? {kept}; free space and run `kiln train` again to resume")


_PROBE = ".write-test-"


def check_writable(ckpt_root: Path) -> None:
    """Before step 1: a checkpoints folder that cannot be written would lose every step
    trained until the first checkpoint."""
    probe = ckpt_root / f"{_PROBE}{os.getpid()}"
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        try:
            probe.write_bytes(b"kiln")
        finally:  # a full disk creates the file, then fails to write it
            probe.unlink(missing_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoints to {ckpt_root} ({e}); make it writable "
                              "or set run.dir to a folder that is") from e


def clear_killed_writes(ckpt_root: Path) -> None:
    """What writes of other steps left when killed (`atomic_dir` clears its own step's):
    half-written folders go, a folder moved aside for a replacement comes back, and a
    pruned one whose deletion was cut short goes."""
    if not ckpt_root.is_dir():
        return
    for leftover in ckpt_root.glob(f".{PREFIX}*"):
        name, sep, kind = leftover.name[1:].rpartition(".")
        if kind.startswith(_TRASH):
            shutil.rmtree(leftover, ignore_errors=True)
        elif sep:
            recover_killed_swaps(ckpt_root / name)
    for legacy in ckpt_root.glob(".tmp-*"):  # an older Kiln's half-written checkpoints
        shutil.rmtree(legacy, ignore_errors=True)
    for probe in ckpt_root.glob(f"{_PROBE}*"):  # `check_writable`'s, its writer killed
        if writer_killed(probe):
            probe.unlink(missing_ok=True)


_TRASH = "trash-"  # .step_N.trash-PID: a pruned checkpoint, out of the way, being deleted


def prune_checkpoints(ckpt_root: Path, keep: int) -> None:
    """At a run's start (and when it has nothing left to train): keep_checkpoints applied
    around the checkpoint `latest` names. A run killed between a save's `latest` and its
    pruning kept one checkpoint too many, which only its next save would prune, and a run
    killed in its last save has none; a lowered keep_checkpoints applies at once."""
    kept = latest_checkpoint(ckpt_root)
    if kept is not None:
        _prune(ckpt_root, keep, kept)


def _prune(ckpt_root: Path, keep: int, just_written: Path) -> None:
    """Keep the newest `keep` complete checkpoints and the one just written; none newer
    than it goes (a checkpoint `latest` did not name yet, its pointer write cut short: the
    resume re-makes it). Folders that are not complete checkpoints (a copy in progress, a
    user's) neither count nor go. Each goes by one rename to a hidden name first: a run
    killed while deleting it leaves a hidden folder (cleared at the next save), never a
    half-deleted `step_N` that still holds the trainer.pt that makes it count as complete."""
    done = [p for p in complete_checkpoints(ckpt_root) if p != just_written]
    newest = checkpoint_step(just_written)
    doomed = done[: max(0, len(done) - (keep - 1))] if keep > 0 else []
    for old in [p for p in doomed if newest is None or checkpoint_step(p) < newest]:
        trash = old.with_name(f".{old.name}.{_TRASH}{os.getpid()}")
        try:
            os.replace(old, trash)
        except OSError:  # left whole, to be pruned at the next save
            continue
        shutil.rmtree(trash, ignore_errors=True)


_MODEL_OUTPUTS = ("checkpoints", "metrics.jsonl", *EVAL_FILES, "samples.json", "export",
                  "report.html", "plots")


def archive_checkpoints(run_dir: Path, reason: str = "fresh") -> Path | None:
    """Move a run's checkpoints, metrics and what was made from them (eval, samples,
    export, report) aside to archive/before-{reason}-{time}/, for `train --fresh` or a
    restart at step 0: nothing is deleted, and the new run's curves and outputs do not mix
    with the old model's. One killed partway is finished here, into its folder
    (`kiln.train.earlier_outputs`)."""
    recover_export(run_dir / "export", run_dir)  # a killed export's previous one goes too
    clear_killed_writes(run_dir / "checkpoints")  # half-written folders are no outputs
    with contextlib.suppress(OSError):  # nothing left in it (a run killed in its first save)
        (run_dir / "checkpoints").rmdir()
    earlier_outputs.clear_empty(run_dir)
    old = [run_dir / name for name in _MODEL_OUTPUTS if (run_dir / name).exists()]
    # a start killed between two moves: the rest join the folder it began (never over a
    # file of the same name there: then it is left as it is, finished, and a new one begun)
    dest = earlier_outputs.unfinished_archive(run_dir)
    if dest is not None and not old:  # everything had moved: its records are what is left
        earlier_outputs.copy_records(run_dir, dest)
        earlier_outputs.mark_finished(dest)
        return dest
    if not old:
        return None
    if dest is not None and any((dest / p.name).exists() for p in old):
        earlier_outputs.mark_finished(dest)
        dest = None
    if dest is None:
        dest = new_archive_folder(run_dir, f"before-{reason}")
        earlier_outputs.mark_unfinished(dest)
    for p in old:
        os.replace(p, dest / p.name)
    fsync_dir(run_dir)
    earlier_outputs.copy_records(run_dir, dest)
    earlier_outputs.mark_finished(dest)
    return dest


def check_checkpoint(path: Path, optimizer: bool = True) -> dict[str, Any]:
    """Checkpoint `path`'s files checked against their recorded sums (every byte read: most
    of a resume's time), and its trainer state, read and checked: the part of a resume that
    reads this rank's copy of the files and no other rank's, with no collective. A copy
    damaged on one node fails on its ranks alone: the ranks agree on this before the
    collectives of loading (`kiln.parallel.rank_waits.run_on_every_rank`), where the others
    would wait for the failed rank, or fail in a collective it left."""
    verified(path, "model.safetensors")
    if optimizer:
        verified(path, "optimizer.pt")
    state = _read_trainer_state(path)
    missing_state(path, state, ("rng",))
    return state


def load_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
    state: dict[str, Any] | None = None, env: DistEnv | None = None,
) -> dict[str, Any]:
    """Restore weights (and optimizer, RNG) in place; returns the trainer state. `state`:
    what `check_checkpoint` returned (its files are not checked again). `env`: the ranks
    that load it together, which agree on rank 0's read of the optimizer's state
    (`_optimizer_state`).

    The optimizer's state (moments, momentum, step counts) comes from the checkpoint; its
    settings (weight decay, betas, Muon's lr ratio...) stay as `optimizer` was built from
    the config, so a resume with changed settings uses them, as a fresh run would."""
    if state is None:
        state = check_checkpoint(path, optimizer is not None)
    state = dict(state)
    load_weights(path, model, checked=True)
    if optimizer is not None:
        optim_state = _optimizer_state(path, model, optimizer, state.get("step", 0), env)
        try:
            settings = [{k: v for k, v in g.items() if k != "params"}
                        for g in optimizer.param_groups]
            set_optimizer_state_dict(
                model, optimizer, optim_state,
                options=StateDictOptions(full_state_dict=True,
                                         broadcast_from_rank0=dist.is_initialized()))
            for group, built in zip(optimizer.param_groups, settings, strict=True):
                group.update(built)
                _place_steps(optimizer, group)
            _refuse_misshapen_moments(optimizer)
        except _UNREADABLE as e:
            if isinstance(e, RuntimeError) and lost_a_rank(e):  # another rank's failure
                raise
            raise unreadable(path, e, "optimizer.pt") from e
    try:
        torch.set_rng_state(state.pop("rng"))
    except (RuntimeError, TypeError) as e:  # a state of the wrong size
        raise unreadable(path, e, "trainer.pt") from e
    return state


# what reading or loading an altered or damaged optimizer.pt raises
_UNREADABLE = (OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError, TypeError,
               ValueError, AttributeError)


def resume_told(e: BaseException, ckpt: Path) -> str:
    """How a rank's failure to read checkpoint `ckpt` is told, after "rank R"."""
    if isinstance(e, KeyboardInterrupt):
        return (f"was interrupted while it read checkpoint {ckpt} "
                f"({type(e).__name__}{f': {e}' if str(e) else ''})")
    if isinstance(e, KilnError):
        return f"could not resume: {e}"
    return f"could not read checkpoint {ckpt} ({type(e).__name__}: {e})"


def _optimizer_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                     step: int, env: DistEnv | None) -> Any:
    """optimizer.pt, read and checked by rank 0 alone ({} on the others): the whole state
    (2 fp32 moments per weight for AdamW) is sent to each rank a tensor at a time, kept as
    its shard (FSDP2), where every rank held it all, the host's memory taken once per rank
    (each rank's copy was checked). Its refusal is agreed with the other ranks before the
    sending (`run_on_every_rank`): they would wait there for a rank gone, and say only that
    "another rank failed or was killed"."""
    def read() -> Any:
        if dist.is_initialized() and dist.get_rank() != 0:
            return {}
        try:
            optim_state = torch.load(path / "optimizer.pt", weights_only=True)
            _refuse_other_state(optim_state, model, optimizer, step)
        except _UNREADABLE as e:
            raise unreadable(path, e, "optimizer.pt") from e
        return optim_state

    if env is None or not env.distributed:
        return read()
    return run_on_every_rank(env, read, lambda e: resume_told(e, path), CheckpointError)


def _refuse_other_state(optim_state: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                        step: int) -> None:
    """What rank 0 alone can find wrong in optimizer.pt's contents, found before any of it is
    sent (torch's own refusals of a moment missing or of another shape come midway through
    the sending, on rank 0 alone; the other ranks copy a moment of another shape silently)."""
    if not (isinstance(optim_state, dict) and isinstance(optim_state.get("state"), dict)
            and isinstance(optim_state.get("param_groups"), list)):
        raise TypeError(f"optimizer.pt holds a {type(optim_state).__name__} without the "
                        "'state' and 'param_groups' of an optimizer's state")
    if not all(isinstance(g, dict) and isinstance(g.get("params"), list)
               for g in optim_state["param_groups"]):
        raise TypeError("optimizer.pt: a param group without its list of 'params'")
    moments = optim_state["state"]
    if not moments and step > 0:
        # every step updates the dense weights, so a trained optimizer has moments for
        # them: none at all restarted AdamW's averages and Muon's momentum silently
        raise ValueError(f"optimizer.pt holds no moments, where the checkpoint is of step {step}")
    if not moments or all(isinstance(k, int) for k in moments):  # torch's own: taken as is
        return
    names: dict[int, list[str]] = {}  # a parameter's names (a tied head has two)
    for name, p in unwrap(model).named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for group in optimizer.param_groups:
        for p in group["params"]:
            held = [moments[n] for n in names.get(id(p), []) if n in moments]
            if not held and p.requires_grad and id(p) in names:
                raise ValueError(f"optimizer.pt holds no moments for {names[id(p)][0]}")
            for kept in held:
                if not isinstance(kept, dict):
                    raise TypeError(f"optimizer.pt: the state of {names[id(p)][0]} is a "
                                    f"{type(kept).__name__}")
                for key, value in kept.items():
                    _refuse_misshapen(key, value, p)


def _refuse_misshapen_moments(optimizer: torch.optim.Optimizer) -> None:
    """Each loaded moment (AdamW's averages, Muon's momentum) must have its parameter's shape:
    torch loads one of another shape without a word, and the first step then fails with an
    internal assertion, or broadcasts it silently, after the resume was announced."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                _refuse_misshapen(key, value, p)


def _refuse_misshapen(key: str, value: Any, p: torch.Tensor) -> None:
    """A moment `key` of parameter `p` (its whole shape, sharded or not) of another shape."""
    if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
        raise ValueError(f"optimizer.pt: {key!r} of a parameter of shape "
                         f"{tuple(p.shape)} has shape {tuple(value.shape)}")


def _place_steps(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> None:
    """torch placed each AdamW `step` by the checkpoint's fused / capturable flags; the
    group now has the config's, whose kernel expects its steps on the parameter's device
    (fused, capturable) or on the CPU (the others)."""
    on_device = bool(group.get("fused") or group.get("capturable"))
    for p in group["params"]:
        state = optimizer.state.get(p, {})
        step = state.get("step")
        if torch.is_tensor(step):
            state["step"] = step.to(p.device if on_device else "cpu", torch.float32)


# what the trainer's trainer.pt holds (callbacks: optional), and the types they must have
TRAINER_STATE = {"step": int, "tokens_seen": int, "elapsed_s": (int, float), "loader": dict,
                 "rng": torch.Tensor, "callbacks": dict, "format": int}


def _read_trainer_state(path: Path) -> dict[str, Any]:
    """trainer.pt, refused as unreadable where it unpickles but holds another type of
    thing than Kiln wrote (which keys a caller needs, it checks: `missing_state`)."""
    file = verified(path, "trainer.pt")
    try:
        state = torch.load(file, weights_only=True)
    except (OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as e:
        raise unreadable(path, e, "trainer.pt") from e
    if not isinstance(state, dict):
        raise unreadable(path, TypeError(f"trainer.pt holds a {type(state).__name__}, not a dict"))
    for key, kind in TRAINER_STATE.items():
        value = state.get(key)
        if key in state and (not isinstance(value, kind) or isinstance(value, bool)):
            raise unreadable(path, ValueError(f"trainer.pt: {key!r} is a {type(value).__name__}"))
    for key in ("step", "tokens_seen", "elapsed_s"):  # NaN fails `0 <=` too
        if isinstance(state.get(key), (int, float)) and not 0 <= state[key] < math.inf:
            raise unreadable(path, ValueError(f"trainer.pt: {key!r} is {state[key]}"))
    return state


def missing_state(path: Path, state: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Refuse a trainer state without `keys` as unreadable, naming the first one missing."""
    for key in keys:
        if key not in state:
            raise unreadable(path, ValueError(f"trainer.pt: {key!r} is missing"))


def trained_shards(path: Path) -> str | None:
    """The fingerprint of the token shards checkpoint `path` was trained on (None: saved
    before Kiln recorded it)."""
    return _read_trainer_state(path).get("loader", {}).get("data")


def load_weights(path: Path, model: nn.Module, checked: bool = False) -> None:
    """Weights only (eval, generate, export; and a resume's, `checked` against checksums.json
    already), refused if not finite."""
    tensors = _read_weights(path, checked)
    refuse_non_finite(tensors, path)
    load_model_tensors(model, tensors, path / "model.safetensors")
