"""`checkpoint_weights.is_finite`, the check every checkpoint load and save makes of each weight: a
one-pass float64 sum in place of a bool per element. It must not call the largest finite
values of a dtype infinite (a sum in the dtype itself overflows), nor miss NaN, inf, or an
inf and a -inf that cancel into NaN."""

from __future__ import annotations

import pytest
import torch

from kiln.train.checkpoint_weights import is_finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_largest_finite_values_are_finite_and_nan_inf_are_not(dtype):
    t = torch.full((4096,), torch.finfo(dtype).max, dtype=dtype)
    assert is_finite(t)
    assert is_finite(torch.empty(0, dtype=dtype))
    for bad in ([float("nan")], [float("inf")], [-float("inf")], [float("inf"), -float("inf")]):
        u = t.clone()
        u[7 : 7 + len(bad)] = torch.tensor(bad, dtype=dtype)
        assert not is_finite(u), bad


def test_integer_tensors_are_finite():
    assert is_finite(torch.arange(10)) and is_finite(torch.zeros(3, dtype=torch.uint8))
