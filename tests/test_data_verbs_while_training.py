"""The data verbs and `kiln run` leave a run alone while a trainer holds its lock: before the
trainer's first checkpoint nothing else stopped them re-making its tokenizer, shards and
config.toml under it."""

from __future__ import annotations

from kiln.cli import main
from kiln.run_dir import training_lock


def test_data_verbs_are_refused_while_the_run_trains(tiny_run, capsys):
    tokenizer = tiny_run / "tokenizer" / "tokenizer.json"
    before = {p: p.read_bytes() for p in (tokenizer, tiny_run / "config.toml",
                                          tiny_run / "tokens" / "index.json")}
    with training_lock(tiny_run):  # a `kiln train` of this run, before its first checkpoint
        for verb in ("tokenizer", "tokenize", "prepare", "run"):
            code = main([verb, str(tiny_run), "--set", "tokenizer.vocab_size=300"])
            err = capsys.readouterr().err
            assert code == 1, (verb, err)
            assert f"{tiny_run} is being trained by pid" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before  # the trainer's data, as it was
    with training_lock(tiny_run):
        pass  # the refusals left no lock behind: a trainer still takes it


def test_a_trainer_starting_while_a_data_verb_looks_is_not_refused(tmp_path):
    """`refuse_while_training` takes a shared lock on .train.lock for a moment: a trainer
    starting in that moment was refused as "being trained by" the pid the file last named
    (a trainer long gone), though no trainer held the run. A real trainer's lock, held for
    the whole run, is still refused."""
    import fcntl
    import threading

    import pytest

    from kiln.errors import KilnError

    (tmp_path / ".train.lock").write_text("pid 1 on elsewhere")
    looker = open(tmp_path / ".train.lock", encoding="utf-8")  # as refuse_while_training does
    fcntl.flock(looker, fcntl.LOCK_SH | fcntl.LOCK_NB)
    done = threading.Timer(0.2, looker.close)  # the look ends (closing the file drops the lock)
    done.start()
    try:
        with training_lock(tmp_path):
            pass
    finally:
        done.join()
    with training_lock(tmp_path), pytest.raises(KilnError, match="is being trained by pid"):
        with training_lock(tmp_path):
            pass
