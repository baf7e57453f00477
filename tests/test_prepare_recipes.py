"""`kiln prepare` from recipes, end to end: every stage wired, yield adds up, resume, errors."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep
from test_arxiv_pipeline import tar_gz

from kiln.cli import cmd_prepare, cmd_tokenize, cmd_tokenizer, main
from kiln.config import ConfigError, config_to_toml, load_config
from kiln.data import pipeline as pl
from kiln.data import prepare_config as pc
from kiln.data import stage_registry
from kiln.data.documents import read_documents
from kiln.data.filters.selection import threshold_for_fraction
from kiln.data.pipeline import PrepareConfig, register_stage, run_prepare

ROOT = Path(__file__).resolve().parents[1]
LATEX = ROOT / "tests" / "fixtures" / "latex"
TOPICS = ["spectral gaps", "random walks", "convex bodies", "prime gaps", "knot invariants",
          "sparse graphs"]
EMAIL = "jane.roe@uni-example.org"
LEAK = ("the answer to the benchmark question is that every bounded monotone sequence of real "
        "numbers converges to its supremum")


def prose(topic: str, extra: str = "") -> str:
    """Varied English paragraphs (so the latex quality filters keep the paper)."""
    rng = random.Random(topic)
    words = ["careful", "simple", "classical", "recent", "natural", "explicit", "uniform",
             "general", "surprising", "elementary", "precise", "robust"]
    sentences = [f"In this section we study {topic} and explain why the {rng.choice(words)} "
                 f"approach works for all of them.",
                 f"The main idea is to compare {topic} with a {rng.choice(words)} model that "
                 "has been understood for a long time.",
                 f"We show that the estimate is {rng.choice(words)} and that it cannot be "
                 "improved in general, which answers a question raised by several authors.",
                 "Our argument uses only a few tools, and each of them is explained with an "
                 "example before it is applied.",
                 f"Finally we discuss open problems about {topic} that seem to be within reach "
                 "of these methods.", extra]
    return "\n\n".join(s for s in sentences if s) + "\n"


def paper_files(topic: str, extra: str = "") -> dict[str, str]:
    main_tex = (LATEX / "paper" / "main.tex").read_text()
    main_tex = main_tex.replace("\\bibliographystyle", prose(topic, extra) + "\\bibliographystyle")
    return {"main.tex": main_tex,
            "sections/intro.tex": (LATEX / "paper" / "sections" / "intro.tex").read_text(),
            "paper-macros.sty": (LATEX / "paper" / "paper-macros.sty").read_text()}


GERMAN = ("In diesem Abschnitt untersuchen wir die Verteilung der Primzahlen in kurzen "
          "Intervallen und erklären, warum der klassische Ansatz für alle Fälle funktioniert. "
          "Die Hauptidee besteht darin, die Lücken mit einem Modell zu vergleichen, das seit "
          "langer Zeit verstanden wird. Wir zeigen, dass die Abschätzung scharf ist und im "
          "Allgemeinen nicht verbessert werden kann, was eine Frage mehrerer Autoren beantwortet.")


def lecture_tex(topic: str) -> str:
    return (LATEX / "lecture.tex").read_text().replace("\\end{document}",
                                                       prose(topic) + "\\end{document}")


def record(arxiv_id: str, title: str, **over) -> dict:
    abstract = f"We study {title.lower()} with methods from analysis and combinatorics, " \
               "prove sharp estimates and give several applications to related questions here."
    base = {"id": arxiv_id, "categories": "math.CA", "abstract": abstract, "comments": "",
            "title": title, "versions": [{"created": "Mon, 4 Jan 2021 10:00:00 GMT"}]}
    return {**base, **over}


def build_arxiv_corpus(root: Path) -> dict:
    """Snapshot + archives + benchmark; returns the expected per-reason counts."""
    src = root / "src"
    src.mkdir(parents=True)
    (src / "2101.00001.tar.gz").write_bytes(tar_gz(paper_files(TOPICS[0])))
    (src / "2101.00002.gz").write_bytes(gzip.compress(lecture_tex(TOPICS[1]).encode()))
    (src / "2101.00003.tar.gz").write_bytes(tar_gz(paper_files(TOPICS[0])))  # = 00001
    (src / "2101.00004.tar.gz").write_bytes(tar_gz(paper_files(TOPICS[3], LEAK + ".")))
    (src / "2101.00005.tar.gz").write_bytes(b"this is not an archive at all")
    (src / "2101.00006.tar.gz").write_bytes(tar_gz({"../../evil.tex": "\\documentclass{x}"}))
    (src / "2101.00007.tar.gz").write_bytes(
        tar_gz(paper_files(TOPICS[5], f"Questions are welcome at {EMAIL} any time.")))
    (src / "2101.00011.gz").write_bytes(gzip.compress(  # German: the language stage drops it
        lecture_tex(TOPICS[2]).replace(prose(TOPICS[2]), "\n\n".join([GERMAN] * 3)).encode()))
    title = "Sharp bounds for smooth operators"
    records = [
        record("2101.00001", title), record("2101.00002", "Lectures on random walks"),
        record("2101.00003", title), record("2101.00004", "Prime gaps revisited"),
        record("2101.00005", "A broken upload"), record("2101.00006", "A hostile upload"),
        record("2101.00007", "Sparse graphs"), record("2101.00008", "Missing source paper"),
        record("2101.00009", "Withdrawn", comments="This paper has been withdrawn"),
        record("2101.00010", "Astro", categories="astro-ph.GA"),
        record("2101.00011", "Primzahlen in kurzen Intervallen", abstract=GERMAN),
        record("math/0501001", "Too old", versions=[{"created": "Mon, 3 Jan 2005 10:00:00 GMT"}]),
    ]
    lines = [json.dumps(r) for r in records] + ["{not json"]
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    bench = {"question": "What can be said about bounded monotone sequences of reals?",
             "answer": LEAK}
    (root / "benchmark.jsonl").write_text(json.dumps(bench) + "\n")
    return {"metadata_withdrawn": 1, "metadata_category": 1, "metadata_year": 1,
            "metadata_bad_json": 1}


def arxiv_config(root: Path, run_dir: Path, *extra: str):
    return load_config(ROOT / "recipes" / "arxiv-tiny.toml", [
        f'run.dir="{run_dir}"', f'prepare.arxiv.snapshot="{root / "metadata.jsonl"}"',
        f'prepare.arxiv.source_dir="{root / "src"}"',
        f'prepare.decontaminate.benchmarks=["{root / "benchmark.jsonl"}"]', *extra])


def check_yield_adds_up(rows: list[dict]) -> None:
    for prev, row in zip([None, *rows], rows, strict=False):
        assert row["documents_in"] + row["documents_added"] == (
            row["documents_out"] + row["documents_dropped"]), row
        assert sum(row["drop_reasons"].values()) == row["documents_dropped"], row
        if prev is not None:
            assert row["documents_in"] == prev["documents_out"]
            assert row["bytes_in"] == prev["bytes_out"]


@pytest.fixture(scope="module")
def arxiv_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("arxiv")
    expected = build_arxiv_corpus(root / "corpus")
    cfg = arxiv_config(root / "corpus", root / "run")
    cmd_prepare(cfg)
    return root, cfg, expected


def test_arxiv_recipe_yield_adds_up(arxiv_run):
    root, cfg, expected = arxiv_run
    y = json.loads((cfg.run_dir / "yield.json").read_text())
    rows = {r["stage"]: r for r in y["stages"]}
    assert list(rows) == cfg.prepare.stages
    check_yield_adds_up(y["stages"])
    meta = rows["arxiv_metadata"]
    assert meta["documents_in"] == 13 and meta["documents_out"] == 9
    assert meta["drop_reasons"] == expected
    assert rows["arxiv_sources"]["drop_reasons"] == {  # 00008, 00005 (garbage), 00006 (../..)
        "missing_source": 1, "empty_tex_not_latex": 1, "empty_tex_no_tex_file": 1}
    assert rows["latex"]["documents_out"] == 6
    assert rows["language"]["drop_reasons"] == {"other_language": 1}  # 00011, in German
    assert rows["dedup_exact"]["drop_reasons"] == {"duplicate": 1}
    assert rows["quality"]["documents_dropped"] == 0
    assert rows["decontaminate"]["drop_reasons"] == {"contaminated": 1}
    docs = {d.id: d for d in read_documents(cfg.run_dir)}
    assert len(docs) == y["documents_out"] == 3
    assert set(docs) <= {"2101.00001", "2101.00003", "2101.00002", "2101.00007"}
    paper = docs["2101.00007"].text
    assert EMAIL not in paper and "<EMAIL>" in paper and docs["2101.00007"].metadata["pii"]["EMAIL"]
    assert paper.startswith("Title: Sparse graphs\nAbstract: We study sparse graphs")
    assert "\\frac{" in paper  # math kept as LaTeX (the \half macro expanded)
    assert all(LEAK not in d.text for d in docs.values())


def test_math_tokenizer_after_arxiv_prepare(arxiv_run, tmp_path):
    _, cfg, _ = arxiv_run
    cmd_tokenizer(cfg)
    tok = json.loads((cfg.run_dir / "tokenizer" / "tokenizer.json").read_text())
    assert "\\frac" in tok["model"]["vocab"]  # a seeded LaTeX command is one token
    from kiln.data.tokenizer import load_tokenizer

    t = load_tokenizer(cfg.run_dir / "tokenizer" / "tokenizer.json")
    assert [t.decode([i]) for i in t.encode("x=2024", add_special_tokens=False).ids][-4:] == list(
        "2024")  # digits split
    cmd_tokenize(cfg)
    y = json.loads((cfg.run_dir / "yield.json").read_text())
    index = json.loads((cfg.run_dir / "tokens" / "index.json").read_text())
    assert y["tokenize"]["tokens"] == index["train"]["tokens"] + index["val"]["tokens"] > 0


def test_a_folder_of_papers_is_dated_by_id_before_the_conversion(tmp_path):
    """`arxiv_sources` read first gives a paper no text until `latex`, but its arXiv id dates
    it: `dating` and `period` there drop the papers out of the period before any is
    converted (they were refused with the stages that judge text, which need `latex`)."""
    root = tmp_path / "corpus"
    build_arxiv_corpus(root)
    (root / "src" / "0901.00001.tar.gz").write_bytes(tar_gz(paper_files(TOPICS[1])))
    cfg = load_config(None, [
        'prepare.stages=["arxiv_sources", "dating", "period", "latex", "write"]',
        f'prepare.arxiv.source_dir="{root / "src"}"', 'prepare.period.periods=["2021-2021"]',
        "prepare.tasks=1"]).prepare
    run_prepare(cfg, tmp_path / "run", progress=False)
    docs = {d.id: d for d in read_documents(tmp_path / "run")}
    assert "0901.00001" not in docs and "2101.00001" in docs  # 2009: dropped unconverted
    assert {d.metadata["year"] for d in docs.values()} == {2021}
    assert docs["2101.00001"].text.startswith("Title:")


# ---- a plain-text corpus through barrier stages ------------------------------------------------

def text_corpus(root: Path, n: int = 9) -> Path:
    """n files of ~70 distinct words; files 3 and 7 repeat files 1 and 2 (exact duplicates)."""
    src = root / "src"
    src.mkdir()
    texts = []
    for i in range(n):
        rng = random.Random(i)
        words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 8)))
                 for _ in range(70)]  # letters only: MinHash normalises digits away
        texts.append(f"document {i} says " + " ".join(words) + f" contact admin{i}@corp-mail.com")
    texts[3], texts[7] = texts[1], texts[2]
    for i, text in enumerate(texts):
        (src / f"f{i}.txt").write_text(text)
    return src


def _texts(run_dir: Path) -> list[str]:
    return sorted(d.text for d in read_documents(run_dir))


STREAM = ["read", "quality", "pii", "dedup_exact", "write"]


def test_one_and_two_tasks_same_output_with_dedup(tmp_path):
    src = text_corpus(tmp_path)
    ys = []
    for tasks in (1, 2):
        cfg = PrepareConfig(stages=STREAM, tasks=tasks)
        run_prepare(cfg, tmp_path / f"t{tasks}", [str(src)], progress=False)
        ys.append(json.loads((tmp_path / f"t{tasks}" / "yield.json").read_text()))
    assert _texts(tmp_path / "t1") == _texts(tmp_path / "t2")
    texts = _texts(tmp_path / "t1")
    assert len(texts) == len(set(texts)) == 7 and all("@corp-mail.com" not in t for t in texts)
    assert ys[0]["stages"] == ys[1]["stages"]
    rows = {r["stage"]: r for r in ys[0]["stages"]}
    assert rows["dedup_exact"]["drop_reasons"] == {"duplicate": 2}
    check_yield_adds_up(ys[0]["stages"])


def test_the_default_stages_dedup_the_final_text(tmp_path):
    """Exact dedup runs on the text as written (the arXiv digest: MD5 of the final text):
    two files that differ only in a redacted email are one document, not two copies of
    `Maintainer contact: <EMAIL>`."""
    src = tmp_path / "src"
    src.mkdir()
    body = "A maintained module of the project with several words of useful text. " * 12
    for i, who in enumerate(("dagny.holm@fjordmail.no", "ivo.brandt@weberpost.de")):
        (src / f"f{i}.txt").write_text(f"{body}\nMaintainer contact: {who}\n")
    assert pc.DEFAULT_STAGES.index("pii") < pc.DEFAULT_STAGES.index("dedup_exact")
    run_prepare(PrepareConfig(stages=pc.DEFAULT_STAGES, tasks=1), tmp_path / "run",
                [str(src)], progress=False)
    assert [t.count("<EMAIL>") for t in _texts(tmp_path / "run")] == [1]


def test_resume_of_a_completed_run_skips_every_task(tmp_path, monkeypatch):
    src = text_corpus(tmp_path)
    run = tmp_path / "run"
    cfg = PrepareConfig(stages=STREAM, tasks=2)
    first = run_prepare(cfg, run, [str(src)], progress=False)
    stats = sorted((run / "logs/prepare").rglob("stats/*.json"))
    before = {p: p.read_bytes() for p in stats}
    docs_mtime = {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()}
    yield_before = (run / "yield.json").read_text()
    # changed behind the input fingerprint's back (blinded here: a real fingerprint sees any
    # edit and re-runs prepare from scratch): a skipped task never sees it
    from kiln.data import prepare_inputs, prepare_signature

    recorded = prepare_inputs.input_files(cfg, [str(src)], run)
    # where the signature looks it up (build_pipeline's, and a run's recorded by mtime)
    monkeypatch.setattr(prepare_signature, "input_files", lambda *a, **k: recorded)
    f0 = src / "f0.txt"
    st = f0.stat()
    f0.write_text("changed after the run".ljust(st.st_size, "!"))
    os.utime(f0, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = run_prepare(cfg, run, [str(src)], progress=False)
    assert again == first and (run / "yield.json").read_text() == yield_before
    assert {p: p.read_bytes() for p in stats} == before and len(stats) >= 5
    assert {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()} == docs_mtime
    # one task of the last phase "crashed": only it re-runs, from the intermediate documents
    last = sorted((run / "logs/prepare/phases").iterdir())[-1]
    (last / "completions" / "00001").unlink()
    (last / "stats" / "00001.json").unlink()
    assert run_prepare(cfg, run, [str(src)], progress=False) == first
    assert "changed after the run" not in " ".join(_texts(run))


def test_options_of_a_stage_that_does_not_run_change_no_data(tmp_path):
    """A recipe's `[prepare.decontaminate] n` (or `[prepare.arxiv]`) with no such stage made
    no document: another value re-made the same documents (prepare did not resume) and
    refused a trained run's resume as 'trained with other settings'; a stage that runs
    still counts."""
    from kiln.config import data_changes

    src = text_corpus(tmp_path)
    run = tmp_path / "run"
    cfg = PrepareConfig(stages=STREAM, tasks=1)
    run_prepare(cfg, run, [str(src)], progress=False)
    docs_mtime = {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()}
    inert = PrepareConfig(stages=STREAM, tasks=1)
    inert.decontaminate.n, inert.arxiv.min_year = 8, 2000
    run_prepare(inert, run, [str(src)], progress=False)
    assert {p: p.stat().st_mtime_ns for p in (run / "documents").iterdir()} == docs_mtime
    old = load_config(None, ['prepare.stages=["read", "quality", "write"]'])
    new = load_config(None, ['prepare.stages=["read", "quality", "write"]',
                             "prepare.decontaminate.n=8", "prepare.arxiv.min_year=2000"])
    assert data_changes(old, new) == []
    assert data_changes(old, load_config(None, ['prepare.stages=["read", "quality", "write"]',
                                                "prepare.quality.domain=prose"])) == [
        "prepare.quality.domain: 'code' -> 'prose'"]


def test_minhash_drops_near_duplicates_through_the_pipeline(tmp_path):
    """2 and 1 tasks keep the same documents; the 1-task re-run of the same run directory starts
    over, so the 2-task run's stale signatures do not mix in."""
    src = text_corpus(tmp_path)
    base = (src / "f4.txt").read_text()
    (src / "f8.txt").write_text(base.replace("document 4 says", "document 4 said"))  # near dup
    outs = []
    for tasks in (2, 1):
        cfg = PrepareConfig(stages=["read", "dedup_minhash", "write"], tasks=tasks)
        run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
        yields = json.loads((tmp_path / "run/yield.json").read_text())
        rows = {r["stage"]: r for r in yields["stages"]}
        assert rows["dedup_minhash"]["drop_reasons"] == {"near_duplicate": 3}  # 2 exact + 1 near
        assert yields["tasks"] == tasks
        outs.append(_texts(tmp_path / "run"))
    assert outs[0] == outs[1] and len(outs[0]) == len(set(outs[0])) == 6


