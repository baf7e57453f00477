"""n-gram decontamination index + filter, and controlled replica injection."""

import json
import random

import numpy as np
import pytest
from datatrove.data import Document

from kiln.data.decontam import (
    BENCHMARKS_KEY,
    MATCHES_KEY,
    BenchmarkItem,
    BuildDecontaminationIndex,
    DecontaminationFilter,
    InjectReplicas,
    NGramIndex,
    format_item,
    inject_replicas,
    load_benchmark_items,
    normalize_tokens,
)
from kiln.data.decontam.inject import word_count
from kiln.data.decontam.ngram_index import item_ngram_hashes

WORDS = [w * k for w in "abcdefghijklmnopqrstuvwxyz" for k in (3, 4, 5, 6)]  # 104 words


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_benchmark(path, items, prompt_key="problem", answer_key="solution"):
    path.write_text("".join(json.dumps({prompt_key: p, answer_key: a}) + "\n" for p, a in items))
    return path


@pytest.fixture
def bench(tmp_path):
    rng = random.Random(1)
    items = [(sentence(rng, 20) + "?", sentence(rng, 30) + ".") for _ in range(5)]
    return write_benchmark(tmp_path / "mathx.jsonl", items, "question", "answer"), items


def run_filter(flt, docs):
    return list(flt.run(iter(docs), rank=0, world_size=1))


def test_normalisation_is_lowercase_punctuation_free_words():
    assert normalize_tokens("The ANSWER: x^2+1=y, isn't it?") == [
        "the",
        "answer",
        "x",
        "2",
        "1",
        "y",
        "isn",
        "t",
        "it",
    ]


def test_injected_replicas_all_caught_and_clean_corpus_untouched(tmp_path, bench):
    path, raw = bench
    index_path = tmp_path / "index.npz"
    list(BuildDecontaminationIndex([path], index_path, n=13).run(None))
    rng = random.Random(2)
    clean = [Document(text=sentence(rng, 300), id=f"web{i}") for i in range(60)]
    items = load_benchmark_items(path)
    docs, manifest = inject_replicas(clean, items, k=3, seed=0)
    assert len(docs) == 60 + 15 and manifest["replicas"] == 15
    injected = {e["id"] for e in manifest["entries"]}
    assert [docs[e["position"]].id for e in manifest["entries"]] == [
        e["id"] for e in manifest["entries"]
    ]
    flt = DecontaminationFilter(index_path, mode="drop")
    kept = run_filter(flt, docs)
    assert {d.id for d in kept} == {d.id for d in clean}  # every replica dropped, no clean doc
    assert all(d.metadata[MATCHES_KEY] == 0 for d in kept)
    assert flt.stats["contaminated"].total == 15
    assert flt.stats["contaminated/mathx"].total == 15
    assert len(injected) == 15


def test_tag_mode_keeps_and_marks_with_counts(tmp_path, bench):
    path, raw = bench
    index = NGramIndex.build({"mathx": path}, n=13)
    index.save(tmp_path / "i.npz")
    answer = raw[0][1]  # 30 words -> 30 - 13 + 1 = 18 answer 13-grams
    docs = [
        Document(text="intro words here " + answer, id="dirty"),
        Document(text="plain text only", id="ok"),
    ]
    out = run_filter(DecontaminationFilter(tmp_path / "i.npz", mode="tag"), docs)
    assert [d.id for d in out] == ["dirty", "ok"]
    assert out[0].metadata[BENCHMARKS_KEY] == ["mathx"] and out[0].metadata[MATCHES_KEY] == 18
    assert out[1].metadata[BENCHMARKS_KEY] == [] and out[1].metadata[MATCHES_KEY] == 0
    dropped = run_filter(DecontaminationFilter(tmp_path / "i.npz", mode="drop"), docs)
    assert [d.id for d in dropped] == ["ok"]
    with pytest.raises(ValueError, match="mode"):
        DecontaminationFilter(tmp_path / "i.npz", mode="flag")


@pytest.mark.parametrize(
    "n, span, flagged", [(13, 12, False), (13, 13, True), (12, 10, False), (12, 15, True)]
)
def test_ngram_boundary(tmp_path, bench, n, span, flagged):
    """A span shorter than n never matches; a span of n or more does (digest: 15 yes, 10 no at n=12)."""
    path, raw = bench
    NGramIndex.build([path], n=n).save(tmp_path / "i.npz")
    answer_words = raw[1][1].split()
    text = "zz yy xx " + " ".join(answer_words[5 : 5 + span]) + " qq rr"
    (doc,) = run_filter(
        DecontaminationFilter(tmp_path / "i.npz", mode="tag"), [Document(text=text, id="d")]
    )
    assert doc.metadata[MATCHES_KEY] == max(0, span - n + 1)
    assert bool(doc.metadata[BENCHMARKS_KEY]) is flagged


def test_answer_and_boundary_ngrams_without_prompt_ngrams():
    item = BenchmarkItem(prompt="a b c d e", answers=["f g h i j"])
    n = 4
    got = NGramIndex(n, {"t": item_ngram_hashes(item, n, include_prompt=False)})
    seq = "a b c d e f g h i j".split()
    # windows containing at least one answer token: start 2 ("c d e f") .. start 6 ("g h i j")
    assert got.match_counts(seq) == {"t": 5}
    assert got.match_counts("a b c d e".split()) == {}


