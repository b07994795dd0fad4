"""glaref.gla._problems: the rows and problems every face generates, and the rounding of a problem
to the dtype a kernel receives (correct rounding, no JAX or ml_dtypes needed), which torch and
JAX then hold exactly, so a torch kernel and a JAX kernel see the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from glaref import regimes
from glaref._inputs import ARRAYS, Dims
from glaref.gla._problems import make_problem, plan, round_problem, round_to_dtype

try:
    import torch
except ImportError:
    torch = None

BF16_EPS = 2.0 ** -7      # bfloat16's spacing of numbers in [1, 2): 7 explicit mantissa bits
F16_EPS = 2.0 ** -10      # float16's: 10 explicit mantissa bits


def _values(n: int = 200_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * np.exp(rng.uniform(-60, 60, n))


def test_bfloat16_halfway_cases_round_directly_not_through_float32():
    # 1 + eps/2 is halfway between 1 and 1 + eps: ties go to even (1). Just above halfway goes
    # up, even when the excess (2^-40) is lost by a first rounding to float32 (which would then
    # tie to even and give 1: double rounding, what torch's float64 -> bfloat16 conversion does)
    x = np.array([1 + BF16_EPS / 2, 1 + BF16_EPS / 2 + 2.0 ** -40, 1 + 3 * BF16_EPS / 2,
                  1 + BF16_EPS / 2 - 2.0 ** -40, -(1 + BF16_EPS / 2 + 2.0 ** -40)])
    want = np.array([1.0, 1 + BF16_EPS, 1 + 2 * BF16_EPS, 1.0, -(1 + BF16_EPS)])
    assert np.array_equal(round_to_dtype(x, "bfloat16"), want)


def test_bfloat16_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, 1e300, -1e300, 1e-300, -1e-300, np.nan])
    r = round_to_dtype(x, "bfloat16")
    assert np.array_equal(r[:8], [0.0, -0.0, np.inf, -np.inf, np.inf, -np.inf, 0.0, -0.0])
    assert np.array_equal(np.signbit(r[:8]), np.signbit(x[:8])) and np.isnan(r[8])


@pytest.mark.parametrize("dtype, eps", [("bfloat16", BF16_EPS), ("float16", F16_EPS)])
def test_rounding_is_to_nearest(dtype, eps):
    # every result is a number of the format and no farther from x than half its spacing there
    # (values kept inside the formats' normal ranges)
    x = _values()
    x = x[(np.abs(x) > 1e-4) & (np.abs(x) < 6e4)]
    r = round_to_dtype(x, dtype)
    spacing = eps * 2.0 ** np.floor(np.log2(np.abs(r)))
    assert np.all(np.abs(x - r) <= spacing / 2)
    assert np.array_equal(round_to_dtype(r, dtype), r)     # idempotent: r is in the format


def test_bfloat16_equals_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (JAX's bfloat16) not installed")
    x = _values()
    b = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    mid = b * (1 + BF16_EPS / 2)                          # near halfway points, both sides
    x = np.concatenate([x, mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf)])
    got = round_to_dtype(x, "bfloat16")
    assert np.array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float64))


@pytest.mark.skipif(torch is None, reason="torch is not installed (pip install 'glaref[torch]')")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_torch_holds_the_rounded_problem_exactly(dtype):
    p = make_problem("standard", Dims(2, 1, 2, 9, 4, 3), 0, dtype)
    for name in ARRAYS:
        x = getattr(p, name)
        back = torch.from_numpy(x).to(getattr(torch, dtype)).double().numpy()
        assert np.array_equal(back, x), name


def test_plan_and_make_problem():
    rows = plan(["standard", "ragged"], {"c": (1, 1, 2, 4, 3)}, [5, 6])
    assert [(r, c, d.T) for r, c, d in rows] == \
        [("standard", "c", 5), ("standard", "c", 6)] + \
        [("ragged", "c", T) for _ in (5, 6) for T in regimes.RAGGED_T]
    d = Dims(1, 1, 2, 5, 4, 3)
    p = make_problem("standard", d, 3, "float32")
    raw = regimes.make_inputs("standard", d, 3)
    assert np.array_equal(p.q, raw.q.astype(np.float32)) and p.dims == d
    assert np.array_equal(round_problem(raw, "float64").q, raw.q)
    with pytest.raises(ValueError, match=r"dtype: got 'int8', expected one of"):
        round_to_dtype(raw.q, "int8")