def _dedup_rows(tmp_path, overrides: list[str]) -> dict:
    cfg = load_config(None, overrides).prepare
    run_prepare(cfg, tmp_path / "run", [str(tmp_path / "src")], progress=False)
    return {r["stage"]: r for r in json.loads((tmp_path / "run/yield.json").read_text())["stages"]}


@pytest.mark.parametrize("normalize", [False, True])
def test_exact_dedup_normalize_setting_reaches_the_stage(tmp_path, normalize):
    """`prepare.dedup_exact.normalize` decides whether a copy differing only in case and
    whitespace is a duplicate: it must reach the stage, not just the config."""
    src = text_corpus(tmp_path)
    shouted = "  ".join((src / "f4.txt").read_text().upper().split()) + "\n"
    (src / "f8.txt").write_text(shouted)
    rows = _dedup_rows(tmp_path, ['prepare.stages=["read", "dedup_exact", "write"]',
                                  "prepare.tasks=2",
                                  f"prepare.dedup_exact.normalize={str(normalize).lower()}"])
    texts = _texts(tmp_path / "run")
    assert rows["dedup_exact"]["drop_reasons"] == {"duplicate": 3 if normalize else 2}
    original = (src / "f4.txt").read_text()
    assert (shouted in texts) + (original in texts) == (1 if normalize else 2)
    assert len(texts) == (6 if normalize else 7)


