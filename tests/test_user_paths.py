"""A researcher's first steps with their own data: the mistakes they make on the way are
one `kiln: ...` line that names the key or path and what to do, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_filters_quality import PROSE

from kiln.cli import main
from kiln.config import ConfigError, load_config
from kiln.data.documents import read_documents


def test_a_run_dir_under_a_file_is_a_config_error(tmp_path, monkeypatch, capsys):
    """`run.dir = "notes.txt/run"` used to crash with NotADirectoryError deep in prepare."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="lies under .*notes.txt', which is a file"):
        load_config(None, ['run.dir="notes.txt/run/deeper"'])
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.txt").write_text("some text\n")
    assert main(["prepare", "--set", 'run.dir="notes.txt/run"',
                 "--set", 'data.sources=["data"]']) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "which is a file, not a folder" in err
    load_config(None, ['run.dir="runs/new/deeper"'])  # folders not made yet are fine


def test_a_missing_relative_source_names_the_folder_it_was_looked_for_in(
        tmp_path, monkeypatch, capsys):
    """A recipe run from another folder: its relative source is looked for in the current
    folder, and the message says so (it used to say only `data source not found: 'data'`)."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
                 "--set", 'data.sources=["data"]']) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kiln: data.sources: 'data' does not exist")
    assert f"relative to the current folder {Path.cwd()}" in err and "\n" not in err
    missing = tmp_path / "nowhere"
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
                 "--set", f'data.sources=["{missing}"]']) == 1
    assert capsys.readouterr().err.strip() == \
        f"kiln: data.sources: '{missing}' does not exist"


def test_a_wildcard_source_says_wildcards_are_not_expanded(tmp_path, capsys):
    """`sources = ["data/*.jsonl"]` in a recipe: no shell expands it, and the message used to
    say only that the pattern does not exist, though the files it means do."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.jsonl").write_text('{"text": "A sentence of prose."}\n')
    pattern = f"{tmp_path}/data/*.jsonl"
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
                 "--set", f'data.sources=["{pattern}"]']) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kiln: data.sources: '{pattern}' does not exist")
    assert "wildcards are not expanded: name the folder" in err and "\n" not in err


def test_prepare_from_another_folder_resumes_the_same_sources(tmp_path, monkeypatch, capsys):
    """A recipe's relative source, prepared from its folder, then `kiln prepare RUN` from
    another folder (config.toml records the source absolute): the same sources and settings,
    so prepare resumes; it used to compare 'data' read against the new current folder, call
    them other sources and move the finished documents to archive/ to re-make them."""
    (tmp_path / "proj/data").mkdir(parents=True)
    (tmp_path / "proj/data/a.txt").write_text("A sentence of plain prose for the reader.\n")
    (tmp_path / "elsewhere").mkdir()
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "proj")
    assert main(["prepare", "--set", f'run.dir="{run}"', "--set", 'data.sources=["data"]',
                 "--set", 'prepare.stages=["read", "write"]', "--set", "prepare.tasks=1",
                 "--set", "prepare.workers=1"]) == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["prepare", str(run)]) == 0
    assert "moved to" not in capsys.readouterr().err
    assert not (run / "archive").exists()


def test_a_source_folder_without_files_is_named_with_what_is_read(tmp_path, capsys):
    """A folder holding nothing the reader looks at (an empty mount, only a .git) used to
    end in `skipped by reason: none counted`, as if every file had been skipped."""
    empty = tmp_path / "empty"
    for folder in (".git", "__pycache__"):
        (empty / folder).mkdir(parents=True)
        (empty / folder / "x.txt").write_text("not searched")
    sets = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", 'prepare.stages=["read", "write"]']
    assert main(["prepare", *sets, "--set", f'data.sources=["{empty}"]']) == 1
    err = capsys.readouterr().err
    assert "none counted" not in err
    assert (f"prepare read no documents from ['{empty}'] (no file found in '{empty}': "
            "hidden folders, __pycache__ and node_modules are not searched; the read stage "
            "reads text files (.txt, .md, source code") in err
    # beside a source that has documents: a warning, not an error
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.txt").write_text("some text\n")
    assert main(["prepare", *sets, "--set",
                 f'data.sources=["{empty}", "{tmp_path / "data"}"]']) == 0
    assert f"warning: data.sources: no file found in '{empty}': hidden" in capsys.readouterr().err


