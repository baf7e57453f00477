"""Next-token concentration (`kiln.eval.concentration`): the statistics against references,
and `kiln eval`'s figures against a direct softmax of a tiny model's logits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from kiln.data.loader import eval_batches
from kiln.eval.concentration import KEYS, concentration_sums, score_positions
from kiln.eval.perplexity import evaluate
from kiln.model import Transformer
from kiln.train.train_setup import model_config_for_run


def means(logits: torch.Tensor) -> dict[str, float]:
    got = concentration_sums(torch.log_softmax(logits.float(), dim=1)) / logits.shape[0]
    return dict(zip(KEYS, got.tolist()))


def test_one_hot_is_fully_concentrated():
    logits = torch.zeros(3, 300)
    logits[0, 7] = logits[1, 0] = logits[2, 299] = 1000.0  # exp(-1000) is 0 in fp32
    got = means(logits)
    assert got == {"top1_prob": 1.0, "top5_mass": 1.0, "top10_mass": 1.0, "k90": 1.0,
                   "top100_entropy": 0.0, "entropy": 0.0}


def test_uniform_over_the_vocabulary():
    """V = 128: every p is 2^-7, so the running sums are exact; 0.9 x 128 = 115.2 -> k90 116."""
    got = means(torch.zeros(4, 128))
    assert got["top1_prob"] == pytest.approx(1 / 128, rel=1e-6)
    assert got["top5_mass"] == pytest.approx(5 / 128, rel=1e-6)
    assert got["top10_mass"] == pytest.approx(10 / 128, rel=1e-6)
    assert got["k90"] == 116
    assert got["top100_entropy"] == pytest.approx(math.log(100), rel=1e-6)
    assert got["entropy"] == pytest.approx(math.log(128), rel=1e-6)


def test_a_hand_computed_example():
    """Row 1, V = 5, p = (0.5, 0.2, 0.15, 0.1, 0.05) (shuffled): top-1 0.5; top-5 = top-10 = 1
    (k capped at V); running sums 0.5, 0.7, 0.85, 0.95 -> k90 = 4; all 5 are the top 100, so
    both entropies are -(0.5 ln 0.5 + 0.2 ln 0.2 + 0.15 ln 0.15 + 0.1 ln 0.1 + 0.05 ln 0.05)
    = 0.346574 + 0.321888 + 0.284568 + 0.230259 + 0.149787 = 1.333075.

    Row 2, V = 102: p = 0.5 on one token, 0.5 / 101 on each of the other 101. Top-5 mass
    0.5 + 4 x 0.5/101 = 0.519802; top-10 0.5 + 9 x 0.5/101 = 0.544554; 0.5 + k x 0.5/101 >=
    0.9 first at k = 81 others -> k90 = 82. The top 100 hold 0.5 (1 + 99/101) = 100/101, so
    renormalised q = 0.505 and 99 x 0.005: top-100 entropy = 0.505 ln(1/0.505) + 0.495
    ln(200) = 0.345014 + 2.622667 = 2.967681. Full entropy = 0.5 ln 2 + 0.5 ln(202) = 0.5 x 0.693147 + 0.5 x 5.308268 =
    0.346574 + 2.654134 = 3.000708."""
    p1 = torch.tensor([0.1, 0.5, 0.05, 0.2, 0.15], dtype=torch.float64)
    one = {k: v for k, v in zip(KEYS, (concentration_sums(p1.log()[None])).tolist())}
    assert one["top1_prob"] == pytest.approx(0.5)
    assert one["top5_mass"] == pytest.approx(1.0) and one["top10_mass"] == pytest.approx(1.0)
    assert one["k90"] == 4
    assert one["top100_entropy"] == pytest.approx(1.333075, abs=1e-6)
    assert one["entropy"] == pytest.approx(1.333075, abs=1e-6)

    p2 = torch.full((102,), 0.5 / 101, dtype=torch.float64)
    p2[40] = 0.5
    two = dict(zip(KEYS, concentration_sums(p2.log()[None]).tolist()))
    assert two["top1_prob"] == pytest.approx(0.5)
    assert two["top5_mass"] == pytest.approx(0.519802, abs=1e-6)
    assert two["top10_mass"] == pytest.approx(0.544554, abs=1e-6)
    assert two["k90"] == 82
    assert two["top100_entropy"] == pytest.approx(2.967681, abs=1e-6)
    assert two["entropy"] == pytest.approx(3.000708, abs=1e-6)


def reference(logits: torch.Tensor) -> torch.Tensor:
    """The KEYS sums straight from the definitions, in fp64, one row at a time."""
    out = torch.zeros(len(KEYS), dtype=torch.float64)
    for row in logits.double():
        p = torch.softmax(row, 0)
        ranked = p.sort(descending=True).values
        mass = ranked.cumsum(0)
        k90 = int(torch.nonzero(mass >= 0.9)[0]) + 1
        q = ranked[:100] / ranked[:100].sum()
        out += torch.tensor([ranked[0], mass[4], mass[9], k90,
                             -(q * q.log()).sum(), -(p * p.log()).sum()], dtype=torch.float64)
    return out


def test_score_positions_in_chunks_matches_the_plain_softmax():
    torch.manual_seed(0)
    hidden, weight = torch.randn(37, 16), torch.randn(300, 16)
    targets = torch.randint(0, 300, (37,))
    losses, sums = score_positions(hidden, weight, targets, chunk=8)
    logits = hidden @ weight.t()
    assert torch.allclose(losses, F.cross_entropy(logits, targets, reduction="none"), atol=1e-5)
    assert torch.allclose(sums, reference(logits), rtol=1e-5)


def test_the_eval_path_matches_a_direct_softmax(tiny_run):
    """`evaluate(details=True)` on a tiny model: the means and each window's loss equal those
    computed from the model's full logits; the loss equals the plain (fused) path's."""
    cfg = tiny_config(tiny_run)
    torch.manual_seed(0)
    model = Transformer(model_config_for_run(cfg, tiny_run / "tokens")).eval()
    token_dir, seq_len, batch_size = tiny_run / "tokens", 32, 3
    got = evaluate(model, token_dir, "val", seq_len, batch_size, 0, torch.device("cpu"),
                   "fp32", details=True)
    plain = evaluate(model, token_dir, "val", seq_len, batch_size, 0, torch.device("cpu"), "fp32")

    sums, windows, n = torch.zeros(len(KEYS), dtype=torch.float64), [], 0
    for batch in eval_batches(token_dir, "val", seq_len, batch_size, 0):
        with torch.no_grad():
            logits = model(batch[:, :-1])
        sums += reference(logits.flatten(0, 1))
        ce = F.cross_entropy(logits.flatten(0, 1).double(), batch[:, 1:].flatten(),
                             reduction="none")
        windows += ce.view(len(batch), -1).mean(1).tolist()
        n += ce.numel()
    assert got["tokens"] == n and len(got["window_losses"]) == len(windows) > 1
    assert got["window_losses"] == pytest.approx(windows, rel=1e-5)
    assert got["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert got["loss"] == pytest.approx(float(np.mean(windows)), rel=1e-6)
    for key, value in zip(KEYS, (sums / n).tolist()):
        assert got["next_token"][key] == pytest.approx(value, rel=1e-5), key


def test_the_figures_are_taken_on_evenly_spaced_windows_only(tiny_run):
    """`next_token_positions` bounds the positions measured (the sort costs ~10x the head's
    matmul at a 32k vocabulary): the means are those of the windows at every stride-th place
    of the split, exactly, and the loss and window losses still cover every window."""
    cfg = tiny_config(tiny_run)
    torch.manual_seed(0)
    model = Transformer(model_config_for_run(cfg, tiny_run / "tokens")).eval()
    token_dir, seq_len, batch_size = tiny_run / "tokens", 32, 3
    everything = evaluate(model, token_dir, "val", seq_len, batch_size, 0, torch.device("cpu"),
                          "fp32", details=True)
    got = evaluate(model, token_dir, "val", seq_len, batch_size, 0, torch.device("cpu"),
                   "fp32", details=True, next_token_positions=2 * seq_len)
    n_windows = len(everything["window_losses"])
    stride = -(-n_windows // 2)
    assert n_windows > 3 and stride > 1
    sums, picked, index = torch.zeros(len(KEYS), dtype=torch.float64), 0, 0
    for batch in eval_batches(token_dir, "val", seq_len, batch_size, 0):
        with torch.no_grad():
            logits = model(batch[:, :-1])
        for row in logits:
            if index % stride == 0:
                sums += reference(row)
                picked += seq_len
            index += 1
    assert got["next_token"]["positions"] == picked == 2 * seq_len
    for key, value in zip(KEYS, (sums / picked).tolist()):
        assert got["next_token"][key] == pytest.approx(value, rel=1e-5), key
    assert got["loss"] == everything["loss"]
    assert np.array_equal(got["window_losses"], everything["window_losses"])
    off = evaluate(model, token_dir, "val", seq_len, batch_size, 0, torch.device("cpu"),
                   "fp32", details=True, next_token_positions=0)
    assert "next_token" not in off
    assert np.array_equal(off["window_losses"], everything["window_losses"])


def test_kiln_eval_writes_and_prints_the_figures(tiny_run, capsys):
    from kiln.cli import main

    assert main(["train", str(tiny_run), "--set", "train.steps=2"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=2"]) == 0
    out = capsys.readouterr().out
    got = json.loads((tiny_run / "eval.json").read_text())
    figures = got["next_token"]
    assert set(figures) == {*KEYS, "positions", "tokenizer_ids"}
    assert f"top-1 p {figures['top1_prob']:.4f}" in out and f"k for 90% mass {figures['k90']:.1f}" in out
    record = got["window_losses"]
    windows = np.load(tiny_run / record["file"])
    assert record["file"] == "eval_windows.npy" and len(windows) == record["count"] > 0
    assert windows.mean() == pytest.approx(got["loss"], rel=1e-6)  # full windows: equal weights
    assert len(got["split_sha256"]) == 64
    assert main(["report", str(tiny_run)]) == 0
    html = (tiny_run / "report.html").read_text()
    assert "next-token top-1 probability" in html and f"{figures['top1_prob']:.4f}" in html
    assert f"the tokenizer&#x27;s {figures['tokenizer_ids']:,} ids (renormalised)" in html


def test_the_figures_leave_out_a_padded_vocabularys_unused_ids():
    """Ids past the tokenizer's (model.vocab_size padded) carry mass here; the figures are
    those of the distribution over the tokenizer's ids alone, renormalised, while the loss
    stays the full softmax's cross-entropy (as training's)."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(37, 16), torch.randn(300, 16) * 0.2
    weight[256:] = 0  # the 44 padded ids: logits 0, a share of every row's mass
    targets = torch.randint(0, 256, (37,))
    losses, sums = score_positions(hidden, weight, targets, chunk=8, vocab_size=256)
    logits = hidden @ weight.t()
    assert torch.softmax(logits, 1)[:, 256:].sum(1).min() > 0.05
    assert torch.allclose(losses, F.cross_entropy(logits, targets, reduction="none"), atol=1e-5)
    assert torch.allclose(sums, reference(logits[:, :256]), rtol=1e-5)
    assert not torch.allclose(sums, reference(logits), rtol=1e-2)