@pytest.mark.parametrize("options, near_kept, bands", [
    ([], False, 14),  # defaults (5-grams, 14 buckets x 8 hashes): J ~ 0.87 matches
    (["prepare.dedup_minhash.num_buckets=1", "prepare.dedup_minhash.hashes_per_bucket=100"],
     True, 1),  # one band of 100 hashes: P(match | J ~ 0.87) ~ 1e-6
    (["prepare.dedup_minhash.hashes_per_bucket=100"], True, 14),  # 14 such bands: ~1e-5
    (["prepare.dedup_minhash.n_grams=40"], True, 14),  # the changed word is in most 40-grams
])
def test_minhash_settings_reach_the_stage(tmp_path, options, near_kept, bands):
    """The `prepare.dedup_minhash.*` settings decide whether a near-duplicate (one middle word
    changed) is dropped, and how many bucket tasks run; exact copies always go."""
    src = text_corpus(tmp_path)
    original = (src / "f4.txt").read_text()
    words = original.split()
    words[len(words) // 2] = "zzzzzz"
    near = " ".join(words)
    (src / "f8.txt").write_text(near)
    rows = _dedup_rows(tmp_path, ['prepare.stages=["read", "dedup_minhash", "write"]',
                                  "prepare.tasks=2", *options])
    texts = _texts(tmp_path / "run")
    assert rows["dedup_minhash"]["drop_reasons"] == {"near_duplicate": 2 if near_kept else 3}
    assert len(texts) == len(set(texts)) == (7 if near_kept else 6)
    assert (near in texts) + (original in texts) == (2 if near_kept else 1)
    [bucket_phase] = (tmp_path / "run/logs/prepare/phases").glob("*_minhash_buckets")
    assert len(list((bucket_phase / "completions").iterdir())) == bands  # one task per band


def test_injected_replicas_are_counted_and_found_by_decontamination(tmp_path):
    src = text_corpus(tmp_path)
    bench = tmp_path / "bench.jsonl"
    items = [{"problem": f"Compute the value of item {i} from the table given in the statement",
              "solution": f"The value of item {i} is obtained by adding the two columns of the "
                          "table and dividing by two"} for i in range(3)]
    bench.write_text("".join(json.dumps(it) + "\n" for it in items))
    cfg = load_config(None, [
        'prepare.stages=["read", "inject_replicas", "decontaminate", "write"]', "prepare.tasks=2",
        f'prepare.inject_replicas.benchmark="{bench}"', "prepare.inject_replicas.k=2",
        f'prepare.decontaminate.benchmarks=["{bench}"]', 'prepare.decontaminate.mode="tag"',
    ]).prepare  # mode "drop" would remove the replicas: refused after inject_replicas
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    rows = json.loads((tmp_path / "run/yield.json").read_text())["stages"]
    check_yield_adds_up(rows)
    by = {r["stage"]: r for r in rows}
    assert by["inject_replicas"]["documents_added"] == 6
    assert by["decontaminate"]["documents_tagged"] == 6
    assert by["decontaminate"]["benchmarks"]["bench"]["documents_tagged"] == 6
    assert len(_texts(tmp_path / "run")) == 15


class FakeScorer(PipelineStep):
    """Deterministic `ppl` per document (the real scorer needs a trained run)."""

    name = "fake ppl"

    def run(self, data, rank: int = 0, world_size: int = 1):
        for doc in data:
            doc.metadata["ppl"] = float(sum(map(ord, doc.text)) % 997)
            yield doc


@pytest.fixture
def fake_scorer():
    saved, saved_f = dict(pl.STAGES), dict(stage_registry._FACTORIES)
    register_stage("perplexity", lambda ctx: FakeScorer())
    yield
    pl.STAGES.clear(), pl.STAGES.update(saved)
    stage_registry._FACTORIES.clear(), stage_registry._FACTORIES.update(saved_f)


def test_perplexity_selection_uses_a_global_threshold(tmp_path, fake_scorer):
    src = text_corpus(tmp_path)
    cfg = PrepareConfig(stages=["read", "perplexity", "perplexity_select", "write"], tasks=2,
                        perplexity=pc.PerplexityOptions(run_dir="unused", fraction=0.4))
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    scores = [float(sum(map(ord, (src / f"f{i}.txt").read_text())) % 997) for i in range(9)]
    threshold = threshold_for_fraction(scores, 0.4)
    kept = sorted(float(d.metadata["ppl"]) for d in read_documents(tmp_path / "run"))
    assert kept == sorted(s for s in scores if s >= threshold) and len(kept) == 3
    saved = json.loads((tmp_path / "run/prepare_work/perplexity_select/thresholds.json").read_text())
    assert saved["threshold"] == threshold and saved["scores"] == 9


@pytest.mark.parametrize("options", [dict(mode="bottom_fraction", fraction=0.4),
                                     dict(mode="drop_extremes", low_q=0.2, high_q=0.7)])
def test_perplexity_selection_is_the_same_for_any_task_count(tmp_path, fake_scorer, options):
    """A threshold or quantile from the scores of one task's shard would change with
    `prepare.tasks`; the band / threshold over all 9 scores keeps the same documents for 1
    and 3 tasks, as computed by hand from the scores."""
    src = text_corpus(tmp_path)
    scores = sorted(float(sum(map(ord, (src / f"f{i}.txt").read_text())) % 997) for i in range(9))
    assert scores == [116, 297, 297, 381, 387, 387, 590, 657, 959]  # files 1, 2 repeated
    if options["mode"] == "bottom_fraction":
        expected = [116, 297, 297]  # floor(0.4 * 9) = 3 lowest: threshold 297
    else:  # linear quantiles at positions 1.6 and 5.6: 297 and 387 + 0.6 * (590 - 387) = 508.8
        expected = [297, 297, 381, 387, 387]
    for tasks in (1, 3):
        cfg = PrepareConfig(stages=["read", "perplexity", "perplexity_select", "write"],
                            tasks=tasks, perplexity=pc.PerplexityOptions(run_dir="unused", **options))
        run_prepare(cfg, tmp_path / f"t{tasks}", [str(src)], progress=False)
        kept = sorted(float(d.metadata["ppl"]) for d in read_documents(tmp_path / f"t{tasks}"))
        assert kept == expected, tasks


@pytest.mark.parametrize("mode, expected", [("top_fraction", [590, 657, 959]),
                                            ("bottom_fraction", [116, 297, 297])])
def test_perplexity_selection_keeps_a_count_of_documents(tmp_path, fake_scorer, mode, expected):
    """The paper keeps the top `ndoc` of the pool (1000 of several thousand), a count and
    not a share: `prepare.perplexity.count` keeps that many over every task's scores; a
    count past the scored pool stops the prepare rather than keep a smaller set."""
    src = text_corpus(tmp_path)
    for tasks in (1, 3):
        cfg = PrepareConfig(stages=["read", "perplexity", "perplexity_select", "write"], tasks=tasks,
                            perplexity=pc.PerplexityOptions(run_dir="unused", mode=mode, count=3))
        run_prepare(cfg, tmp_path / f"t{tasks}", [str(src)], progress=False)
        kept = sorted(float(d.metadata["ppl"]) for d in read_documents(tmp_path / f"t{tasks}"))
        assert kept == expected, tasks
    cfg = PrepareConfig(stages=["read", "perplexity", "perplexity_select", "write"], tasks=1,
                        perplexity=pc.PerplexityOptions(run_dir="unused", mode=mode, count=10))
    with pytest.raises(Exception, match="count 10 is more than the 9 scored documents"):
        run_prepare(cfg, tmp_path / "over", [str(src)], progress=False)


def test_a_run_selected_before_the_count_setting_keeps_its_signature():
    """`perplexity.count` is recorded only when set, so a run prepared (or trained) before
    the setting existed resumes rather than being made again or refused."""
    from kiln.data.prepare_signature import make_signature

    cfg = PrepareConfig(stages=["read", "perplexity", "perplexity_select", "write"],
                        perplexity=pc.PerplexityOptions(run_dir="r", fraction=0.5))
    assert "count" not in make_signature(cfg, ["src"], 0)["perplexity"]
    cfg.perplexity.count, cfg.perplexity.fraction = 4, 0.0
    assert make_signature(cfg, ["src"], 0)["perplexity"]["count"] == 4


@pytest.mark.parametrize("options, message", [
    (dict(count=3, fraction=0.5), "set fraction or count, not both"),
    (dict(count=-1), "count must be >= 0"),
    (dict(count=3, mode="drop_extremes", low_q=0.1, high_q=0.9), "count is for modes"),
    (dict(), r"fraction must be in \(0, 1\] .*or set count"),
])
def test_bad_perplexity_count_settings_are_refused_at_load(options, message):
    from kiln.data.prepare_checks import validate_prepare

    cfg = PrepareConfig(stages=["read", "perplexity", "perplexity_select", "write"],
                        perplexity=pc.PerplexityOptions(run_dir="unused", **options))
    with pytest.raises(ConfigError, match=message):
        validate_prepare(cfg)


# ---- config errors, before any work ---------------------------------------------------------

def test_unknown_stage_option_names_the_key(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[prepare]\nstages = ["read", "quality", "write"]\n'
                      '[prepare.quality]\ndomian = "code"\n')
    with pytest.raises(ConfigError,
                       match=r"'prepare\.quality\.domian'.*did you mean 'prepare\.quality\.domain'"):
        load_config(recipe)
    assert main(["prepare", str(recipe)]) == 2


@pytest.mark.parametrize(("overrides", "message"), [
    (['prepare.stages=["read", "decontaminate", "write"]'], "prepare.decontaminate.benchmarks"),
    (['prepare.decontaminate.benchmarks=["b.jsonl"]'], "'decontaminate' is not in"),
    (['prepare.stages=["read", "perplexity", "write"]'], "prepare.perplexity.run_dir"),
    (['prepare.stages=["read", "perplexity", "perplexity_select", "write"]',
      'prepare.perplexity.run_dir="r"'], "prepare.perplexity.fraction"),
    (['prepare.stages=["read", "latex", "write"]'], "'latex' needs 'arxiv_sources'"),
    (['prepare.stages=["arxiv_metadata", "arxiv_sources", "write"]'],
     "'arxiv_sources' needs 'latex' after it"),
    (['prepare.stages=["arxiv_sources", "quality", "write"]'], "'arxiv_sources' needs 'latex'"),
    (['prepare.stages=["quality", "write"]'], "start with a reader"),
    (['prepare.stages=["read", "pii"]'], "end with 'write'"),
    (['prepare.quality.domain="latx"'], "did you mean 'latex'"),
    (['prepare.pii.types=["EMAIL", "PHONE"]'], "prepare.pii.types"),
    (['prepare.stages=["read", "period", "write"]'], "'period' needs"),
    (['prepare.period.periods=["1800s"]'], "prepare.period.periods"),
    (['prepare.brain_rot_m2.judge="gpt"'], "prepare.brain_rot_m2.judge"),
    (["prepare.arxiv.limit=-1"], r"prepare.arxiv.limit must be >= 0 \(0: every paper\), got -1"),
    (["prepare.arxiv.max_member_bytes=0"], "prepare.arxiv.max_member_bytes must be >= 1"),
    (["prepare.arxiv.max_ratio=0"], "prepare.arxiv.max_ratio must be > 0"),
    (["tokenizer.kind=\"unigram\""], "tokenizer.kind"),
])
def test_impossible_combinations_fail_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


SELECT = ['prepare.stages=["read", "perplexity", "perplexity_select", "write"]',
          'prepare.perplexity.run_dir="r"']


@pytest.mark.parametrize(("overrides", "message"), [
    (['prepare.stages=["read", "perplexity", "write"]', 'prepare.perplexity.run_dir="r"',
      "prepare.perplexity.count=100"], "prepare.perplexity.count is set but 'perplexity_select'"),
    (['prepare.stages=["read", "perplexity", "write"]', 'prepare.perplexity.run_dir="r"',
      "prepare.perplexity.fraction=0.5"], "prepare.perplexity.fraction is set but"),
    (['prepare.language.languages=["de"]'], "prepare.language.languages is set but 'language'"),
    (['prepare.language.strip_math=false'], "prepare.language.strip_math is set but"),
    # another selection mode's setting: the band was not kept, or the fraction not applied
    (SELECT + ['prepare.perplexity.fraction=0.3', 'prepare.perplexity.low_q=0.05',
               'prepare.perplexity.high_q=0.95'],
     "prepare.perplexity.low_q is set but mode 'top_fraction' does not read it"),
    (SELECT + ['prepare.perplexity.mode="drop_extremes"', 'prepare.perplexity.fraction=0.3',
               'prepare.perplexity.low_q=0.05', 'prepare.perplexity.high_q=0.95'],
     "prepare.perplexity.fraction is set but mode 'drop_extremes' does not read it"),
    # a filter's table without its stage: no junk was filtered, no band of M1 applied...
    (['prepare.brain_rot_m2.threshold=0.3'], "prepare.brain_rot_m2.threshold is set but "
                                             "'brain_rot_m2' is not in prepare.stages"),
    (['prepare.brain_rot_m1.junk_max_tokens=20'], "brain_rot_m1.junk_max_tokens is set but"),
    (['prepare.brain_rot_arms.ratio=0.2'], "prepare.brain_rot_arms.ratio is set but"),
    (['prepare.stages=["read", "write"]', 'prepare.quality.domain="prose"'],
     "prepare.quality.domain is set but 'quality'"),
    (['prepare.dedup_minhash.n_grams=3'], "prepare.dedup_minhash.n_grams is set but"),
    (['prepare.perplexity.run_dir="r"'], "prepare.perplexity.run_dir is set but 'perplexity'"),
    (['prepare.stages=["read", "dating", "write"]', 'prepare.period.periods=["1800-1849"]'],
     "prepare.period.periods is set but 'period'"),
    (['prepare.period.keep_undated=true'], "prepare.period.keep_undated is set but"),
    (['prepare.stages=["arxiv_sources", "latex", "write"]', 'prepare.arxiv.source_dir="s"',
      'prepare.arxiv.categories=["hep-th"]'], "prepare.arxiv.categories is set but 'arxiv_metadata'"),
    (['prepare.stages=["arxiv_sources", "latex", "write"]', 'prepare.arxiv.source_dir="s"',
      'prepare.arxiv.snapshot="m.jsonl"'], "prepare.arxiv.snapshot is set but"),
])
def test_a_setting_no_stage_reads_is_refused_before_making_data(tmp_path, overrides, message):
    """Selection settings with `perplexity` alone (which only scores), language settings
    with no `language` stage (or a Brain Rot, quality or dedup table without its stage),
    periods with `dating` alone, or the metadata filter's settings with `arxiv_sources`
    reading the whole folder, were accepted and ignored: every document kept. Refused before
    any work; a run's recorded config holding one still loads (its model trains)."""
    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError, match=message):
        pl.build_pipeline(cfg.prepare, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_missing_benchmark_fails_before_any_work(tmp_path, capsys):
    src = text_corpus(tmp_path)
    run = tmp_path / "run"
    run_prepare(PrepareConfig(stages=["read", "write"]), run, [str(src)], progress=False)
    before = _texts(run)
    args = ["prepare", "--set", f'run.dir="{run}"', "--set", f'data.sources=["{src}"]',
            "--set", 'prepare.stages=["read", "decontaminate", "write"]',
            "--set", f'prepare.decontaminate.benchmarks=["{tmp_path / "nope.jsonl"}"]']
    assert main(args) == 1
    assert "prepare.decontaminate.benchmarks: file not found" in capsys.readouterr().err
    assert _texts(run) == before  # the previous documents were not touched


def test_light_config_copies_match_the_stage_modules():
    from kiln.data.arxiv import DEFAULT_CATEGORIES
    from kiln.data.decontam.ngram_index import DEFAULT_ANSWER_FIELDS, DEFAULT_PROMPT_FIELDS
    from kiln.data.filters.quality import DOMAINS
    from kiln.data.filters.selection import MODES
    from kiln.data.pii import PII_TYPES

    assert (pc.QUALITY_DOMAINS, pc.PII_TYPE_NAMES, pc.ARXIV_CATEGORIES, pc.SELECTION_MODES) == (
        DOMAINS, PII_TYPES, DEFAULT_CATEGORIES, MODES)
    d = pc.DecontaminateOptions()
    assert (tuple(d.prompt_fields), tuple(d.answer_fields)) == (DEFAULT_PROMPT_FIELDS,
                                                                DEFAULT_ANSWER_FIELDS)
    for name in pc.STAGES:  # every registered stage has a factory
        assert callable(pl.resolve_factory(name))


def test_config_stays_cheap_to_import_and_round_trips(tmp_path):
    code = ("import sys, kiln.config; "
            "print([m for m in ('datatrove', 'torch', 'spacy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    cfg = load_config(None, [
        'prepare.stages=["read", "dating", "period", "write"]', 'prepare.period.periods=["1800-1849"]',
        'prepare.quality.domain="prose"', "prepare.dedup_minhash.num_buckets=7"])
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(cfg))
    assert "[prepare.period]" in path.read_text() and load_config(path) == cfg


def test_dating_and_period_stages_select_years(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, year in enumerate([1810, 1875, 1820]):
        (src / f"b{i}.txt").write_text(f"Title: Book {i}\nOriginal publication: London, {year}\n"
                                       "Once upon a time.")
    cfg = load_config(None, ['prepare.stages=["read", "dating", "period", "write"]',
                             'prepare.period.periods=["1800-1849"]']).prepare
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    years = sorted(d.metadata["year"] for d in read_documents(tmp_path / "run"))
    assert years == [1810, 1820]


def test_a_setting_no_stage_reads_is_refused_before_the_plan_line(tmp_path, capsys):
    """`kiln prepare` said its plan ("read -> ... in 1 task(s)", its logs' folder) and then
    refused the setting: the refusal comes alone, before any plan."""
    src = text_corpus(tmp_path)
    args = ["prepare", "--set", f'run.dir="{tmp_path / "run"}"',
            "--set", f'data.sources=["{src}"]', "--set", "prepare.brain_rot_m2.threshold=0.3"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "'brain_rot_m2' is not in prepare.stages" in err, err
    assert "task(s)" not in err, err
