"""benchmarks/gpu_train_check.py gives MFU against the right chip's datasheet peak."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_train_check  # noqa: E402


def _run(tmp_path: Path, precision: str = "bf16", world_size: int = 1) -> Path:
    (tmp_path / "model.json").write_text(json.dumps(
        {"flops_per_token": 30_000_000, "precision": precision, "world_size": world_size}))
    return tmp_path


def test_mfu_against_the_h100_sxm_bf16_peak(tmp_path):
    util, peak = gpu_train_check.mfu(_run(tmp_path), 200_000.0, "NVIDIA H100 80GB HBM3")
    assert peak == 989e12
    assert util == pytest.approx(200_000 * 30e6 / 989e12)


def test_mfu_is_per_rank_and_per_precision(tmp_path):
    # 8 ranks' tokens/s over 8 chips; fp32 against the fp32 peak, not the bf16 one
    util, peak = gpu_train_check.mfu(_run(tmp_path, "fp32", 8), 8 * 50_000.0, "NVIDIA H200")
    assert peak == 67e12
    assert util == pytest.approx(50_000 * 30e6 / 67e12)


def test_no_mfu_without_a_known_peak(tmp_path):
    assert gpu_train_check.mfu(_run(tmp_path), 1e5, None) == (None, None)  # a CPU
    assert gpu_train_check.mfu(_run(tmp_path), 1e5, "NVIDIA GeForce RTX 4090") == (None, None)


def test_no_gpu_name_on_a_cpu():
    assert gpu_train_check.gpu_name("cpu") is None
