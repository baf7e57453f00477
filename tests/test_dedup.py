"""Dedup building blocks: MinHash defaults and the normalised exact key. The dedup stages run
end to end (1 vs 2 tasks, settings reaching the stages) in tests/test_prepare_recipes.py."""

import dataclasses

from datatrove.data import Document
from datatrove.pipeline.dedup import MinhashConfig

from kiln.data.dedup import minhash_config, normalized_document_text
from kiln.data.prepare_config import PrepareConfig


def test_minhash_defaults_follow_datatrove():
    m = PrepareConfig().dedup_minhash  # built into a MinhashConfig as the dedup_minhash stage does
    cfg = minhash_config(m.n_grams, m.num_buckets, m.hashes_per_bucket, m.seed)
    ref = {f.name: f.default for f in dataclasses.fields(MinhashConfig)}  # MinhashConfig()
    assert (cfg.n_grams, cfg.num_buckets, cfg.hashes_per_bucket) == (5, 14, 8)
    assert (cfg.n_grams, cfg.num_buckets, cfg.hashes_per_bucket) == (
        ref["n_grams"], ref["num_buckets"], ref["hashes_per_bucket"])
    # the documented LSH threshold ~ (1/b)^(1/r) ~ 0.72 and P(candidate | s=0.8) ~ 0.92
    b, r = cfg.num_buckets, cfg.hashes_per_bucket
    assert abs((1 / b) ** (1 / r) - 0.719) < 1e-3
    assert abs(1 - (1 - 0.8**r) ** b - 0.924) < 1e-3


def test_normalized_exact_key():
    assert normalized_document_text(Document(text="A  b\nC", id="x")) == "a b c"


