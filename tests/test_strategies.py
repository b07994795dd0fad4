"""glaref.strategies: what they draw is valid, reproducible, and shrinks towards small problems."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, find, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import glaref  # noqa: E402
import glaref.strategies as gst  # noqa: E402
from glaref import regimes  # noqa: E402
from glaref._inputs import Dims, canonicalize  # noqa: E402


@given(gst.dims())
def test_dims_are_valid(d):
    assert d.H % d.G == 0 and 1 <= d.G <= d.H
    assert 1 <= d.B <= 2 and 1 <= d.T <= 70 and 1 <= d.dk <= 16 and 1 <= d.dv <= 16


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(gst.problems(with_dh_T=st.booleans()))
def test_problems_are_canonical_and_reproducible(p):
    d = p.dims
    # the oracle's own validation accepts them as they are (shapes, finiteness, float64)
    again = canonicalize(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    assert again.dims == d and p.q.shape == (d.B, d.G, d.T, d.dk)
    assert p.v.shape == p.do.shape == (d.B, d.H, d.T, d.dv) and p.log_alpha.shape == (d.B, d.H, d.T)
    assert all(x.dtype == np.float64 for x in (p.q, p.k, p.v, p.log_alpha, p.h0, p.do))


@given(gst.regimes(), gst.dims(max_seq=8, max_dk=4, max_dv=4), gst.seeds(), st.data())
def test_problem_is_a_pure_function_of_regime_dims_seed(r, d, s, data):
    p = data.draw(gst.problems(dims=st.just(d), regimes=st.just(r), seeds=st.just(s)))
    q = regimes.make_inputs(r, d, s)
    for a, b in zip(p[:7], q[:7]):
        np.testing.assert_array_equal(a, b)


def test_shrinks_to_the_smallest_problem():
    # the smallest problem with T >= 5: every other size at its minimum, the first regime, seed 0
    p = find(gst.problems(), lambda p: p.dims.T >= 5, settings=settings(database=None))
    assert p.dims == Dims(1, 1, 1, 5, 1, 1)
    np.testing.assert_array_equal(p.q, regimes.make_inputs("standard", p.dims, 0).q)
    d = find(gst.dims(), lambda d: d.H >= 4 and d.G >= 2, settings=settings(database=None))
    assert d == Dims(1, 2, 4, 1, 1, 1)
    assert find(gst.dtypes(), lambda _: True) == "float32"


@given(gst.problems(dims=gst.dims(max_seq=6, max_dk=3, max_dv=3)), gst.dtypes())
def test_rounded_is_what_a_kernel_of_that_dtype_sees(p, dtype):
    r = gst.rounded(p, dtype)
    if dtype == "float64":
        np.testing.assert_array_equal(r.v, p.v)
    import ml_dtypes
    npd = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    np.testing.assert_array_equal(r.v, p.v.astype(npd).astype(np.float64))
    # rounding twice changes nothing
    np.testing.assert_array_equal(gst.rounded(r, dtype).q, r.q)


@given(gst.problems(dims=gst.dims(max_seq=20, max_dk=6, max_dv=6)), gst.layouts())
@settings(max_examples=20)
def test_layouts_give_identical_numbers(p, layout):
    # property: the oracle's "bthd" results are its "bhtd" results, moved (pure data movement)
    from glaref._inputs import from_canonical
    args = [from_canonical(x, kind, layout) for x, kind in
            ((p.q, "qk"), (p.k, "qk"), (p.v, "v"), (p.log_alpha, "gate"))]
    o, h_T = glaref.forward(*args, p.h0, layout=layout)
    o_c, h_T_c = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0)
    np.testing.assert_array_equal(o, from_canonical(o_c, "v", layout))
    np.testing.assert_array_equal(h_T, h_T_c)


def test_bad_arguments():
    with pytest.raises(ValueError, match="regime: got 'nope'"):
        gst.regimes(["nope"])
    with pytest.raises(ValueError, match=r"names: got \('float8',\)"):
        gst.dtypes(["float8"])
    with pytest.raises(ValueError, match="dtype: got 'int8'"):
        gst.rounded(regimes.make_inputs("standard", Dims(1, 1, 1, 1, 1, 1)), "int8")


def test_import_glaref_does_not_import_hypothesis():
    code = ("import sys, json, glaref, glaref.conventions.fla, glaref.conventions.mamba2, "
            "glaref._audit._frameworks; print(json.dumps(sorted(m for m in ('hypothesis', "
            "'glaref.strategies', 'torch', 'jax') if m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
