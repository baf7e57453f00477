"""A generated sample's text: a stop that cuts a multi-byte character short leaves it out
(and says so) rather than ending the text with U+FFFD."""

from __future__ import annotations

import json

import pytest

from kiln.data.sample_text import decode_sample, sample_bytes
from kiln.data.tokenizer import eos_id, train_tokenizer

ASCII = ["def add(a, b):\n    return a + b\n", "x = [i * i for i in range(10)]\n"] * 20


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """Trained on ASCII alone: every byte of a non-ASCII character is a token of its own."""
    return train_tokenizer(ASCII, 300, tmp_path_factory.mktemp("tok") / "t.json",
                           show_progress=False)


@pytest.mark.parametrize("text", ["def f(x):\n    return x", "naïve 東京 🚀 done", "", "é"])
def test_a_whole_sample_decodes_as_the_tokenizer_does(tok, text):
    ids = tok.encode(text).ids
    assert sample_bytes(tok, ids) == text.encode("utf-8")
    assert decode_sample(tok, ids) == (tok.decode(ids, skip_special_tokens=False), 0) == (text, 0)
    eos = eos_id(tok)
    with_eos = [*ids, eos]
    assert decode_sample(tok, with_eos, eos) == (tok.decode(with_eos, skip_special_tokens=False), 0)


def test_a_stop_inside_a_character_leaves_its_bytes_out_and_counts_them(tok):
    ids = tok.encode("ok 東").ids  # 東 is three byte tokens
    assert [len(sample_bytes(tok, [i])) for i in ids[-3:]] == [1, 1, 1]
    for cut in (1, 2):
        kept = ids[: len(ids) - 3 + cut]
        assert "\ufffd" in tok.decode(kept)  # what the sample used to end with
        assert decode_sample(tok, kept) == ("ok ", cut)
        eos = eos_id(tok)  # the model ended the document there: the same, then EOS's text
        assert decode_sample(tok, [*kept, eos], eos) == ("ok <|endoftext|>", cut)


def test_invalid_bytes_the_model_wrote_stay_visible(tok):
    lone = tok.encode("東").ids[1]  # a continuation byte with no start: the model's own error
    assert decode_sample(tok, [*tok.encode("a").ids, lone, *tok.encode("b").ids]) == ("a\ufffdb", 0)


@pytest.mark.parametrize("char", ["🚀", "ʬ"])  # 4 bytes; 2, one of them left: "1 byte is"
def test_generate_records_and_reports_a_sample_cut_inside_a_character(tiny_run, monkeypatch,
                                                                     capsys, char):
    """`kiln generate`'s printed text, samples.json and the report agree: the half
    character is left out, and each says how many bytes were (one byte: "1 bytes ... are"
    until the wording counted)."""
    from conftest import tiny_config

    import kiln.model.sampling
    from kiln.cli import cmd_generate, cmd_report
    from kiln.data.tokenizer import load_tokenizer
    from kiln.train.trainer import Trainer

    Trainer(tiny_config(tiny_run, "train.steps=2")).fit()
    run_tok = load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json")
    ids = run_tok.encode(f" {char}").ids
    width = len(char.encode("utf-8"))
    assert len(sample_bytes(run_tok, ids[-1:])) < width  # cut by dropping its last id
    monkeypatch.setattr(kiln.model.sampling, "generate", lambda *a, **k: ids[:-1])
    cfg = tiny_config(tiny_run, 'generate.prompts=["def"]')
    capsys.readouterr()
    cmd_generate(cfg)
    printed = capsys.readouterr()
    (sample,) = json.loads((tiny_run / "samples.json").read_text(encoding="utf-8"))
    dropped = width - len(sample_bytes(run_tok, ids[-1:]))
    assert sample["completion"] == " " and sample["incomplete_bytes_dropped"] == dropped
    assert "\ufffd" not in printed.out and printed.out.endswith("def \n")
    said = (f"its last {dropped} bytes (an incomplete UTF-8 character) are" if dropped > 1
            else "its last 1 byte (an incomplete UTF-8 character) is")
    assert said in printed.err
    cmd_report(cfg)
    html = (tiny_run / "report.html").read_text(encoding="utf-8")
    assert "\ufffd" not in html and said in html


def test_a_sample_the_console_cannot_encode_is_printed_escaped_and_kept(tiny_run,
                                                                          monkeypatch):
    """stdout in ASCII (a Latin-1 or C locale, a redirect on Windows): the sample's
    characters outside it are printed as escapes, not a UnicodeEncodeError that stopped
    `kiln generate` before samples.json; the file keeps the text itself."""
    import io

    from conftest import tiny_config

    import kiln.model.sampling
    from kiln.cli import cmd_generate
    from kiln.data.tokenizer import load_tokenizer
    from kiln.train.trainer import Trainer

    Trainer(tiny_config(tiny_run, "train.steps=2")).fit()
    run_tok = load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json")
    monkeypatch.setattr(kiln.model.sampling, "generate",
                        lambda *a, **k: run_tok.encode(" café \ufffd").ids)
    console = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr("sys.stdout", console)
    cmd_generate(tiny_config(tiny_run, 'generate.prompts=["déf"]'))
    console.flush()
    printed = console.buffer.getvalue().decode("ascii")
    assert printed == "--- 'd\\xe9f'\nd\\xe9f caf\\xe9 \\ufffd\n"
    (sample,) = json.loads((tiny_run / "samples.json").read_text(encoding="utf-8"))
    assert sample["prompt"] == "déf" and sample["completion"] == " café \ufffd"