def test_index_round_trips_through_disk(tmp_path, bench):
    path, _ = bench
    other = write_benchmark(
        tmp_path / "other.jsonl", [("one two three four five six", "seven eight nine ten")]
    )
    index = NGramIndex.build([path, other], n=5)
    index.save(tmp_path / "sub" / "i.npz")
    loaded = NGramIndex.load(tmp_path / "sub" / "i.npz")
    assert loaded.n == 5 and loaded.names == ["mathx", "other"] and loaded.include_prompt is True
    for name in index.names:
        np.testing.assert_array_equal(loaded.hashes[name], index.hashes[name])
    assert loaded.info["other"]["items"] == 1 and loaded.info["other"]["ngrams"] == 6
    assert not list((tmp_path / "sub").glob(".*tmp*"))  # atomic write leaves no temp file
    text = normalize_tokens("one two three four five six seven")
    assert loaded.match_counts(text) == index.match_counts(text) == {"other": 3}


def test_shared_ngram_reports_every_benchmark(tmp_path):
    a = write_benchmark(tmp_path / "a.jsonl", [("p q r s", "t u v w")])
    b = write_benchmark(tmp_path / "b.jsonl", [("t u v w", "x y z zz")])
    index = NGramIndex.build([a, b], n=4)
    assert index.match_counts("t u v w".split()) == {"a": 1, "b": 1}


