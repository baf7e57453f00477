"""Held-out evaluation: loss against a direct computation, bits per byte over the exact
bytes of the scored tokens (also on a part of the split)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import gpt2_byte_symbols, tiny_config

from kiln.data.loader import eval_batches
from kiln.data.tokenizer import load_tokenizer
from kiln.eval.perplexity import evaluate
from kiln.model import Transformer
from kiln.train.train_setup import model_config_for_run


def model_for(run_dir) -> Transformer:
    cfg = tiny_config(run_dir)
    torch.manual_seed(0)
    return Transformer(model_config_for_run(cfg, run_dir / "tokens")).eval()


@pytest.mark.parametrize("batch_size,max_batches", [(2, 1), (3, 2), (4, 0)])
def test_bits_per_byte_divides_by_the_bytes_of_the_scored_tokens(tiny_run, batch_size,
                                                                 max_batches):
    token_dir, seq_len = tiny_run / "tokens", 32
    model = model_for(tiny_run)
    tok = load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json")
    symbols, specials = gpt2_byte_symbols(), {0}
    got = evaluate(model, token_dir, "val", seq_len, batch_size, max_batches,
                   torch.device("cpu"), "fp32")

    nats = n_tokens = n_bytes = 0
    for batch in eval_batches(token_dir, "val", seq_len, batch_size, max_batches):
        with torch.no_grad():
            logits = model(batch[:, :-1])
        targets = batch[:, 1:]
        nats += F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(),
                                reduction="sum").item()
        n_tokens += targets.numel()
        n_bytes += sum(0 if t in specials else len(tok.id_to_token(t))
                       for t in targets.flatten().tolist())
        assert all(c in symbols for t in targets.flatten().tolist() if t not in specials
                   for c in tok.id_to_token(t))
    assert got["tokens"] == n_tokens and got["bytes"] == n_bytes
    assert got["bytes_counted"] == "exact"
    assert got["loss"] == pytest.approx(nats / n_tokens, rel=1e-5)
    assert got["bpb"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)


def test_shards_without_a_byte_table_fall_back_to_the_ratio(tiny_run):
    token_dir = tiny_run / "tokens"
    index = json.loads((token_dir / "index.json").read_text())
    del index["token_bytes"]
    (token_dir / "index.json").write_text(json.dumps(index))
    got = evaluate(model_for(tiny_run), token_dir, "val", 32, 4, 1, torch.device("cpu"), "fp32")
    assert got["bytes_counted"].startswith("estimated")
    assert got["bytes"] == pytest.approx(got["tokens"] * index["val"]["bytes"]
                                         / index["val"]["tokens"], abs=0.1)


@pytest.mark.parametrize("max_batches", [1, 0])
def test_the_unigram_baseline_scores_the_same_tokens(tiny_run, max_batches):
    """The baseline of an eval is the add-one unigram of the train split's counts, summed
    over exactly the scored targets and divided by their bytes: a part of the split is
    compared with its own baseline; the whole split's is close to the index's."""
    import numpy as np

    from kiln.data.loader import TokenStream

    token_dir, seq_len = tiny_run / "tokens", 32
    index = json.loads((token_dir / "index.json").read_text())
    train = TokenStream(token_dir, "train")
    counts = np.bincount(np.asarray(train.read(0, train.n_tokens), dtype=np.int64),
                         minlength=index["vocab_size"])
    assert (np.load(token_dir / "unigram_counts.npy") == counts).all()
    bits_of = -np.log2((counts + 1) / (counts.sum() + len(counts)))
    byte_len = np.load(token_dir / "token_bytes.npy").astype(np.int64)
    bits = n_bytes = 0
    for batch in eval_batches(token_dir, "val", seq_len, 4, max_batches):
        targets = batch[:, 1:].numpy()
        bits += bits_of[targets].sum()
        n_bytes += byte_len[targets].sum()
    got = evaluate(model_for(tiny_run), token_dir, "val", seq_len, 4, max_batches,
                   torch.device("cpu"), "fp32")
    assert got["unigram_bpb_scored"] == pytest.approx(bits / n_bytes, rel=1e-9)
    if not max_batches:
        assert got["unigram_bpb_scored"] == pytest.approx(index["unigram_bpb"], rel=0.02)


def test_a_partial_eval_is_judged_against_its_own_baseline(tiny_run, capsys):
    """`kiln eval` with max_batches: the verdict's baseline is the scored tokens' (printed and
    in the report); shards from before the counts were saved give no verdict on a part."""
    from kiln.cli import main

    assert main(["train", str(tiny_run), "--set", "train.steps=2"]) == 0
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=1"]) == 0
    out = capsys.readouterr().out
    got = json.loads((tiny_run / "eval.json").read_text())
    baseline = got["unigram_bpb_scored"]
    assert f"the unigram baseline {baseline:.4f} on the same tokens" in out
    assert main(["report", str(tiny_run)]) == 0
    html = (tiny_run / "report.html").read_text()
    assert "unigram baseline bpb (the same tokens)" in html and f"{baseline:.4f}" in html
    assert "the first batch of the val split" in html
    index_path = tiny_run / "tokens" / "index.json"
    index = json.loads(index_path.read_text())
    del index["unigram_counts"]
    index_path.write_text(json.dumps(index))
    capsys.readouterr()
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=1"]) == 0
    out = capsys.readouterr().out
    assert "not measured on these tokens" in out and "below" not in out
    assert main(["report", str(tiny_run)]) == 0
    html = (tiny_run / "report.html").read_text()
    assert "so the two are not compared" in html and "Beats the unigram" not in html


def test_an_eval_of_the_train_split_goes_beside_the_held_out_one(tiny_run, capsys):
    """eval.json is the held-out score the report shows: a one-off look at the train split
    must not replace it."""
    from kiln.cli import main

    assert main(["train", str(tiny_run), "--set", "train.steps=2"]) == 0
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=1"]) == 0
    held_out = (tiny_run / "eval.json").read_text()
    assert main(["eval", str(tiny_run), "--set", "eval.max_batches=1", "--set",
                 "eval.split=train"]) == 0
    assert (tiny_run / "eval.json").read_text() == held_out
    train = json.loads((tiny_run / "eval-train.json").read_text())
    assert train["split"] == "train" and train["bpb"] != json.loads(held_out)["bpb"]


def test_periodic_validation_does_not_need_the_unigram_counts(tiny_run):
    """Training does not need the baseline's counts: a run without the file (deleted, or
    from a copy) trains through its validations; `kiln eval` names the file to re-make."""
    from kiln.cli import main

    (tiny_run / "tokens" / "unigram_counts.npy").unlink()
    assert main(["train", str(tiny_run), "--set", "train.steps=6"]) == 0
    assert main(["eval", str(tiny_run)]) == 1

    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r["kind"] == "val"]
    assert not any("val_unigram_bpb" in r for r in records)  # no counts, no baseline


def test_the_validation_curve_is_drawn_against_the_baseline_of_its_own_windows(
        tiny_run, monkeypatch):
    """Periodic validation scores the first train.eval_batches batches: its records carry the
    unigram baseline on those windows (what `kiln eval` with the same max_batches computes),
    and the report's bits/byte plot draws that one, not the whole split's."""
    from conftest import tiny_config

    import kiln.report.plots as plots
    from kiln.train.trainer import Trainer

    cfg = tiny_config(tiny_run, "train.steps=2", "train.eval_every=1")
    Trainer(cfg).fit()
    val = [r for r in (json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text()
                       .splitlines()) if r["kind"] == "val"]
    same = evaluate(model_for(tiny_run), tiny_run / "tokens", "val", cfg.train.seq_len,
                    cfg.eval.batch_size, cfg.train.eval_batches, torch.device("cpu"), "fp32")
    assert [r["val_unigram_bpb"] for r in val] == [pytest.approx(same["unigram_bpb_scored"],
                                                                 rel=1e-12)] * len(val)
    whole = json.loads((tiny_run / "tokens" / "index.json").read_text())["unigram_bpb"]
    assert abs(same["unigram_bpb_scored"] - whole) > 1e-6  # a part: another baseline
    drawn = {}
    monkeypatch.setattr(plots, "save_plot", lambda path, title, ylabel, lines, baseline:
                        drawn.setdefault(path.stem, baseline))
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    plots.write_plots(records, tiny_run / "plots", whole)
    assert drawn["bpb"][0] == val[-1]["val_unigram_bpb"] and "same windows" in drawn["bpb"][1]
    for r in records:  # a run from before the records carried it: the whole split's, said so
        r.pop("val_unigram_bpb", None)
    drawn.clear()
    plots.write_plots(records, tiny_run / "plots", whole)
    assert drawn["bpb"] == (whole, f"unigram baseline {whole:.3f} (the whole val split)")