def test_kiln_evals_figures_are_over_the_tokenizers_ids(tiny_run):
    """`evaluate(details=True)` on a model whose vocabulary is padded past the tokenizer's
    and whose padded rows carry mass: the figures equal those of the logits cut to the
    tokenizer's ids (`kiln generate`'s cut), the loss the full softmax's."""
    import dataclasses

    from kiln.data.shards import load_index

    cfg, token_dir, seq_len = tiny_config(tiny_run), tiny_run / "tokens", 32
    vocab = load_index(token_dir)["vocab_size"]
    model_cfg = dataclasses.replace(model_config_for_run(cfg, token_dir), vocab_size=vocab + 64)
    torch.manual_seed(0)
    model = Transformer(model_cfg).eval()
    with torch.no_grad():
        model.head.weight[vocab:] = model.head.weight[:vocab].mean(0) + 0.5
    got = evaluate(model, token_dir, "val", seq_len, 3, 2, torch.device("cpu"), "fp32",
                   details=True)
    sums, nats, n, padded_mass = torch.zeros(len(KEYS), dtype=torch.float64), 0.0, 0, 0.0
    for batch in eval_batches(token_dir, "val", seq_len, 3, 2):
        with torch.no_grad():
            logits = model(batch[:, :-1]).flatten(0, 1)
        sums += reference(logits[:, :vocab])
        nats += F.cross_entropy(logits.double(), batch[:, 1:].flatten(), reduction="sum").item()
        padded_mass += torch.softmax(logits.double(), 1)[:, vocab:].sum().item()
        n += len(logits)
    assert padded_mass / n > 0.05  # the padded ids do carry mass
    for key, value in zip(KEYS, (sums / n).tolist()):
        assert got["next_token"][key] == pytest.approx(value, rel=1e-5), key
    assert got["next_token"]["tokenizer_ids"] == vocab
    assert got["loss"] == pytest.approx(nats / n, rel=1e-6)