def test_minhash_removes_copies_of_documents_shorter_than_an_ngram(tmp_path):
    """Short texts (a title, a one-line post, a line of CJK with no spaces) have no 5-gram:
    datatrove gives them no signature, and every copy was kept. Copies go now (in any task),
    different short texts and the empty-of-words one stay."""
    import json

    from kiln.data.documents import read_documents
    from kiln.data.pipeline import run_prepare

    src = tmp_path / "src"
    src.mkdir()
    texts = ["Subscribe now!", "Subscribe NOW", "Click here to subscribe", "今天天气很好", "!!!"]
    for i in range(3):  # three files, each with every short text: copies across tasks too
        (src / f"f{i}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = PrepareConfig(stages=["read", "dedup_minhash", "write"], tasks=2)
    summary = run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    kept = sorted(d.text for d in read_documents(tmp_path / "run"))
    # "Subscribe now!" and "Subscribe NOW" normalise alike; "!!!" has no word: all 3 kept
    assert summary["documents_out"] == len(kept) == 6
    assert kept.count("!!!") == 3 and set(kept) - {"!!!", "Subscribe NOW", "Subscribe now!"} == {
        "Click here to subscribe", "今天天气很好"}
    assert sum(t.lower().startswith("subscribe now") for t in kept) == 1


def test_minhash_finds_near_duplicates_at_the_rate_its_bands_promise(tmp_path):
    """Measured through the prepare stage (signature, buckets, cluster, filter): pairs of
    texts whose 5-gram shingle sets have a known Jaccard similarity J lose one copy at the
    rate 1 - (1 - J^8)^14 (14 bands of 8 hashes): ~0.92 at J = 0.8, ~0.06 at J = 0.5. Words
    are letters only: the normalisation folds every digit to 0 (datatrove's default)."""
    import itertools
    import json
    import math
    import random
    import string

    from kiln.data.dedup import MinhashSignature, WhitespaceWordTokenizer
    from kiln.data.documents import read_documents
    from kiln.data.pipeline import run_prepare

    rng = random.Random(0)
    vocab = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=4)]
    shingles = MinhashSignature(str(tmp_path / "s"), minhash_config(),
                                language=WhitespaceWordTokenizer()).get_shingles
    src = tmp_path / "src"
    src.mkdir()
    groups: dict[float, list[tuple[str, str, float]]] = {0.5: [], 0.8: [], 0.9: []}
    for target, pairs in groups.items():
        for _ in range(150):
            n = 200  # shared head, then a tail of k fresh words in each copy: J ~ target
            k = round((n - 4) * (1 - target) / (1 + target))
            base = rng.choices(vocab, k=n)
            a, b = " ".join(base), " ".join(base[: n - k] + rng.choices(vocab, k=k))
            sa, sb = (set(shingles(t).ravel().tolist()) for t in (a, b))
            pairs.append((a, b, len(sa & sb) / len(sa | sb)))
    rows = [{"text": t, "id": f"{target}-{i}-{c}"} for target, pairs in groups.items()
            for i, (a, b, _) in enumerate(pairs) for c, t in (("a", a), ("b", b))]
    (src / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_prepare(PrepareConfig(stages=["read", "dedup_minhash", "write"], tasks=2), tmp_path / "run",
                [str(src)], progress=False)
    kept = {d.text for d in read_documents(tmp_path / "run")}
    for target, pairs in groups.items():
        assert abs(sum(j for *_, j in pairs) / len(pairs) - target) < 0.01
        found = sum((a in kept) + (b in kept) == 1 for a, b, _ in pairs) / len(pairs)
        assert all(a in kept or b in kept for a, b, _ in pairs)  # never both copies removed
        p = sum(1 - (1 - j**8) ** 14 for *_, j in pairs) / len(pairs)
        assert abs(found - p) <= 4 * math.sqrt(p * (1 - p) / len(pairs)) + 0.01, (target, found, p)


def test_exact_dedup_keeps_the_same_copy_whatever_the_task_count(tmp_path):
    """datatrove kept the copy first in its own task: with files f0 [a, b, X], f1 [X],
    f2 [c, X, X] one task kept f0's X, two tasks (f0 and f2 in task 0) f1's. The copy first in
    read order (file listing, then line) stays now, with the same ids for 1, 2 and 3 tasks."""
    import json

    from kiln.data.documents import read_documents
    from kiln.data.pipeline import run_prepare

    src = tmp_path / "src"
    src.mkdir()
    files = {"f0": ["a a", "b b", "X X"], "f1": ["X X"], "f2": ["c c", "X X", "X X"]}
    for name, texts in files.items():
        (src / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    kept = {}
    for tasks in (1, 2, 3):
        cfg = PrepareConfig(stages=["read", "dedup_exact", "write"], tasks=tasks)
        run_prepare(cfg, tmp_path / f"run{tasks}", [str(src)], progress=False)
        kept[tasks] = sorted(d.id for d in read_documents(tmp_path / f"run{tasks}"))
    assert kept[1] == ["src/f0.jsonl:1", "src/f0.jsonl:2", "src/f0.jsonl:3", "src/f2.jsonl:1"]
    assert kept[2] == kept[1] and kept[3] == kept[1]


def test_minhash_keeps_the_copy_first_in_read_order_whatever_the_task_count(tmp_path):
    """datatrove's cluster step keeps the union-find root, found by (task, index) and cluster
    size, so which near-duplicate survived changed with the task count. The copy first in read
    order (file listing, then line) stays now: the same ids for 1, 2 and 3 tasks, and it is
    the one a single task reading the files in order would keep first."""
    import json

    from kiln.data.documents import read_documents
    from kiln.data.pipeline import run_prepare

    words = [f"w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(120)]
    base = " ".join(words)

    def near(k: int) -> str:  # one word changed in the middle: J ~ 0.92
        return base.replace(words[60], f"changed{k}")

    src = tmp_path / "src"
    src.mkdir()
    files = {"f0": ["alpha one two three four five six", "beta seven eight nine ten eleven"],
             "f1": [near(1)], "f2": ["gamma twelve thirteen fourteen fifteen", near(2)],
             "f3": [near(3), near(4)], "f4": [base]}
    for name, texts in files.items():
        (src / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    kept = {}
    for tasks in (1, 2, 3):
        cfg = PrepareConfig(stages=["read", "dedup_minhash", "write"], tasks=tasks)
        run_prepare(cfg, tmp_path / f"run{tasks}", [str(src)], progress=False)
        kept[tasks] = sorted(d.id for d in read_documents(tmp_path / f"run{tasks}"))
    assert kept[1] == ["src/f0.jsonl:1", "src/f0.jsonl:2", "src/f1.jsonl:1", "src/f2.jsonl:1"]
    assert kept[2] == kept[1] and kept[3] == kept[1]


def test_minhash_cluster_keeps_its_earliest_member_not_the_union_root(tmp_path):
    """Pairs (1, 2) then (0, 2) in one task: datatrove's union by size made 1 the root, kept 1
    and removed 0, the first document. The member of smallest read-order key stays now."""
    import struct

    from kiln.data.minhash_first import FirstCopyMinhashCluster

    (tmp_path / "buckets").mkdir()
    (tmp_path / "order").mkdir()
    (tmp_path / "buckets/00000_00.dups").write_bytes(
        struct.pack("<4I", 0, 1, 0, 2) + struct.pack("<4I", 0, 0, 0, 2))
    (tmp_path / "order/00000.order").write_bytes(struct.pack("<4Q", 0, 0, 0, 0))  # one file
    FirstCopyMinhashCluster(str(tmp_path / "buckets"), str(tmp_path / "order"),
                            str(tmp_path / "remove"), num_buckets=1).run()
    removed = (tmp_path / "remove/000000.remove").read_bytes()
    assert struct.unpack(f"<{len(removed) // 4}I", removed) == (1, 2)