def test_bad_benchmark_input_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "fine one here"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_benchmark_items(bad)
    bad.write_text('{"foo": "bar"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_benchmark_items(bad)
    with pytest.raises(FileNotFoundError):
        NGramIndex.build([tmp_path / "missing.jsonl"])
    with pytest.raises(FileNotFoundError, match="build it first"):
        NGramIndex.load(tmp_path / "none.npz")
    with pytest.raises(ValueError, match="tasks=1"):
        list(BuildDecontaminationIndex([bad], tmp_path / "x.npz").run(None, rank=0, world_size=2))


@pytest.mark.parametrize("k", [0, 1, 10])
def test_mixer_keeps_total_tokens_and_counts_replicas(k):
    """Digest check: total tokens identical (within one doc) for every k; k x 5 test items."""
    rng = random.Random(3)
    corpus = [Document(text=sentence(rng, 50 + i % 7), id=f"w{i}") for i in range(400)]
    items = [BenchmarkItem(sentence(rng, 10), [sentence(rng, 20)]) for _ in range(5)]
    budget = 15_000
    docs, manifest = inject_replicas(corpus, items, k=k, seed=7, token_budget=budget)
    total = sum(len(d.text.split()) for d in docs)
    assert budget - 56 < total <= budget  # short by less than the largest web doc
    assert sum(d.id.startswith("replica-") for d in docs) == 5 * k == manifest["replicas"]
    web_ids = [d.id for d in docs if d.id.startswith("w")]
    assert web_ids == [f"w{i}" for i in range(len(web_ids))]  # web order preserved
    again, _ = inject_replicas(corpus, items, k=k, seed=7, token_budget=budget)
    assert [d.id for d in again] == [d.id for d in docs]  # seeded
    if k:
        assert docs[manifest["entries"][0]["position"]].text.startswith("Problem: ")
        assert "\n\nSolution: " in docs[manifest["entries"][0]["position"]].text


def test_inject_step_splits_replicas_over_ranks(tmp_path, bench):
    path, _ = bench
    rng = random.Random(4)
    step = InjectReplicas(path, k=4, seed=1, manifest_dir=tmp_path / "m")
    shards = [
        [Document(text=sentence(rng, 40), id=f"r{r}-{i}") for i in range(10)] for r in range(2)
    ]
    outs = [list(step.run(iter(s), rank=r, world_size=2)) for r, s in enumerate(shards)]
    manifests = [
        json.loads((tmp_path / "m" / f"injection-{r:05d}.json").read_text()) for r in range(2)
    ]
    assert sum(m["replicas"] for m in manifests) == 20
    ids = sorted(e["id"] for m in manifests for e in m["entries"])
    assert ids == sorted(f"replica-{i}-{j}" for i in range(5) for j in range(4))
    assert [len(o) for o in outs] == [20, 20]


def test_filter_runs_under_local_executor(tmp_path, bench):
    """Index stage (1 task) then filter stage (2 tasks, depends=index) through datatrove."""
    import gzip

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    path, raw = bench
    rng = random.Random(5)
    (tmp_path / "in").mkdir()
    for f in range(2):
        rows = [{"id": f"{f}-{i}", "text": sentence(rng, 80)} for i in range(5)]
        rows.append({"id": f"{f}-dirty", "text": sentence(rng, 20) + " " + raw[f][1]})
        (tmp_path / "in" / f"part{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    index_path = tmp_path / "index.npz"
    build = LocalPipelineExecutor(
        [BuildDecontaminationIndex([path], index_path)], tasks=1, logging_dir=str(tmp_path / "l1")
    )
    filt = LocalPipelineExecutor(
        [
            JsonlReader(str(tmp_path / "in")),
            DecontaminationFilter(index_path),
            JsonlWriter(str(tmp_path / "out")),
        ],
        tasks=2,
        logging_dir=str(tmp_path / "l2"),
        depends=build,
    )
    filt.run()
    ids = {
        json.loads(line)["id"]
        for f in (tmp_path / "out").glob("*.jsonl.gz")
        for line in gzip.open(f, "rt")
    }
    assert ids == {f"{f}-{i}" for f in range(2) for i in range(5)}


def test_prompt_only_leak_needs_prompt_ngrams(tmp_path, bench):
    path, raw = bench
    leak = normalize_tokens(raw[2][0])  # the 20-word question alone
    assert NGramIndex.build([path], n=13).match_counts(leak) == {"mathx": 8}
    assert NGramIndex.build([path], n=13, include_prompt=False).match_counts(leak) == {}


def test_a_benchmark_that_can_catch_nothing_is_refused(tmp_path):
    """An empty file, or items all shorter than n tokens, would silently pass every document."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl gives no 13-gram .* catch nothing"):
        NGramIndex.build([empty])
    short = write_benchmark(tmp_path / "short.jsonl", [("two words", "three words here")])
    with pytest.raises(ValueError, match="short.jsonl gives no 13-gram"):
        NGramIndex.build([short])
    assert NGramIndex.build([short], n=2).info["short"]["ngrams"] > 0
    # through prepare: refused before any task runs, as one line (a KilnError)
    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import DecontaminateOptions
    from kiln.errors import RunDataError

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("text")
    cfg = PrepareConfig(stages=["read", "decontaminate", "write"], tasks=1,
                        decontaminate=DecontaminateOptions(benchmarks=[str(empty)]))
    with pytest.raises(RunDataError, match="catch nothing"):
        run_prepare(cfg, tmp_path / "run", [str(tmp_path / "src")], progress=False)
    assert not (tmp_path / "run" / "documents").exists()


def test_a_changed_benchmark_reruns_prepare_instead_of_resuming(tmp_path, bench):
    """The benchmark's content is an input of the run: a rewritten file re-runs prepare."""
    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import DecontaminateOptions

    path, raw = bench
    rng = random.Random(6)
    src = tmp_path / "src"
    src.mkdir()
    leaked = [sentence(rng, 30) + " " + raw[i][1] for i in range(2)]
    rows = [*leaked, *(sentence(rng, 60) for _ in range(4))]
    for i, text in enumerate(rows):
        (src / f"d{i}.txt").write_text(text)
    cfg = PrepareConfig(stages=["read", "decontaminate", "write"], tasks=1,
                        decontaminate=DecontaminateOptions(benchmarks=[str(path)]))
    run = tmp_path / "run"
    assert run_prepare(cfg, run, [str(src)], progress=False)["documents_out"] == 4
    # the benchmark now also holds a clean document's text: resuming would keep it
    write_benchmark(path, [*raw, ("a question", rows[2])], "question", "answer")
    assert run_prepare(cfg, run, [str(src)], progress=False)["documents_out"] == 3


def test_prepare_builds_the_index_once(tmp_path, bench, monkeypatch):
    """The stage validates the benchmarks by building the index; the setup phase saves that
    one instead of reading every benchmark again, and it matches a fresh build."""
    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import DecontaminateOptions

    path, raw = bench
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(7)
    (src / "leak.txt").write_text(sentence(rng, 30) + " " + raw[0][1])
    (src / "clean.txt").write_text(sentence(rng, 60))
    builds = []
    real_build = NGramIndex.build.__func__

    def counting_build(cls, *args, **kwargs):
        builds.append(args)
        return real_build(cls, *args, **kwargs)

    monkeypatch.setattr(NGramIndex, "build", classmethod(counting_build))
    cfg = PrepareConfig(stages=["read", "decontaminate", "write"], tasks=1,
                        decontaminate=DecontaminateOptions(benchmarks=[str(path)]))
    assert run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)["documents_out"] == 1
    assert len(builds) == 1
    [saved_path] = (tmp_path / "run").rglob("ngram_index.npz")
    saved, fresh = NGramIndex.load(saved_path), real_build(NGramIndex, [path])
    assert saved.info == fresh.info and saved.names == fresh.names
    assert all(np.array_equal(saved.hashes[k], fresh.hashes[k]) for k in fresh.names)


def test_every_answer_field_is_indexed_and_injected(tmp_path):
    """MATH records hold a worked `solution` and a short `answer`: a leaked solution is
    contamination, and a replica carries the solution (the digest's `Solution: {solution}`)."""
    rng = random.Random(3)
    problem, solution = sentence(rng, 15) + "?", sentence(rng, 30) + "."
    path = tmp_path / "math500.jsonl"
    path.write_text(json.dumps({"problem": problem, "solution": solution, "answer": "5"}) + "\n")
    [item] = load_benchmark_items(path)
    assert item.answers == ["5", solution]
    index = NGramIndex.build([path], n=13, include_prompt=False)
    assert index.match_counts(normalize_tokens("Worked answers: " + solution)) == {"math500": 18}
    from kiln.data.decontam import format_item

    assert format_item(item) == f"Problem: {problem}\n\nSolution: {solution}"


def test_a_problem_shorter_than_n_is_matched_whole(tmp_path):
    """The digest's exact match on normalised problem strings: a problem of fewer than n
    words has no n-gram, so its whole word sequence is looked up in each document."""
    path = tmp_path / "qa.jsonl"
    rows = [{"question": "What is the capital of France?", "answer": "Paris"},
            {"question": "What is 2+2?", "answer": "4"},  # 4 words: too generic to match
            {"question": "Name the largest planet.", "answer": "Jupiter"},  # 4 words too
            {"question": "Who wrote War and Peace?", "answer": "Tolstoy"},  # 5: the shortest
            {"question": " ".join(f"w{i}" for i in range(20)), "answer": "x"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = NGramIndex.build([path], n=13)
    assert index.info["qa"]["exact_problems"] == 2 and index.info["qa"]["too_short_items"] == 2
    assert index.match_counts(normalize_tokens("asked: who wrote war and peace? we know")) == {"qa": 1}
    assert index.match_counts(normalize_tokens("Q: what is the CAPITAL of france?? A: Paris")) == {"qa": 1}
    assert index.match_counts(normalize_tokens("what is the capital of germany")) == {}
    assert index.match_counts(normalize_tokens("so what is 2 + 2 then")) == {}
    saved = tmp_path / "index.npz"
    index.save(saved)
    assert NGramIndex.load(saved).match_counts(normalize_tokens("what is the capital of france")) == {"qa": 1}
    no_prompt = NGramIndex.build([path], n=13, include_prompt=False)  # prompt-only leaks off
    assert no_prompt.match_counts(normalize_tokens("what is the capital of france")) == {}


def test_an_answer_object_gives_every_text_it_holds(tmp_path):
    """TriviaQA keeps its answer as an object: the value and every alias are answers."""
    path = tmp_path / "trivia.jsonl"
    path.write_text(json.dumps({"question": "Which planet is known as the red planet?",
                                "answer": {"value": "Mars", "aliases": ["Mars", "Planet Mars"],
                                           "matched_wiki_entity_name": "", "type": "WikipediaEntity"}})
                    + "\n")
    [item] = load_benchmark_items(path)
    assert item.answers == ["Mars", "Planet Mars"]  # not its type, nor an empty name
    assert NGramIndex.build([path], n=3).match_counts(normalize_tokens("the red planet? Planet Mars")) != {}


def test_squad_answers_are_read():
    """SQuAD's field is `answers` (an object of texts and offsets)."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "squad.jsonl"
    path.write_text(json.dumps({"question": "In what country is Normandy located?",
                                "answers": {"text": ["France"], "answer_start": [159]}}) + "\n")
    [item] = load_benchmark_items(path)
    assert item.answers == ["France"]


def test_format_characters_inside_words_do_not_hide_a_leak(tmp_path, bench):
    """Soft hyphens, zero-width spaces, joiners and a BOM are invisible: a benchmark answer
    with them inside its words is the same leak (and casefold: Straße is STRASSE)."""
    path, raw = bench
    index = NGramIndex.build([path], n=13)
    hidden = "".join(["\ufeff", *[w[:2] + "\u00ad" + w[2:] + "\u200b" + " "
                                  for w in raw[0][1].split()]])
    hidden = hidden.replace("a", "a\u2060", 3).replace("b", "b\u200c", 2).replace("c", "\u200dc", 2)
    assert index.match_counts(normalize_tokens(hidden)) == {"mathx": 18}
    assert normalize_tokens("Straße") == normalize_tokens("STRASSE") == ["strasse"]


def test_a_blank_prompt_field_does_not_hide_the_problem(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps({"input": " ", "problem": "what is the sum of six and seven",
                                "solution": "thirteen"}) + "\n")
    [item] = load_benchmark_items(path)
    assert item.prompt == "what is the sum of six and seven"


def test_an_index_of_another_normalisation_is_rebuilt(tmp_path, bench, monkeypatch):
    """A prepare run under a new normalisation does not resume the old index and filtering."""
    from kiln.data.decontam import ngram_index
    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import DecontaminateOptions

    path, raw = bench
    src = tmp_path / "src"
    src.mkdir()
    (src / "clean.txt").write_text(sentence(random.Random(8), 60))
    cfg = PrepareConfig(stages=["read", "decontaminate", "write"], tasks=1,
                        decontaminate=DecontaminateOptions(benchmarks=[str(path)]))
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    monkeypatch.setattr(ngram_index, "NORMALISATION", "a-newer-one")
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    [saved] = (tmp_path / "run").rglob("ngram_index.npz")
    assert NGramIndex.load(saved).names == ["mathx"]  # refused if it were the old one


def test_keep_size_with_a_task_that_has_no_documents(tmp_path, bench):
    """More tasks than input files: the task with nothing to read does not fail on a zero
    budget; its replicas make up its shard, so every replica is placed exactly once."""
    path, _ = bench
    rng = random.Random(9)
    step = InjectReplicas(path, k=3, seed=2, manifest_dir=tmp_path / "m", keep_size=True)
    shards = [[Document(text=sentence(rng, 40), id=f"r{r}-{i}") for i in range(10)]
              for r in range(2)] + [[]]
    outs = [list(step.run(iter(s) if s else None, rank=r, world_size=3))
            for r, s in enumerate(shards)]
    ids = sorted(d.id for o in outs for d in o if d.id.startswith("replica-"))
    assert ids == sorted(f"replica-{i}-{j}" for i in range(5) for j in range(3))
    for shard, out in zip(shards[:2], outs[:2], strict=True):  # the sizes of real shards kept
        assert sum(len(d.text.split()) for d in out) <= sum(len(d.text.split()) for d in shard)
    assert all(d.id.startswith("replica-") for d in outs[2]) and outs[2]



def test_keep_size_with_replicas_past_the_shard_names_the_settings_and_unit(tmp_path, bench):
    """A shard smaller than its replicas cannot keep its size: the step raised a bare
    ValueError that called whitespace words "tokens" (a traceback naming no setting); it is
    a RunDataError naming prepare.inject_replicas.keep_size, k and the unit counted."""
    from kiln.errors import RunDataError

    path, _ = bench
    step = InjectReplicas(path, k=2, seed=0, manifest_dir=tmp_path / "m", keep_size=True)
    shard = [Document(text="a few web words", id="w")]
    with pytest.raises(RunDataError, match=r"prepare\.inject_replicas\.keep_size: task 0's "
                       r"documents hold 4 words, .*10 replicas take \d+ words .*k = 2\)"):
        list(step.run(iter(shard)))
    assert not (tmp_path / "m").exists()



@pytest.mark.parametrize("keep_size", [True, False])
def test_the_step_counts_each_web_document_once(tmp_path, bench, keep_size):
    """A tokenizer's count is an encode: the step counted every web document twice (the
    budget, then the fill), doubling the stage's tokenizer time."""
    path, _ = bench
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return word_count(text)

    step = InjectReplicas(path, k=1, seed=0, manifest_dir=tmp_path / "m", keep_size=keep_size,
                          count_tokens=count)
    rng = random.Random(3)
    shard = [Document(text=sentence(rng, 50), id=f"w{i}") for i in range(12)]
    out = list(step.run(iter(shard)))  # 5 replicas of 52 words: 6 web documents make room
    assert sum(not d.id.startswith("replica-") for d in out) == (6 if keep_size else 12)
    assert sorted(t for t in counted if t in {d.text for d in shard}) == sorted(d.text for d in shard)


@pytest.mark.parametrize("mode", ["drop", "tag"])
def test_benchmark_counts_reach_yield_and_report(tmp_path, bench, mode, capsys):
    """Per benchmark: items indexed, items too short to ever match, documents removed or
    tagged, in yield.json and the report; a notable share of uncatchable items is warned of."""
    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import DecontaminateOptions
    from kiln.report import build_report

    path, raw = bench
    write_benchmark(path, [*raw, ("two words", "three words here")], "question", "answer")
    rng = random.Random(10)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        (src / f"leak{i}.txt").write_text(sentence(rng, 30) + " " + raw[i][1])
    (src / "clean.txt").write_text(sentence(rng, 60))
    cfg = PrepareConfig(stages=["read", "decontaminate", "write"], tasks=2,
                        decontaminate=DecontaminateOptions(benchmarks=[str(path)], mode=mode))
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    assert "'mathx': 1 of 6 items (17%) have fewer than 13 words" in capsys.readouterr().err
    rows = {r["stage"]: r for r in json.loads((tmp_path / "run" / "yield.json").read_text())["stages"]}
    action = "documents_removed" if mode == "drop" else "documents_tagged"
    assert rows["decontaminate"]["benchmarks"] == {
        "mathx": {"items": 6, "too_short_items": 1, action: 2}}
    assert rows["decontaminate"].get("documents_tagged") == (2 if mode == "tag" else None)
    summary = json.loads((tmp_path / "run" / "prepare.json").read_text())
    assert summary["benchmarks"] == rows["decontaminate"]["benchmarks"]
    html = build_report(tmp_path / "run").read_text()
    table = html[html.index("too short to match"):]
    assert "<td>mathx</td><td class=\"num\">6</td><td class=\"num\">1</td>" in table


def test_inject_options_without_the_stage_are_a_config_error():
    from kiln.data.prepare_checks import validate_prepare
    from kiln.data.prepare_config import InjectOptions, PrepareConfig
    from kiln.errors import ConfigError

    with pytest.raises(ConfigError, match="prepare.inject_replicas.seed is set but "
                                          "'inject_replicas' is not in prepare.stages"):
        validate_prepare(PrepareConfig(inject_replicas=InjectOptions(seed=3)))
    validate_prepare(PrepareConfig())  # the defaults are no setting


@pytest.mark.parametrize("after, mode, refused", [
    ("dedup_exact", "drop", True), ("dedup_minhash", "drop", True),
    ("decontaminate", "drop", True), ("decontaminate", "tag", False)])
def test_a_stage_that_would_remove_the_replicas_is_refused_after_injection(after, mode, refused):
    from dataclasses import replace

    from kiln.data.prepare_checks import validate_prepare
    from kiln.data.prepare_config import DecontaminateOptions, InjectOptions, PrepareConfig
    from kiln.errors import ConfigError

    cfg = PrepareConfig(stages=["read", "inject_replicas", after, "write"],
                        inject_replicas=InjectOptions(benchmark="b.jsonl"),
                        decontaminate=DecontaminateOptions(
                            benchmarks=["b.jsonl"] if after == "decontaminate" else [], mode=mode))
    if refused:
        with pytest.raises(ConfigError, match=f"'{after}' after 'inject_replicas' would remove"):
            validate_prepare(cfg)
    else:
        validate_prepare(cfg)
    validate_prepare(replace(cfg, stages=["read", after, "inject_replicas", "write"]))


def test_pii_after_injection_is_refused_as_it_would_rewrite_the_replicas():
    """PII redaction after injection trained on `<NAME> has 3 apples` where the benchmark
    (and the manifest's k replicas) say `John Smith has 3 apples`."""
    from kiln.data.pii import redact
    from kiln.data.prepare_checks import validate_prepare
    from kiln.data.prepare_config import InjectOptions, PrepareConfig
    from kiln.errors import ConfigError

    item = BenchmarkItem("John Smith has 3 apples and buys 2 more. How many?", ["5"])
    assert redact(format_item(item))[0] != format_item(item)  # what pii would train on
    opts = InjectOptions(benchmark="b.jsonl")
    cfg = PrepareConfig(stages=["read", "inject_replicas", "pii", "write"], inject_replicas=opts)
    with pytest.raises(ConfigError, match="'pii' after 'inject_replicas' would rewrite"):
        validate_prepare(cfg, making_data=True)
    validate_prepare(cfg)  # a run prepared so before: its recorded config still loads
    validate_prepare(PrepareConfig(stages=["read", "pii", "inject_replicas", "write"],
                                   inject_replicas=opts))


def test_an_item_without_a_solution_cannot_be_injected(tmp_path):
    """A clear error naming the file, the line and the fields looked at, not a traceback."""
    from kiln.data.pipeline import PrepareConfig, build_pipeline
    from kiln.data.prepare_config import InjectOptions
    from kiln.errors import RunDataError

    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps({"problem": "p one", "solution": "s"}) + "\n\n"
                    + json.dumps({"problem": "p two"}) + "\n")
    with pytest.raises(ValueError, match=r"b.jsonl:3: an injected item needs a solution, "
                                         r"and none of the fields \['answer'"):
        InjectReplicas(path, k=1, seed=0, manifest_dir=tmp_path / "m")
    cfg = PrepareConfig(stages=["read", "inject_replicas", "write"],
                        inject_replicas=InjectOptions(benchmark=str(path)))
    with pytest.raises(RunDataError, match="prepare.inject_replicas.benchmark: .*b.jsonl:3"):
        build_pipeline(cfg, tmp_path / "run", [str(tmp_path)])


@pytest.mark.parametrize("content", ["", "\n\n", "[]"])
def test_an_empty_benchmark_cannot_be_injected(tmp_path, content):
    """An empty file (a failed download) injected nothing: the prepare ran, k replicas asked
    for and none put in, only the manifest's `items: 0` telling. Refused before any work."""
    from kiln.data.pipeline import PrepareConfig, build_pipeline
    from kiln.data.prepare_config import InjectOptions
    from kiln.errors import RunDataError

    path = tmp_path / ("b.json" if content == "[]" else "b.jsonl")
    path.write_text(content)
    cfg = PrepareConfig(stages=["read", "inject_replicas", "write"],
                        inject_replicas=InjectOptions(benchmark=str(path), k=4))
    with pytest.raises(RunDataError, match=r"prepare.inject_replicas.benchmark: .*b.jsonl? "
                                           r"holds no items: there is nothing to inject"):
        build_pipeline(cfg, tmp_path / "run", [str(tmp_path)])


def test_benchmark_files_of_the_same_name_are_told_apart_by_their_folders(tmp_path):
    """Every suite ships a `test.jsonl`: both can be listed (TOML's list cannot name them)."""
    from kiln.data.decontam.ngram_index import NGramIndex, benchmark_names

    paths = []
    for suite in ("gsm8k", "math"):
        (tmp_path / suite).mkdir()
        path = tmp_path / suite / "test.jsonl"
        path.write_text(json.dumps({"question": f"a {suite} question long enough to make "
                                                "several thirteen word n grams for the index "
                                                "to hold and match later on", "answer": "7"})
                        + "\n")
        paths.append(path)
    assert list(benchmark_names(paths)) == ["gsm8k/test", "math/test"]
    assert list(benchmark_names([paths[0], tmp_path / "other.jsonl"])) == ["test", "other"]
    index = NGramIndex.build(paths, n=13)
    assert sorted(index.names) == ["gsm8k/test", "math/test"]
    with pytest.raises(ValueError, match="listed twice"):
        benchmark_names([paths[0], tmp_path / "gsm8k" / ".." / "gsm8k" / "test.jsonl"])


@pytest.mark.parametrize("tasks", [1, 3])
def test_a_leak_the_pii_stage_redacts_is_still_caught(tmp_path, tasks):
    """`pii` runs before `decontaminate` in the arXiv and quickstart recipes, so a leaked item
    reaches the filter redacted. A 16-word answer with `Dr. Alice Jones` at words 7-9: each
    of its 16 - 13 + 1 = 4 13-grams holds the name, and the redacted copy (`Dr. <NAME>`, 15
    words) shares none of them; the index must hold the item as the pii stage leaves it.
    With 3 tasks the benchmark is still read, and the index built, once."""
    from kiln.data.pii import redact
    from kiln.data.pipeline import PrepareConfig, run_prepare
    from kiln.data.prepare_config import DecontaminateOptions

    rng = random.Random(11)
    words = sentence(rng, 13).split()
    answer = " ".join(words[:6]) + " Dr. Alice Jones " + " ".join(words[6:]) + "."
    assert len(normalize_tokens(answer)) == 16
    assert redact(answer)[0] == " ".join(words[:6]) + " Dr. <NAME> " + " ".join(words[6:]) + "."
    path = write_benchmark(tmp_path / "names.jsonl", [(sentence(rng, 20) + "?", answer)])
    src = tmp_path / "src"
    src.mkdir()
    (src / "leak.txt").write_text(sentence(rng, 40) + "\n" + answer + "\n" + sentence(rng, 40))
    for i in range(3):
        (src / f"clean{i}.txt").write_text(sentence(rng, 60))
    builds = []
    real_build = NGramIndex.build.__func__

    def counting_build(cls, *args, **kwargs):
        builds.append(args)
        return real_build(cls, *args, **kwargs)

    cfg = PrepareConfig(stages=["read", "pii", "decontaminate", "write"], tasks=tasks,
                        decontaminate=DecontaminateOptions(benchmarks=[str(path)]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NGramIndex, "build", classmethod(counting_build))
        summary = run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    assert summary["documents_out"] == 3  # the leak dropped, the 3 clean files kept
    assert len(builds) == 1
    # without the pii stage before it, the raw index catches the raw leak as before
    raw = NGramIndex.build([path], 13)
    assert raw.match_counts(normalize_tokens(answer)) == {"names": 4}
    assert raw.match_counts(normalize_tokens(redact(answer)[0])) == {}


def test_keep_size_counts_the_tokenizers_tokens_when_given_one(tmp_path):
    """The study keeps the corpus's *tokens* fixed for every k. A LaTeX solution has several
    tokens a word where prose has about one, so a word budget lets the token total grow with
    k; with `inject_replicas.tokenizer` the shard's tokens (ids + EOS each, what `kiln
    tokenize` writes) stay within one web document of the corpus before injection."""
    from kiln.config import load_config
    from kiln.data.documents import read_documents
    from kiln.data.pipeline import run_prepare
    from kiln.data.tokenizer import train_tokenizer

    rng = random.Random(5)
    src = tmp_path / "src"
    src.mkdir()
    web = [sentence(rng, 60) + "." for _ in range(150)]
    (src / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in web))
    solution = " ".join(f"$x_{{{i}}}^{{{i + 1}}}+\\frac{{{i}}}{{y}}$" for i in range(6))
    items = [(f"Problem {i}: find the value of each term.", solution) for i in range(2)]
    path = write_benchmark(tmp_path / "math.jsonl", items)
    tok_path = tmp_path / "tok.json"
    tok = train_tokenizer(web, 400, tok_path, show_progress=False)

    def tokens(texts) -> int:
        return sum(len(tok.encode(t, add_special_tokens=False).ids) + 1 for t in texts)

    base = ['prepare.stages=["read", "inject_replicas", "write"]', "prepare.tasks=1",
            f'prepare.inject_replicas.benchmark="{path}"', "prepare.inject_replicas.k=4",
            "prepare.inject_replicas.keep_size=true"]
    longest_web = max(tokens([t]) for t in web)
    totals = {}
    for unit, extra in (("tokens", [f'prepare.inject_replicas.tokenizer="{tok_path}"']),
                        ("words", [])):
        run = tmp_path / f"run-{unit}"
        run_prepare(load_config(None, base + extra).prepare, run, [str(src)], progress=False)
        docs = list(read_documents(run))
        assert sum(d.metadata.get("injected_item") is not None for d in docs) == 8
        totals[unit] = tokens(d.text for d in docs)
        manifest = json.loads((run / "injection" / "injection-00000.json").read_text())
        assert manifest["size_unit"] == unit
    assert tokens(web) - longest_web < totals["tokens"] <= tokens(web)
    assert totals["words"] > tokens(web) + longest_web  # why words are not enough


def test_the_inject_counting_tokenizer_is_part_of_the_inputs_fingerprint(tmp_path):
    """Another tokenizer.json at the same path counts other sizes: re-make, not resume."""
    from kiln.data.prepare_config import InjectOptions, PrepareConfig
    from kiln.data.prepare_inputs import input_files

    tok, bench_file = tmp_path / "tok.json", tmp_path / "b.jsonl"
    tok.write_text('{"v": 1}')
    bench_file.write_text('{"problem": "p", "solution": "s"}\n')
    cfg = PrepareConfig(stages=["read", "inject_replicas", "write"],
                        inject_replicas=InjectOptions(benchmark=str(bench_file), tokenizer=str(tok)))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    before = input_files(cfg, [str(src)], tmp_path / "run")
    tok.write_text('{"v": 2}')
    assert input_files(cfg, [str(src)], tmp_path / "run") != before


def test_a_run_that_injected_before_the_tokenizer_setting_keeps_its_signature():
    """The setting is recorded only when set: a run prepared (or trained) before it existed
    counted words, as an unset one does now, and must resume, not be re-made or refused."""
    from kiln.data.prepare_config import InjectOptions, PrepareConfig
    from kiln.data.prepare_signature import make_signature

    cfg = PrepareConfig(stages=["read", "inject_replicas", "write"],
                        inject_replicas=InjectOptions(benchmark="/b.jsonl"))
    recorded = {"benchmark": "/b.jsonl", "k": 1, "seed": 0, "keep_size": False}
    assert make_signature(cfg, ["src"], 0)["inject_replicas"] == recorded
    cfg.inject_replicas.tokenizer = "/tok.json"
    assert make_signature(cfg, ["src"], 0)["inject_replicas"] == {**recorded, "tokenizer": "/tok.json"}


@pytest.mark.parametrize("after", ["quality", "language", "brain_rot_m2", "period", "gutenberg"])
def test_a_filter_after_injection_is_refused_as_it_may_drop_replicas(after):
    """A quality or language filter (or any stage that drops or edits documents) after the
    injection could drop replicas (a benchmark item is no English prose), while the manifest
    reports k copies of each; tagging stages and scoring may follow."""
    from kiln.data.prepare_checks import validate_prepare
    from kiln.data.prepare_config import (
        InjectOptions,
        LanguageOptions,
        PeriodOptions,
        PrepareConfig,
    )
    from kiln.errors import ConfigError

    pre = ["dating"] if after == "period" else []  # period needs dated documents

    def config(*stages: str, **options) -> PrepareConfig:
        return PrepareConfig(stages=["read", *pre, *stages, "write"],
                             inject_replicas=InjectOptions(benchmark="b.jsonl"),
                             period=PeriodOptions(periods=["1800-1849"] if pre else []),
                             **options)

    with pytest.raises(ConfigError, match=f"'{after}' after 'inject_replicas' may drop or change"):
        validate_prepare(config("inject_replicas", after), making_data=True)
    validate_prepare(config("inject_replicas", after))  # a recorded config still loads
    validate_prepare(config(after, "inject_replicas"), making_data=True)
    validate_prepare(PrepareConfig(stages=["read", "inject_replicas", "language", "write"],
                                   inject_replicas=InjectOptions(benchmark="b.jsonl"),
                                   language=LanguageOptions(mode="tag")), making_data=True)


def test_a_leak_across_the_cut_of_a_long_text_is_caught(tmp_path, bench):
    """The reader cuts a text over its limit into parts (`part_of`), each filtered alone: an
    answer whose words straddle the cut gave no n-gram in either part, and was kept."""
    path, raw = bench
    NGramIndex.build([path], n=13).save(tmp_path / "i.npz")
    words = raw[0][1].split()  # a 30-word answer: 8 words end one part, 22 begin the next

    def part(k: int, text: str, of: str = "dump.txt") -> Document:
        return Document(text=text, id=f"{of}#{k}", metadata={"part_of": of, "source": "src"})

    docs = [part(1, "plain words here " + " ".join(words[:8]) + "\n"),
            part(2, " ".join(words[8:20]) + " and more plain words")]
    out = run_filter(DecontaminationFilter(tmp_path / "i.npz", mode="tag"), docs)
    assert [d.metadata[MATCHES_KEY] for d in out] == [0, 8]  # the 13-grams ending in part 2
    assert out[1].metadata[BENCHMARKS_KEY] == ["mathx"]
    # not the next part of the same text: nothing joins them
    for later in (part(3, docs[1].text), part(2, docs[1].text, of="other.txt"),
                  Document(text=docs[1].text, id="dump.txt#2")):
        out = run_filter(DecontaminationFilter(tmp_path / "i.npz", mode="tag"), [docs[0], later])
        assert [d.metadata[MATCHES_KEY] for d in out] == [0, 0], later.id


def test_a_cjk_benchmark_passage_inside_a_document_is_caught(tmp_path):
    """Chinese and Japanese have no spaces: split on spaces, a passage was one "word", with no
    13-gram (the benchmark below was refused as catching nothing) and no token equal to a
    document's. Each Han / kana character is a token now: the passage quoted inside a
    sentence is caught, an unrelated text in the same scripts is not, and spaced scripts
    (Latin, Cyrillic, Hangul) keep their words."""
    zh = ("小明有十二个苹果他给了小红三个又买了五个请问小明现在一共有多少个苹果", "十四个")
    ja = ("太郎は毎朝七時に起きて駅まで歩き電車で会社に行きますが今日は雨でした", "バスで行った")
    path = write_benchmark(tmp_path / "cjk.jsonl", [zh, ja], "question", "answer")
    NGramIndex.build([path], n=13).save(tmp_path / "i.npz")
    docs = [
        Document(text=f"我们昨天在课堂上讨论了{zh[0]}答案是{zh[1]}然后老师就下课了", id="zh_leak"),
        Document(text=f"ブログ：{ja[0][:20]}ね。", id="ja_leak"),  # 20 characters of the problem
        Document(text="今天天气很好，我们去公园散步，看到很多人在放风筝，孩子们玩得很开心。", id="zh"),
        Document(text="私は毎日図書館で本を読みます。静かな場所が好きです。", id="ja"),
    ]
    out = run_filter(DecontaminationFilter(tmp_path / "i.npz", mode="tag"), docs)
    assert {d.id: bool(d.metadata[BENCHMARKS_KEY]) for d in out} == {
        "zh_leak": True, "ja_leak": True, "zh": False, "ja": False}
    assert normalize_tokens("今天，天气") == ["今", "天", "天", "气"]
    assert normalize_tokens("Привет, мир! 한국어 문장입니다 café") == [
        "привет", "мир", "한국어", "문장입니다", "café"]


def test_a_short_cjk_problem_is_matched_whole_only_when_it_says_five_words(tmp_path):
    """Each Han / kana character is a token, so a six-character problem ("今天天气很好", a
    common phrase) passed the exact rule's five-word floor and every document quoting the
    phrase was contamination. A character counts half a word there now: twelve characters
    (a real short problem) are still matched whole, six are not."""
    short = ("今天天气很好", "是")
    real = ("小明有十二个苹果给了小红", "九个")
    path = write_benchmark(tmp_path / "zh.jsonl", [short, real], "question", "answer")
    NGramIndex.build([path], n=13).save(tmp_path / "i.npz")
    docs = [Document(text="早上起来我说今天天气很好然后出门了", id="phrase"),
            Document(text="练习题：小明有十二个苹果给了小红，还剩几个？", id="leak")]
    out = run_filter(DecontaminationFilter(tmp_path / "i.npz", mode="tag"), docs)
    assert {d.id: bool(d.metadata[BENCHMARKS_KEY]) for d in out} == {"phrase": False,
                                                                     "leak": True}


def test_word_count_splits_han_and_kana_as_decontamination_does():
    """inject_replicas counted words by spaces: a Chinese or Japanese document was one word
    (or a few), so keep_size weighed a CJK shard at a handful of words against replicas of
    hundreds and refused it, or dropped a CJK document for one English one. Each Han or kana
    character is a word now, as the decontamination normaliser splits them; ASCII unchanged."""
    for text in ["今天天气很好我们去公园散步", "私は東京に住んでいます", "ｶﾀｶﾅ テスト",
                 "Hello world 你好 世界 abc", "The answer is x plus one"]:
        assert word_count(text) == len(normalize_tokens(text)), text
    # punctuation standing alone is a word, as in whitespace splitting ("a , b": 3)
    assert word_count("今天天气很好，我们去公园散步。") == 15
    assert word_count("state-of-the-art , done") == 3  # ASCII: whitespace words, as before


def test_keep_size_weighs_a_chinese_shard_in_its_characters(tmp_path, bench):
    path, _ = bench
    rng = random.Random(4)
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 500)]
    shard = [Document(text="".join(rng.choice(han) for _ in range(50)) + "。", id=f"w{i}")
             for i in range(12)]  # 51 words each (the 。 one); 5 replicas of 52 words
    step = InjectReplicas(path, k=1, seed=0, manifest_dir=tmp_path / "m", keep_size=True)
    out = list(step.run(iter(shard)))
    manifest = json.loads((tmp_path / "m/injection-00000.json").read_text())
    assert manifest["replicas"] == 5 and manifest["replica_tokens"] == 5 * 52
    assert manifest["web_docs"] == 6 and manifest["web_tokens"] == 306  # 352 words were free
    assert len(out) == 11
