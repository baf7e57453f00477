"""Dedup building blocks: MinHash defaults and the normalised exact key. The dedup stages run
end to end (1 vs 2 tasks, settings reaching the stages) in tests/test_prepare_recipes.py."""

import dataclasses

import pytest
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


def _first_copies_by_hand(pairs, keys):
    """The nodes a cluster step must remove: of each connected component of `pairs` all but
    the member of smallest (key, index, task); components found by a plain graph search."""
    graph: dict = {}
    for a, b in pairs:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set()).add(a)
    removed, seen = set(), set()
    for start in graph:
        if start in seen:
            continue
        component, todo = [], [start]
        seen.add(start)
        while todo:
            node = todo.pop()
            component.append(node)
            for other in graph[node] - seen:
                seen.add(other)
                todo.append(other)
        best = min(component, key=lambda n: (keys[n[0]][n[1]], n[1], n[0]))
        removed.update(n for n in component if n != best)
    return removed


@pytest.mark.parametrize("blocks", [None, (3, 5)])
def test_minhash_cluster_removes_all_but_each_clusters_first_copy(tmp_path, monkeypatch, blocks):
    """Many clusters over 4 tasks (chains, stars, pairs repeated across buckets; keys that tie,
    so index then task decide): the step removes exactly what a plain graph search over the
    pairs says, read in small blocks (pairs and keys across block edges) or the default ones."""
    import random
    import struct

    from kiln.data.minhash_first import FirstCopyMinhashCluster

    if blocks:
        monkeypatch.setattr(FirstCopyMinhashCluster, "PAIR_BLOCK", blocks[0])
        monkeypatch.setattr(FirstCopyMinhashCluster, "KEY_BLOCK", blocks[1])
    rng = random.Random(7)
    docs = [200, 150, 1, 260]  # documents in each task
    keys = [[rng.randrange(40) for _ in range(n)] for n in docs]
    nodes = [(t, i) for t, n in enumerate(docs) for i in range(n)]
    rng.shuffle(nodes)
    pairs, at = [], 0
    while at < 480:
        members = nodes[at:at + rng.choice([2, 2, 3, 5, 9])]
        at += len(members)
        for bucket in range(3):  # each bucket: a chain over a random subset, first one all
            chain = sorted(m for m in members if bucket == 0 or rng.random() < 0.6)
            pairs += [(bucket, a, b) for a, b in zip(chain, chain[1:])]
    rng.shuffle(pairs)
    (tmp_path / "buckets").mkdir()
    (tmp_path / "order").mkdir()
    for bucket in range(3):
        (tmp_path / f"buckets/{bucket:05d}_00.dups").write_bytes(b"".join(
            struct.pack("<4I", *a, *b) for k, a, b in pairs if k == bucket))
    for t, task_keys in enumerate(keys):
        (tmp_path / f"order/{t:05d}.order").write_bytes(struct.pack(f"<{len(task_keys)}Q",
                                                                    *task_keys))
    FirstCopyMinhashCluster(str(tmp_path / "buckets"), str(tmp_path / "order"),
                            str(tmp_path / "remove"), num_buckets=3).run()
    removed = set()
    for f in (tmp_path / "remove").iterdir():
        data = f.read_bytes()
        ids = struct.unpack(f"<{len(data) // 4}I", data)
        assert list(ids) == sorted(set(ids)), f.name  # as datatrove's filter reads them
        removed.update((int(f.stem), i) for i in ids)
    expected = _first_copies_by_hand([(a, b) for _, a, b in pairs], keys)
    assert len(expected) > 250 and len({t for t, _ in expected}) >= 3
    assert removed == expected


def test_minhash_cluster_refuses_an_order_file_without_the_documents_key(tmp_path):
    import struct

    from kiln.data.minhash_first import FirstCopyMinhashCluster

    (tmp_path / "buckets").mkdir()
    (tmp_path / "order").mkdir()
    (tmp_path / "buckets/00000_00.dups").write_bytes(struct.pack("<4I", 0, 1, 0, 5))
    (tmp_path / "order/00000.order").write_bytes(struct.pack("<4Q", 0, 0, 0, 0))
    with pytest.raises(ValueError, match="no key for document 5"):
        FirstCopyMinhashCluster(str(tmp_path / "buckets"), str(tmp_path / "order"),
                                str(tmp_path / "remove"), num_buckets=1).run()


def test_minhash_cluster_without_pairs_removes_nothing(tmp_path):
    from kiln.data.minhash_first import FirstCopyMinhashCluster

    for d in ("buckets", "order", "remove"):
        (tmp_path / d).mkdir()
    (tmp_path / "buckets/00000_00.dups").write_bytes(b"")
    FirstCopyMinhashCluster(str(tmp_path / "buckets"), str(tmp_path / "order"),
                            str(tmp_path / "remove"), num_buckets=1).run()
    assert not list((tmp_path / "remove").iterdir())
