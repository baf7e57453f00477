"""The throughput benchmark runs end to end, and MFU uses the right datasheet peak."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import throughput  # noqa: E402

from kiln.model import flops_per_token  # noqa: E402


@pytest.mark.parametrize("name,precision,peak", [
    ("NVIDIA H100 PCIe", "bf16", 756e12),  # before the SXM part's entry, which "H100" also matches
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H200", "bf16", 989e12),
    ("NVIDIA H100 NVL", "bf16", 835e12),  # not the SXM part's 989, which "H100" also matches
    ("NVIDIA H200 NVL", "bf16", 835e12),
    ("NVIDIA GH200 480GB", "bf16", 989e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
    ("NVIDIA GeForce RTX 4090", "bf16", None),
])
def test_spec_peak_matches_the_chip(monkeypatch, name, precision, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert throughput.spec_peak(torch.device("cuda"), precision) == peak


def test_spec_peak_is_none_on_cpu():
    assert throughput.spec_peak(torch.device("cpu"), "bf16") is None


def test_quick_fp32_bench_reports_consistent_figures():
    s = dataclasses.replace(throughput.QUICK, rounds=1, steps=1, warmup=1)
    batch = torch.randint(0, s.model.vocab_size, (s.batch, s.seq_len + 1))
    r = throughput.bench_precision(s, "fp32", False, batch, torch.device("cpu"))
    assert r["ratio"] == pytest.approx(r["kiln"] / r["hf"])
    assert r["hf"] == max(r["hf_sdpa"], r["hf_eager"]) == r[f"hf_{r['hf_attention']}"]
    # one round of one step: the per-round ratio is the run's ratio, against the same peer
    assert r["round_ratios"] == pytest.approx((r["ratio"],) * 3)
    fpt = flops_per_token(s.model, s.seq_len)
    assert r["fraction"] == pytest.approx(r["kiln"] * fpt / r["peak"])
    assert r["best_peak"] >= r["peak"] > 0 and r["fraction_vs_best"] <= r["fraction"]
    assert 0 < r["floor_fraction"] <= 1  # the floor's GEMMs cannot beat the best rate seen
    assert r["mfu"] is None and r["hf_mfu"] is None  # no datasheet peak for a CPU
