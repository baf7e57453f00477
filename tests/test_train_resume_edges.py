"""Starting and resuming `kiln train` at the edges: a full disk before step 1, a damaged
`latest` pointer, settings changed on resume that move the validation curve."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from kiln.errors import CheckpointError
from kiln.train.trainer import Trainer


def test_a_full_disk_when_the_run_records_its_settings_is_one_clear_error(tiny_run, monkeypatch):
    """config.toml, env.json and model.json are written before step 1: a full disk there is
    the checkpoint writers' one-line error naming the checkpoint kept, not a traceback."""
    import kiln.run_dir as run_dir_module

    Trainer(tiny_config(tiny_run, "train.steps=6")).fit()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_dir_module, "write_text_atomic", full)
    trainer = Trainer(tiny_config(tiny_run, "train.steps=12"))
    with pytest.raises(CheckpointError, match=r"cannot write the run's config.toml.*No space left"
                       r".*the last checkpoint, step_00000006, is intact"):
        trainer.fit()
    assert trainer.step == 6  # nothing trained past the checkpoint
