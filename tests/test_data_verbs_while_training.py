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
