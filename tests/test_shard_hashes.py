"""Token shards are fingerprinted by their contents, not only their counts, and a shard
changed after `kiln tokenize` is refused when opened; opening costs a stat per shard."""

import json
import os
import shutil

import numpy as np
import pytest
from datatrove.data import Document

from kiln.data.loader import TokenLoader, TokenStream, shards_fingerprint
from kiln.data.shards import write_shards
from kiln.data.tokenizer import train_tokenizer
from kiln.errors import RunDataError

DOCS = [Document(text=f"def f{i}(x):\n    return x * {i} + {i % 7}\n", id=f"doc{i}")
        for i in range(120)]
SEQ = 8


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer([d.text for d in DOCS], 320, path, show_progress=False)


def _write(tok, out, docs=DOCS):
    return write_shards(docs, tok, out, val_fraction=0.1, seed=0, shard_tokens=400,
                        progress=False)


def _train_files(out):
    return sorted(out.glob("train_*.bin"))


def _counts(index):
    return {s: {k: index[s][k] for k in ("documents", "tokens", "bytes")} for s in ("train", "val")}


def test_the_same_documents_in_another_order_fingerprint_differently(tok, tmp_path):
    """Shards re-made from the documents in another order hold the same counts (and unigram
    baseline) but another token stream: a checkpoint's loader state must not resume on them."""
    a, b = tmp_path / "a", tmp_path / "b"
    index_a, index_b = _write(tok, a), _write(tok, b, DOCS[::-1])
    assert _counts(index_a) == _counts(index_b)
    assert index_a["unigram_bpb"] == index_b["unigram_bpb"]
    stream_a, stream_b = TokenStream(a, "train"), TokenStream(b, "train")
    assert (stream_a.read(0, stream_a.n_tokens) != stream_b.read(0, stream_b.n_tokens)).any()
    assert stream_a.fingerprint != stream_b.fingerprint
    loader_a = TokenLoader(a, "train", SEQ, global_batch=4, seed=0)
    loader_a.next_batch()
    with pytest.raises(ValueError, match="saved on other token shards"):
        TokenLoader(b, "train", SEQ, global_batch=4, seed=0).load_state_dict(
            loader_a.state_dict())


def test_a_shard_changed_in_place_is_refused(tok, tmp_path):
    """Same size, every id inside the vocabulary, its mtime put back: the index still
    matches, so only the shard's hash tells."""
    _write(tok, tmp_path)
    shard = _train_files(tmp_path)[1]
    st = shard.stat()
    tokens = np.fromfile(shard, dtype=np.uint16)
    tokens[[5, 6]] = tokens[[6, 5]] if tokens[5] != tokens[6] else (1, 2)
    tokens.tofile(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(RunDataError, match=rf"{shard.name} is not the shard `kiln tokenize` "
                       "wrote.*re-run `kiln tokenize`"):
        TokenStream(tmp_path, "train")


def test_two_shards_of_one_size_swapped_are_refused(tok, tmp_path):
    _write(tok, tmp_path)
    first, second = _train_files(tmp_path)[:2]
    assert first.stat().st_size == second.stat().st_size
    first.rename(tmp_path / "x")
    second.rename(first)
    (tmp_path / "x").rename(second)
    with pytest.raises(RunDataError, match=rf"{first.name} is not the shard"):
        TokenStream(tmp_path, "train")


def test_opening_shards_hashes_them_only_when_their_stat_changed(tok, tmp_path, monkeypatch):
    """Tokenize records each shard's stat with its hash: opening them (train, each resume,
    each validation) is a stat per shard. A copy (other inodes and times) is hashed once,
    then recorded; a read-only copy once per process."""
    import kiln.data.shard_hashes as sh

    hashed = []
    real = sh.file_sha256
    monkeypatch.setattr(sh, "file_sha256", lambda p: hashed.append(p.name) or real(p))
    _write(tok, tmp_path / "a")
    n_train = len(_train_files(tmp_path / "a"))
    TokenStream(tmp_path / "a", "train")
    TokenStream(tmp_path / "a", "val")
    assert hashed == []
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    TokenStream(tmp_path / "b", "train")
    assert len(hashed) == n_train
    TokenStream(tmp_path / "b", "train")
    assert len(hashed) == n_train  # recorded in b/checked.json
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    monkeypatch.setattr(sh, "_write_checked", lambda *a: None)  # as a read-only folder
    for _ in range(2):
        TokenStream(tmp_path / "c", "train")
    assert len(hashed) == 2 * n_train
    (tmp_path / "b" / "checked.json").write_text("{damaged")
    TokenStream(tmp_path / "b", "train")  # hashed again (this process confirmed them), no error


def test_an_index_from_before_shard_hashes_still_loads_and_resumes(tok, tmp_path):
    """An older index (no hashes) opens as before, and so does a checkpoint's loader state
    from before Kiln hashed the shards (its fingerprint was of the counts alone) on shards
    tokenized again since: accepted, and the loader says so for the trainer's note."""
    index = _write(tok, tmp_path)
    old = json.loads((tmp_path / "index.json").read_text())
    for split in ("train", "val"):
        for shard in old[split]["shards"]:
            del shard["sha256"]
    counts_fingerprint = shards_fingerprint(old)
    assert counts_fingerprint == shards_fingerprint(index, contents=False)
    loader = TokenLoader(tmp_path, "train", SEQ, global_batch=4, seed=0)
    state = {**loader.state_dict(), "data": counts_fingerprint, "position": 8}
    loader.load_state_dict(state)
    assert loader.resumed_on_counts and loader.position == 8
    with pytest.raises(ValueError, match="saved on other token shards"):
        loader.load_state_dict({**state, "data": "0" * 16})
    (tmp_path / "index.json").write_text(json.dumps(old))
    old_loader = TokenLoader(tmp_path, "train", SEQ, global_batch=4, seed=0)
    assert old_loader.stream.fingerprint == counts_fingerprint
    old_loader.load_state_dict(state)
    assert not old_loader.resumed_on_counts


def test_training_on_an_index_from_before_shard_hashes_notes_it_and_resumes_after_retokenize(
        tiny_run, capsys):
    """A run trained on an older index is told its shards are checked by size alone; once
    the same shards are tokenized again (hashes recorded) it resumes, told its checkpoint
    could only be compared by counts."""
    from conftest import tiny_config

    from kiln.train.trainer import Trainer

    path = tiny_run / "tokens" / "index.json"
    hashed = path.read_text()
    old = json.loads(hashed)
    for split in ("train", "val"):
        for shard in old[split]["shards"]:
            del shard["sha256"]
    path.write_text(json.dumps(old))
    Trainer(tiny_config(tiny_run, "train.steps=6")).fit()
    assert "was written before Kiln hashed each shard's contents" in capsys.readouterr().err
    path.write_text(hashed)  # what `kiln tokenize` of the same documents writes now
    trainer = Trainer(tiny_config(tiny_run, "train.steps=8"))
    err = capsys.readouterr().err
    assert trainer.step == 6 and "was saved on token shards whose contents were not hashed" in err
    assert "was written before Kiln hashed" not in err