def test_an_empty_source_is_named_when_the_stages_drop_every_document(tmp_path, capsys):
    """An empty folder beside a file whose one document the quality filters drop: the
    'all dropped' error used to name the filters' reasons only, and the warning that names
    the empty source is never reached."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "short.txt").write_text("some text\n")  # too short for Gopher's prose rules
    sources = f'data.sources=["{tmp_path / "empty"}", "{tmp_path / "short.txt"}"]'
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"', "--set", sources,
                 "--set", 'prepare.stages=["read", "quality", "write"]',
                 "--set", "prepare.quality.domain=prose"]) == 1
    err = capsys.readouterr().err
    assert "documents read from" in err and "were dropped (quality: " in err
    assert f"data.sources: no file found in '{tmp_path / 'empty'}': hidden" in err


def test_two_prepares_in_one_process_with_a_relative_run_dir(tmp_path, monkeypatch):
    """fsspec caches datatrove's folders by the path as given: the second prepare of a
    relative run.dir, from another folder, found the first one's folders (its task marked
    done there) and failed, `did not complete every task`."""
    sets = ["--set", 'run.dir="run"', "--set", 'data.sources=["data"]',
            "--set", 'prepare.stages=["read", "write"]', "--set", "prepare.tasks=1",
            "--set", "prepare.workers=1"]
    for name in ("a", "b"):
        (tmp_path / name / "data").mkdir(parents=True)
        (tmp_path / name / "data/x.txt").write_text(f"the text of {name}\n")
        monkeypatch.chdir(tmp_path / name)
        assert main(["prepare", *sets]) == 0
    for name in ("a", "b"):  # and each is read back from its own folder
        monkeypatch.chdir(tmp_path / name)
        assert [d.text for d in read_documents("run")] == [f"the text of {name}\n"]


def _wrapped(paragraph: str, width: int = 60) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(paragraph, width))


MORE_PROSE = (
    "The museum keeps a small library of field notes written by the first excavators in the "
    "early years of the project.\n"
    "School groups visit in the spring, when the paths are dry and the wild flowers cover the "
    "lower terraces of the site.\n"
    "A new survey of the eastern bank is planned for next year, and volunteers from the nearby "
    "town have offered their help.")


JAVASCRIPT = "\n".join([
    "In JavaScript, a closure is a function that keeps the variables of the scope it was made in.",
    "Most JavaScript engines compile a hot function to machine code after it has run many times.",
    "A JavaScript promise stands for a value that will be known later, when the work is done.",
    "The JavaScript event loop runs one task at a time, so a long task blocks the whole page.",
    "Modules in modern JavaScript are loaded once, and every import sees the same instance.",
    "Strict mode in JavaScript turns some silent mistakes into errors that stop the script.",
    "Arrays in JavaScript may hold values of any type, and their length grows as you add items.",
    "Every JavaScript object has a prototype, which it asks for the properties it lacks itself.",
    "An arrow function in JavaScript takes its meaning of this from the code around it.",
    "JavaScript has no integer type of its own: numbers are doubles unless you ask for a BigInt.",
    "Template strings in JavaScript are written with backticks and may span several lines.",
    "The JavaScript spread syntax copies the items of an array into a new list or a call.",
])


@pytest.mark.parametrize("shape", ["one_line_a_paragraph", "hard_wrapped", "javascript"])
def test_prose_filters_that_cut_most_of_the_kept_text_are_warned_about(
        tmp_path, monkeypatch, capsys, shape):
    """C4's line rules keep a document but may delete most of it; nothing said so (no
    document was dropped, so no drop count or kept fraction showed it). An article about
    JavaScript loses every line naming it: warned. Hard-wrapped prose (a paragraph over many
    lines) keeps its lines since C4's terminal-punctuation rule is off, as in FineWeb (it
    deleted every line but each paragraph's last, and this test warned about it): not warned,
    like the same text one paragraph a line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    prose = PROSE + "\n" + MORE_PROSE  # one sentence a line: C4 keeps every line
    text = {"one_line_a_paragraph": prose,
            "hard_wrapped": "\n".join(_wrapped(line) for line in prose.splitlines()),
            "javascript": JAVASCRIPT + "\n" + PROSE}[shape]
    (tmp_path / "data/book.txt").write_text(text + "\n")
    assert main(["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
                 "--set", 'data.sources=["data"]',
                 "--set", 'prepare.stages=["read", "quality", "write"]',
                 "--set", 'prepare.quality.domain="prose"', "--set", "prepare.tasks=1",
                 "--set", "prepare.workers=1"]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "C4's line rules" in line]
    if shape == "javascript":
        assert len(warned) == 1 and warned[0].startswith("warning: quality: C4's line rules")
        assert "of the text of the documents they kept" in warned[0]
    else:
        assert warned == []
    [kept] = [d.text for d in read_documents(tmp_path / "run")]
    if shape == "hard_wrapped":  # every line of 3+ words kept, as written
        assert kept == "\n".join(line for line in text.splitlines() if len(line.split()) >= 3)


