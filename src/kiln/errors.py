"""Errors the `kiln` command reports as one clear line (no traceback); torch-free to import."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

_ALIKE = "kiln_alike_on_every_rank"


class KilnError(Exception):
    """A problem with the user's run, data or setup that a message can explain."""


class ConfigError(KilnError, ValueError):
    """A configuration problem, with the offending key in the message."""


class CheckpointError(KilnError, RuntimeError):
    """A checkpoint that cannot be used: unreadable, or made for another model or data."""


class ResumeRefused(ConfigError, CheckpointError):
    """Settings a trained run's checkpoint cannot go on with (another model, optimizer or
    data): the user's settings refused, so a config error (exit status 2, as `kiln eval`
    and the data verbs refuse such settings), and a CheckpointError still, as before."""


class RunDataError(KilnError, ValueError):
    """A file an earlier stage wrote (tokenizer, shard index) that is damaged: re-run that stage."""


class NoDocumentsError(KilnError, ValueError):
    """Prepare left no documents: every input was skipped or every document dropped (the
    message gives the counts by reason). The data, not a setting, is usually the cause."""


class InputTooLargeError(KilnError, RuntimeError):
    """A source file, or a value in one, that must be held whole to be read (a .json that is
    one record or JSONC, a long string in a .json) and that this machine's free memory
    cannot hold: refused before it is held, not killed midway."""


class TrainingDiverged(KilnError, RuntimeError):
    """The loss, gradient norm or logits stopped being finite (NaN or inf): the weights are
    poisoned, so training stops before it checkpoints them."""


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C, SIGTERM or SIGHUP after saving a checkpoint of `step`
    (`kiln.train.stop_signals`): a KeyboardInterrupt, so a `kiln run` stops its chain."""

    def __init__(self, step: int, signal_name: str, checkpoints: str) -> None:
        super().__init__(f"stopped on {signal_name} after step {step}; a checkpoint of that "
                         f"step is in {checkpoints}")
        self.step = step
        self.exit_code = signal_exit_code(signal_name)


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP: a terminal hung up) outside training (`kiln.interrupts`): the
    command stops as on Ctrl-C, with the exit status of a process ended by that signal
    (128 + 15; 128 + 1)."""

    def __init__(self, signal_name: str = "SIGTERM") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_code = signal_exit_code(signal_name)


def signal_exit_code(signal_name: str) -> int:
    """128 + the signal's number, as a shell reports a process that signal ended."""
    return 128 + signal.Signals[signal_name]


class MainRankInterrupted(KeyboardInterrupt):
    """Rank 0 was interrupted (Ctrl-C, SIGTERM) in work the other ranks waited for (the
    data stages, a checkpoint write): raised on those ranks, so that they stop as rank 0
    does, with its exit code, rather than hang or fail in a collective it left."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextmanager
def alike_on_every_rank() -> Iterator[None]:
    """Mark what is raised inside as an error every rank of a torchrun meets alike: one
    from the settings and the run directory's files alone, met before the ranks' work
    differs. The `kiln` command says it once per node, not once per rank (the same line
    N times reads as N problems); an error of one rank's own is still said by that rank."""
    try:
        yield
    except Exception as e:
        marked_alike(e)
        raise


E = TypeVar("E", bound=BaseException)


def marked_alike(e: E) -> E:
    """`e`, marked as met alike on every rank (`alike_on_every_rank`): for an error made
    before it is raised."""
    setattr(e, _ALIKE, True)
    return e


def met_alike_on_every_rank(e: BaseException) -> bool:
    return getattr(e, _ALIKE, False)
