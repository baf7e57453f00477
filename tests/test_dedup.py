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
