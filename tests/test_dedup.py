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
