"""TokenLoader / eval_batches: determinism, rank slicing, exact resume, epoch wrap."""

import json

import numpy as np
import pytest
import torch

from kiln.data.loader import TokenLoader, eval_batches
from kiln.errors import ConfigError, RunDataError

SEQ = 8


def _make_shards(out_dir, n_tokens, shard_tokens, split="train"):
    """Shards holding tokens 0, 1, 2, ... so every window's content names its position."""
    tokens = np.arange(n_tokens, dtype=np.uint16)
    shards = []
    for i, start in enumerate(range(0, n_tokens, shard_tokens)):
        name = f"{split}_{i:05d}.bin"
        tokens[start : start + shard_tokens].tofile(out_dir / name)
        shards.append({"file": name, "tokens": len(tokens[start : start + shard_tokens])})
    split_info = {"shards": shards, "documents": 1, "tokens": n_tokens, "bytes": n_tokens}
    index = {"dtype": "uint16", "vocab_size": 65536, "eos_id": 0, split: split_info}
    (out_dir / "index.json").write_text(json.dumps(index))
    return out_dir


@pytest.fixture
def shards(tmp_path):
    return _make_shards(tmp_path, n_tokens=10 * SEQ + 5, shard_tokens=13)  # 10 windows


def _starts(batch):
    """Window index of each row, checking each row is a contiguous run of seq_len+1 tokens."""
    for row in batch:
        assert torch.equal(row, torch.arange(row[0], row[0] + SEQ + 1))
    assert all(int(r[0]) % SEQ == 0 for r in batch)
    return [int(r[0]) // SEQ for r in batch]


def _loader(shards, **kw):
    args = dict(split="train", seq_len=SEQ, global_batch=4, seed=0) | kw
    return TokenLoader(shards, **args)


def test_batch_shape_and_windows_cross_shards(shards):
    loader = _loader(shards)
    batch = loader.next_batch()
    assert batch.dtype == torch.int64 and batch.shape == (4, SEQ + 1)
    _starts(batch)  # contiguous even though shards are 13 tokens long


def test_epoch_covers_every_window_once_then_wraps(shards):
    loader = _loader(shards, global_batch=5)
    epoch0 = [w for _ in range(2) for w in _starts(loader.next_batch())]
    epoch1 = [w for _ in range(2) for w in _starts(loader.next_batch())]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1  # a new permutation each epoch
    # a batch straddling the epoch boundary (G=3 does not divide 10 windows)
    loader = _loader(shards, global_batch=3)
    seen = [w for _ in range(4) for w in _starts(loader.next_batch())]
    assert sorted(seen[:10]) == list(range(10)) and len(set(seen[10:])) == 2
    assert loader.state_dict()["epoch"] == 1


def test_same_seed_same_batches_other_seed_differs(shards):
    a, b, c = _loader(shards), _loader(shards), _loader(shards, seed=1)
    batches_a = [a.next_batch() for _ in range(5)]
    assert all(torch.equal(x, b.next_batch()) for x in batches_a)
    assert not all(torch.equal(x, c.next_batch()) for x in batches_a)


@pytest.mark.parametrize("world", [2, 4])
def test_rank_slices_concatenate_to_single_rank(shards, world):
    single = _loader(shards, global_batch=4)
    ranks = [_loader(shards, global_batch=4, rank=r, world_size=world) for r in range(world)]
    for _ in range(7):  # crosses two epoch boundaries
        parts = [r.next_batch() for r in ranks]
        assert all(p.shape == (4 // world, SEQ + 1) for p in parts)
        assert torch.equal(torch.cat(parts), single.next_batch())


def test_resume_gives_identical_batches(shards):
    straight = _loader(shards, global_batch=3)
    expected = [straight.next_batch() for _ in range(9)]
    first = _loader(shards, global_batch=3)
    for _ in range(4):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON-able ints
    assert state["position"] == 12 and state["step"] == 4 and state["epoch"] == 1
    resumed = _loader(shards, global_batch=3)
    resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next_batch(), e) for e in expected[4:])
    # resuming on 3 ranks continues the same global stream
    parts = [_loader(shards, global_batch=3, rank=r, world_size=3) for r in range(3)]
    for p in parts:
        p.load_state_dict(state)
    assert torch.equal(torch.cat([p.next_batch() for p in parts]), expected[4])


@pytest.mark.parametrize("position", [-3, 2.5, "7", None, True])
def test_a_damaged_position_is_refused_as_not_a_loaders_state(shards, position):
    """TypeError: the resume reports the checkpoint unreadable (a negative position was
    taken, "7" and 2.5 turned into ints, None blamed changed shards or seed)."""
    state = {**_loader(shards).state_dict(), "position": position}
    loader = _loader(shards)
    with pytest.raises(TypeError, match="not a count of windows"):
        loader.load_state_dict(state)
    assert loader.position == 0


def test_load_state_rejects_other_seed(shards):
    state = _loader(shards).state_dict()
    with pytest.raises(ValueError, match="seed"):
        _loader(shards, seed=5).load_state_dict(state)


def test_argument_errors(shards, tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        _loader(shards, global_batch=3, world_size=2)
    with pytest.raises(ConfigError, match="the train split has 85 tokens, fewer than one window "
                       "of train.seq_len"):
        _loader(shards, seq_len=1000)
    with pytest.raises(ValueError, match="unknown split"):
        _loader(shards, split="test")
    with pytest.raises(FileNotFoundError, match="kiln tokenize"):
        _loader(tmp_path / "nowhere")


def test_single_window_split_still_yields(tmp_path):
    _make_shards(tmp_path, n_tokens=SEQ + 1, shard_tokens=100)
    loader = _loader(tmp_path, global_batch=2)
    assert _starts(loader.next_batch()) == [0, 0]


def test_split_that_is_a_multiple_of_seq_len_drops_the_last_partial_window(tmp_path):
    """Each window needs seq_len+1 tokens, so a split of n tokens with n % SEQ == 0 holds one
    window fewer than n // SEQ: the last SEQ tokens cannot be a window (no target for the
    final one). Every batch over several epochs, and every eval batch, is a full window."""
    _make_shards(tmp_path, n_tokens=10 * SEQ, shard_tokens=13)
    loader = _loader(tmp_path, global_batch=3)
    seen = [w for _ in range(9) for w in _starts(loader.next_batch())]  # three epochs
    assert sorted(seen) == sorted(list(range(9)) * 3)
    assert loader.state_dict()["n_windows"] == 9
    rows = list(eval_batches(tmp_path, "train", SEQ, 4, 0))
    assert [_starts(b) for b in rows] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


def test_eval_batches_sequential_and_rank_disjoint(shards):
    kw = dict(split="train", seq_len=SEQ, batch_size=3, max_batches=0)
    all_batches = list(eval_batches(shards, **kw))
    assert [_starts(b) for b in all_batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    again = list(eval_batches(shards, **kw))
    assert all(torch.equal(x, y) for x, y in zip(all_batches, again, strict=True))
    r0 = list(eval_batches(shards, **kw, rank=0, world_size=2))
    r1 = list(eval_batches(shards, **kw, rank=1, world_size=2))
    assert [_starts(b) for b in r0] == [[0, 1, 2], [6, 7, 8]]
    assert [_starts(b) for b in r1] == [[3, 4, 5], [9]]
    limited = list(eval_batches(shards, **(kw | {"max_batches": 2})))
    assert [_starts(b) for b in limited] == [[0, 1, 2], [3, 4, 5]]


def test_eval_batches_are_counted_without_reading_and_read_one_at_a_time(shards, monkeypatch):
    """Evaluation needs every rank's batch count before the first forward; it is known
    without reading the shards, and batches are read as they are used, not all at once."""
    from kiln.data import loader

    reads = []
    stack = loader._stack
    monkeypatch.setattr(loader, "_stack", lambda *a: reads.append(1) or stack(*a))
    kw = dict(split="train", seq_len=SEQ, batch_size=3, max_batches=0)
    ranks = [eval_batches(shards, **kw, rank=r, world_size=3) for r in range(3)]
    assert [len(b) for b in ranks] == [2, 1, 1] and reads == []
    assert len(eval_batches(shards, **(kw | {"max_batches": 3}))) == 3
    first = iter(ranks[0])
    next(first)
    assert len(reads) == 1
    assert [len(list(b)) for b in ranks] == [2, 1, 1]


def test_loader_reads_real_shards(tmp_path):
    from datatrove.data import Document

    from kiln.data.shards import write_shards
    from kiln.data.tokenizer import train_tokenizer

    docs = [Document(text=f"x{i} = {i} * y\n" * 5, id=str(i)) for i in range(30)]
    tok = train_tokenizer([d.text for d in docs], 300, tmp_path / "t.json", show_progress=False)
    write_shards(docs, tok, tmp_path, val_fraction=0.0, shard_tokens=64, progress=False)
    stream = np.concatenate([[*tok.encode(d.text).ids, 0] for d in docs])
    seq = 16
    rows = torch.cat(list(eval_batches(tmp_path, "train", seq, 4, 0)))
    n_windows = (len(stream) - 1) // seq
    assert rows.shape == (n_windows, seq + 1)
    for w, row in enumerate(rows):
        assert row.tolist() == stream[w * seq : w * seq + seq + 1].tolist()


def test_a_damaged_shard_is_a_clear_error(shards):
    """A shard shorter than the index says, or gone: a one-line error (no traceback from
    the CLI) that says to re-run tokenize."""
    first, second = sorted(shards.glob("train_*.bin"))[:2]
    whole = first.read_bytes()
    first.write_bytes(whole[:-4])
    with pytest.raises(RunDataError, match=rf"{first.name} holds 11 tokens, where index.json says "
                       "13 tokens.*kiln tokenize"):
        _loader(shards)
    first.write_bytes(whole + b"\0")  # grown by part of a token: bytes, not a token count
    with pytest.raises(RunDataError, match=rf"{first.name} holds 27 bytes \(not a whole number "
                       r"of uint16 tokens\), where index.json says 13 tokens"):
        _loader(shards)
    second.unlink()
    first.unlink()
    with pytest.raises(RunDataError, match=rf"{first.name} is missing"):
        _loader(shards)


def test_a_token_id_outside_the_vocabulary_is_refused_naming_its_shard(shards):
    """An id >= vocab_size (a shard overwritten inside, same length) would otherwise be an
    index error deep in the embedding, or a device-side assert on a GPU."""
    second = sorted(shards.glob("train_*.bin"))[1]
    tokens = np.fromfile(second, dtype=np.uint16)
    tokens[3] = 65535
    index = json.loads((shards / "index.json").read_text())
    (shards / "index.json").write_text(json.dumps({**index, "vocab_size": 65535}))
    tokens.tofile(second)
    loader = _loader(shards, global_batch=10)  # one batch reads every window
    with pytest.raises(RunDataError, match=rf"{second.name} holds token id 65535 at token 3, "
                       "outside the vocabulary of 65535.*kiln tokenize"):
        loader.next_batch()
    with pytest.raises(RunDataError, match="outside the vocabulary"):
        list(eval_batches(shards, "train", SEQ, batch_size=4, max_batches=0))


def test_the_shards_fingerprint_leaves_out_what_they_were_made_from(shards):
    """Indexes written before `made_from` (or the unigram counts) was recorded must keep
    resuming."""
    from kiln.data.loader import TokenStream

    before = TokenStream(shards, "train").fingerprint
    index = json.loads((shards / "index.json").read_text())
    (shards / "index.json").write_text(json.dumps({**index, "made_from": {"documents": "x"}}))
    assert TokenStream(shards, "train").fingerprint == before
    # nor does the unigram counts file a later Kiln writes beside the same shards
    (shards / "index.json").write_text(json.dumps({**index, "unigram_counts": "u.npy"}))
    assert TokenStream(shards, "train").fingerprint == before
    (shards / "index.json").write_text(json.dumps({**index, "unigram_bpb": 1.0}))
    assert TokenStream(shards, "train").fingerprint != before


@pytest.mark.parametrize("edit", ["drop a shard", "total", "swap files", "path", "dtype", "eos"])
def test_an_index_that_disagrees_with_itself_is_refused(shards, edit):
    """The shards are checked against the index; the index is checked against itself, or an
    edited one trains on part of the data (an entry dropped) or on other files."""
    from kiln.data.loader import TokenStream

    path = shards / "index.json"
    index = json.loads(path.read_text())
    train = index["train"]
    if edit == "drop a shard":
        train["shards"] = train["shards"][:-1]
    elif edit == "total":
        train["tokens"] += 5
    elif edit == "swap files":
        train["shards"][0]["file"], train["shards"][1]["file"] = (
            train["shards"][1]["file"], train["shards"][0]["file"])
    elif edit == "path":
        train["shards"][0]["file"] = "../elsewhere/train_00000.bin"
    elif edit == "dtype":
        index["vocab_size"] = 70000  # ids past uint16
    else:
        index["eos_id"] = index["vocab_size"]
    path.write_text(json.dumps(index))
    with pytest.raises(RunDataError, match="index.json is not what `kiln tokenize` wrote"):
        TokenStream(shards, "train")


OPEN_FILES_CHILD = """
import os, resource, sys
import numpy as np
from kiln.data.loader import TokenLoader, TokenStream
shards, hard_too = sys.argv[1], sys.argv[2] == "hard"
low = len(os.listdir("/proc/self/fd")) + 64
resource.setrlimit(resource.RLIMIT_NOFILE,
                   (low, low if hard_too else resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
stream = TokenStream(shards, "train")
assert (stream.maps is None) == hard_too, stream.maps is None
loader = TokenLoader(shards, "train", seq_len=8, global_batch=64, seed=0)
for _ in range(3):
    for row in loader.next_batch().numpy():
        assert row[0] % 8 == 0 and (row == np.arange(row[0], row[0] + 9)).all(), row
print("ok")
"""


@pytest.mark.parametrize("limit", ["soft", "hard"])
def test_more_shards_than_the_open_file_limit_still_read(tmp_path, limit):
    """Each memory-mapped shard holds a file descriptor: a large corpus (1,024 shards of
    16M tokens passes a common `ulimit -n`) raises the soft limit, and past the hard one
    reads its windows from the files, rather than failing with 'Too many open files'."""
    import subprocess
    import sys

    _make_shards(tmp_path, n_tokens=300 * 13, shard_tokens=13)  # 300 shards
    result = subprocess.run([sys.executable, "-c", OPEN_FILES_CHILD, str(tmp_path), limit],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
