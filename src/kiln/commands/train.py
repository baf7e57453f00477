"""`kiln train`: the trainer under the run's training lock, its process group closed after."""

from __future__ import annotations

from contextlib import nullcontext

from kiln.config import Config


def cmd_train(cfg: Config, resume: bool = True) -> None:
    from kiln.parallel.distributed import is_main_process
    from kiln.run_dir import training_lock

    # rank 0 speaks for the run (the other ranks of a torchrun share its lock)
    lock = training_lock(cfg.run_dir) if is_main_process() else nullcontext()
    with lock:
        _train(cfg, resume)


def _train(cfg: Config, resume: bool) -> None:
    from kiln.parallel.distributed import shutdown
    from kiln.train.trainer import Trainer

    # first: a setting it refuses leaves the run alone (--fresh archives when training starts)
    try:
        trainer = Trainer(cfg, resume=resume)
    except BaseException:  # a resume refused or stopped: the group it joined is left too
        shutdown(None)
        raise
    try:
        trainer.fit()
    finally:
        shutdown(trainer.env)