@pytest.mark.parametrize("override, suggested", [
    ("data.sources=[my_corpus/]", """--set 'data.sources=["my_corpus/"]'"""),
    ("data.sources=[a, 'b']", """--set 'data.sources=["a", "b"]'"""),
    ("data.sources=mine", """--set 'data.sources=["mine"]'"""),
    ("data.sources=[", "--set 'data.sources=[...]'"),
])
def test_a_list_written_with_bare_words_gets_the_list_it_meant(override, suggested):
    """`--set data.sources=[my_corpus/]` (the shell's own quoting forgotten) was told to
    write `["[my_corpus/]"]`: one source named with a bracket."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).endswith(f"(on the command line: {suggested})")


@pytest.mark.parametrize("override", ["=3", "train..steps=3", ".steps=3"])
def test_an_override_with_an_empty_key_part_is_malformed(override):
    """It was `unknown config key ''` (or 'train..steps')."""
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(None, [override])


def test_a_tilde_in_run_dir_or_sources_is_the_home_folder(tmp_path, monkeypatch, capsys):
    """`run.dir = "~/runs/mine"` in a recipe (or a quoted --set) made a folder named `~` in
    the current one, and `data.sources = ["~/corpus"]` was not found, 'relative to the
    current folder'."""
    home, here = tmp_path / "home", tmp_path / "here"
    (home / "corpus").mkdir(parents=True)
    (home / "corpus/a.txt").write_text("some text\n")
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    cfg = load_config(None, ['run.dir="~/runs/mine"', 'data.sources=["~/corpus"]'])
    assert cfg.run_dir == home / "runs/mine" and cfg.data.sources == [str(home / "corpus")]
    assert main(["prepare", "--set", 'run.dir="~/runs/mine"', "--set", 'data.sources=["~/corpus"]',
                 "--set", 'prepare.stages=["read", "write"]', "--set", "prepare.tasks=1"]) == 0
    assert list(here.iterdir()) == []
    assert [d.text for d in read_documents(home / "runs/mine")] == ["some text\n"]


def test_a_tilde_in_every_path_setting_is_the_home_folder(tmp_path, monkeypatch):
    """The stages' files and folders too (benchmarks, the perplexity run, a tokenizer, the
    arXiv snapshot and sources): `~/bench/gsm8k.jsonl` was 'file not found'. A `~` past the
    start, or in a setting that is not a path, stays as written."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, [
        'prepare.stages=["read", "decontaminate", "perplexity", "perplexity_select", '
        '"brain_rot_m1", "write"]',
        'prepare.decontaminate.benchmarks=["~/b/gsm8k.jsonl", "b/~x.jsonl"]',
        'prepare.perplexity.run_dir="~/runs/scorer"', "prepare.perplexity.fraction=0.5",
        'prepare.brain_rot_m1.tokenizer="~/tok.json"', 'generate.prompts=["~/x"]'])
    p = cfg.prepare
    assert p.decontaminate.benchmarks == [str(tmp_path / "b/gsm8k.jsonl"), "b/~x.jsonl"]
    assert p.perplexity.run_dir == str(tmp_path / "runs/scorer")
    assert p.brain_rot_m1.tokenizer == str(tmp_path / "tok.json")
    assert cfg.generate.prompts == ["~/x"]
    judge = load_config(None, ['prepare.stages=["read", "brain_rot_m2", "write"]',
                               'prepare.brain_rot_m2.judge="kiln:~/runs/judge"'])
    assert judge.prepare.brain_rot_m2.judge == f"kiln:{tmp_path / 'runs/judge'}"
    arxiv = load_config(None, [
        'prepare.stages=["arxiv_metadata", "arxiv_sources", "latex", "inject_replicas", "write"]',
        'prepare.arxiv.snapshot="~/meta.jsonl"', 'prepare.arxiv.source_dir="~/src"',
        'prepare.inject_replicas.benchmark="~/b/math.jsonl"']).prepare
    assert (arxiv.arxiv.snapshot, arxiv.arxiv.source_dir, arxiv.inject_replicas.benchmark) == (
        str(tmp_path / "meta.jsonl"), str(tmp_path / "src"), str(tmp_path / "b/math.jsonl"))


def test_a_val_split_far_over_val_fraction_is_warned_about(tmp_path, capsys):
    """Two files of the same size with data.val_fraction = 0.05: the split is by whole
    document, so one of them, half the text, went to val without a word, and training
    saw half the data the user gave."""
    (tmp_path / "data").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "data" / name).write_text(f"{name}\n{PROSE}")
    sets = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", f'data.sources=["{tmp_path / "data"}"]',
            "--set", 'prepare.stages=["read", "write"]', "--set", "prepare.tasks=1",
            "--set", "tokenizer.vocab_size=300", "--set", "data.val_fraction=0.05"]
    for verb in ("prepare", "tokenizer", "tokenize"):
        assert main([verb, *sets]) == 0
    err = capsys.readouterr().err
    assert "warning: the val split holds 5" in err or "warning: the val split holds 4" in err
    assert "(data.val_fraction = 0.05): the split is by whole document (1 of 2 documents in " \
        "val)" in err
    assert main(["tokenize", str(tmp_path / "run"), "--set", "data.val_fraction=0.5"]) == 0
    assert "the val split holds" not in capsys.readouterr().err  # what was asked for


def test_a_prepare_run_again_says_it_kept_the_documents(tmp_path, capsys):
    """`kiln tokenizer` and `kiln tokenize` say "kept" when they keep their outputs; a
    prepare run again with the same settings skipped every task and printed its summary as
    if it had read everything again."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.txt").write_text(PROSE)
    sets = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", f'data.sources=["{tmp_path / "data"}"]',
            "--set", 'prepare.stages=["read", "write"]', "--set", "prepare.tasks=1"]
    assert main(["prepare", *sets]) == 0
    assert "prepare: kept" not in capsys.readouterr().err
    assert main(["prepare", *sets]) == 0
    assert f"prepare: kept {tmp_path / 'run' / 'documents'} (every task finished before" in \
        capsys.readouterr().err
    assert main(["prepare", *sets, "--set", "prepare.resume=false"]) == 0
    assert "prepare: kept" not in capsys.readouterr().err


def test_a_tilde_in_the_counting_tokenizers_is_the_home_folder(tmp_path, monkeypatch):
    """prepare.inject_replicas.tokenizer (new) and prepare.brain_rot_arms.tokenizer name a
    file as brain_rot_m1.tokenizer does, and were left out of the path settings: a recipe's
    '~/tok/tokenizer.json' was looked for in a folder named '~'."""
    monkeypatch.setenv("HOME", str(tmp_path))
    inject = load_config(None, [
        'prepare.stages=["read", "inject_replicas", "write"]',
        'prepare.inject_replicas.benchmark="~/b/math.jsonl"',
        "prepare.inject_replicas.keep_size=true",
        'prepare.inject_replicas.tokenizer="~/tok/tokenizer.json"']).prepare.inject_replicas
    assert inject.tokenizer == str(tmp_path / "tok/tokenizer.json")
    arms = load_config(None, [
        'prepare.stages=["read", "brain_rot_m2", "brain_rot_arms", "write"]',
        'prepare.brain_rot_m2.mode="tag"',
        'prepare.brain_rot_arms.tokenizer="~/tok/tokenizer.json"']).prepare.brain_rot_arms
    assert arms.tokenizer == str(tmp_path / "tok/tokenizer.json")
