"""glaref.delta's two implementations held together, and its public face: layouts, packed
sequences, grouped heads, thread counts, errors, non-finite results, error scales, lazy import."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from test_delta_trust import NAMES, OUTS, make_case, rel

import glaref
import glaref.delta as gd
from glaref.tolerances import tol

CASES = [
    ("g2h4_T70", (1, 2, 4, 70, 5, 3), {"beta_max": 2.0}),
    ("g1h3_T130_vector", (2, 1, 3, 130, 4, 6), {"vector": True, "l2": True}),
    ("g2h2_T9_positive", (1, 2, 2, 9, 8, 2), {"gates": "positive"}),
    ("g1h1_T1", (1, 1, 1, 1, 3, 4), {}),
    ("g1h2_T0", (1, 1, 2, 0, 3, 2), {}),
]


def _all(x, cot, scale=0.7, **kw):
    o, h_T = gd.forward(*x, scale=scale, **kw)
    return dict(zip(OUTS, (o, h_T, *gd.vjp(*x, *cot, scale=scale, **kw))))


@pytest.mark.parametrize("name,dims,kw", CASES, ids=[c[0] for c in CASES])
def test_numba_matches_numpy(name, dims, kw):
    x, cot = make_case(*dims, **kw)
    a, b = _all(x, cot, impl="numba"), _all(x, cot, impl="numpy")
    for n in OUTS:
        assert a[n].shape == b[n].shape and a[n].dtype == np.float64
        assert rel(a[n], b[n]) <= tol("delta_numba_vs_numpy"), (name, n)


@pytest.mark.parametrize("C", [33, 40, 64, 100])
def test_checkpoint_blocks_longer_than_the_output_blocks(monkeypatch, C):
    """Past T = 8192 the checkpoints are more than 32 steps apart (block_size): the backward
    then recomputes the state at every 32nd step of a block and takes the outputs 32 steps at
    a time, the last piece of a block shorter. Forced here at T = 70 (scalar and vector gates,
    G < H, dh_T given)."""
    from glaref.delta import _numba

    monkeypatch.setattr(_numba, "block_size", lambda T: C)
    for kw in ({"beta_max": 2.0}, {"vector": True}):
        x, cot = make_case(1, 2, 4, 70, 5, 3, **kw)
        a, b = _all(x, cot, impl="numba"), _all(x, cot, impl="numpy")
        for n in OUTS:
            assert rel(a[n], b[n]) <= tol("delta_numba_vs_numpy"), (C, kw, n)


def test_numba_matches_numpy_without_dh_T():
    """No final-state cotangent: the adjoint starts from zero in both implementations."""
    x, (do, _) = make_case(1, 1, 2, 37, 4, 3, vector=True)
    a, b = (gd.vjp(*x, do, None, scale=0.7, impl=impl) for impl in ("numba", "numpy"))
    for n, ga, gb in zip(OUTS[2:], a, b):
        assert rel(ga, gb) <= tol("delta_numba_vs_numpy"), n


def test_shapes_and_fields():
    x, cot = make_case(2, 1, 3, 7, 4, 5, vector=True)
    o, h_T = gd.forward(*x)
    g = gd.vjp(*x, *cot)
    assert o.shape == (2, 3, 7, 5) and h_T.shape == (2, 3, 4, 5)
    assert g._fields == NAMES
    for n, a in zip(NAMES, x):
        assert getattr(g, n).shape == a.shape


def test_T0_returns_h0_and_dh_T():
    x, cot = make_case(1, 1, 2, 0, 3, 2)
    o, h_T = gd.forward(*x)
    assert o.shape == (1, 2, 0, 2)
    np.testing.assert_array_equal(h_T, x[5])
    np.testing.assert_array_equal(gd.vjp(*x, *cot).h0, cot[1])


def test_deltanet_T1_by_hand():
    """One step of DeltaNet (log_alpha = 0), written out: S_1 = h0 + beta k (v - h0^T k)^T."""
    x, cot = make_case(1, 1, 1, 1, 3, 2, gates="zero")
    q, k, v, beta, la, h0 = x
    S1 = h0[0, 0] + beta[0, 0, 0] * np.outer(k[0, 0, 0], v[0, 0, 0] - h0[0, 0].T @ k[0, 0, 0])
    o, h_T = gd.forward(*x, scale=2.0)
    np.testing.assert_allclose(h_T[0, 0], S1, rtol=1e-14, atol=0)
    np.testing.assert_allclose(o[0, 0, 0], 2.0 * S1.T @ q[0, 0, 0], rtol=1e-14, atol=0)
    # dbeta = (v - h0^T k) . du with du = G^T k, G = 2 q do^T + dh_T
    do, dh_T = cot
    Gm = 2.0 * np.outer(q[0, 0, 0], do[0, 0, 0]) + dh_T[0, 0]
    r = v[0, 0, 0] - h0[0, 0].T @ k[0, 0, 0]
    want = r @ (Gm.T @ k[0, 0, 0])
    np.testing.assert_allclose(gd.vjp(*x, *cot, scale=2.0).beta[0, 0, 0], want, rtol=1e-13)


def test_bthd_layout_matches_bhtd():
    x, cot = make_case(2, 2, 4, 11, 3, 5, vector=True)
    a = _all(x, cot)
    sw = lambda t: np.ascontiguousarray(np.swapaxes(t, 1, 2))  # noqa: E731
    xb = [sw(t) if t.ndim >= 3 and n != "h0" else t for n, t in zip(NAMES, x)]
    b = _all(xb, (sw(cot[0]), cot[1]), layout="bthd")
    for n in OUTS:
        want = a[n] if n in ("h_T", "h0") else sw(a[n])
        np.testing.assert_array_equal(b[n], want)


def test_grouped_heads_sum_dq_dk():
    """G < H: dq and dk are the sums over each group's heads of a G = H run's."""
    x, cot = make_case(1, 2, 6, 13, 3, 2, beta_max=2.0)
    q, k = x[0], x[1]
    xr = (np.repeat(q, 3, axis=1), np.repeat(k, 3, axis=1), *x[2:])
    g, gr = gd.vjp(*x, *cot), gd.vjp(*xr, *cot)
    for n in ("q", "k"):
        want = getattr(gr, n).reshape(1, 2, 3, 13, 3).sum(axis=2)
        assert rel(getattr(g, n), want) <= tol("delta_numba_vs_numpy")
    for n in ("v", "beta", "log_alpha", "h0"):
        np.testing.assert_array_equal(getattr(g, n), getattr(gr, n))


@pytest.mark.parametrize("impl", ["numba", "numpy"])
def test_packed_equals_one_by_one(impl):
    (q, k, v, beta, la, _), (do, _) = make_case(1, 1, 2, 40, 3, 4, vector=True)
    cu = np.array([0, 7, 7, 25, 40])
    rng = np.random.default_rng(3)
    h0 = rng.standard_normal((4, 2, 3, 4))
    dh_T = rng.standard_normal((4, 2, 3, 4))
    o, h_T = gd.forward(q, k, v, beta, la, h0, cu_seqlens=cu, impl=impl)
    g = gd.vjp(q, k, v, beta, la, h0, do, dh_T, cu_seqlens=cu, impl=impl)
    for n in range(4):
        ts = slice(cu[n], cu[n + 1])
        xs = (q[:, :, ts], k[:, :, ts], v[:, :, ts], beta[:, :, ts], la[:, :, ts], h0[n:n + 1])
        o1, h1 = gd.forward(*xs, impl=impl)
        g1 = gd.vjp(*xs, do[:, :, ts], dh_T[n:n + 1], impl=impl)
        np.testing.assert_array_equal(o[:, :, ts], o1)
        np.testing.assert_array_equal(h_T[n:n + 1], h1)
        for name in NAMES:
            part = getattr(g, name)
            part = part[n:n + 1] if name == "h0" else part[:, :, ts]
            np.testing.assert_array_equal(part, getattr(g1, name))


def test_bit_identical_on_1_or_more_threads():
    import numba

    x, cot = make_case(2, 2, 4, 50, 4, 3, beta_max=2.0)
    xv, cotv = make_case(1, 1, 3, 20, 4, 3, vector=True)
    old = numba.get_num_threads()
    runs = []
    try:
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(n)
            runs.append((_all(x, cot), _all(xv, cotv)))
    finally:
        numba.set_num_threads(old)
    for a, b in zip(runs[0], runs[-1]):
        for n in OUTS:
            np.testing.assert_array_equal(a[n], b[n])


# ------------------------------------------------------------------ errors and warnings

def test_beta_shape_error_names_beta():
    x, _ = make_case(1, 1, 2, 5, 3, 2)
    bad = list(x)
    bad[3] = x[3][:, :, :4]
    with pytest.raises(glaref.ShapeError, match=r"beta: got shape \(1, 2, 4\), expected \(1, 2, 5\)"):
        gd.forward(*bad)
    sw = [np.swapaxes(a, 1, 2) if n != "h0" else a for n, a in zip(NAMES, bad)]
    with pytest.raises(glaref.ShapeError, match=r"expected \(1, 5, 2\) \(B, T, H\)"):
        gd.forward(*sw, layout="bthd")


def test_nonfinite_beta_and_dtype_refused():
    x, _ = make_case(1, 1, 2, 5, 3, 2)
    bad = list(x)
    bad[3] = x[3].copy()
    bad[3][0, 1, 2] = np.nan
    with pytest.raises(glaref.NonFiniteError, match=r"beta: got a non-finite value nan at index \(0, 1, 2\)"):
        gd.forward(*bad)
    bad[3] = np.ones((1, 2, 5), dtype=np.int64)
    with pytest.raises(glaref.DTypeError, match="beta: got dtype int64"):
        gd.forward(*bad)
    with pytest.raises(glaref.ArgumentError, match="impl: got 'cuda'"):
        gd.forward(*x, impl="cuda")
    with pytest.raises(glaref.ShapeError, match="do: got None"):
        gd.vjp(*x, None)


@pytest.mark.parametrize("impl", ["numba", "numpy"])
def test_overflow_warns(impl):
    x, cot = make_case(1, 1, 1, 40, 2, 2, gates="zero")
    big = list(x)
    big[4] = np.full(x[4].shape, 30.0)          # e^(30 * 40) overflows
    with pytest.warns(glaref.NonFiniteWarning, match="log_alpha"):
        gd.forward(*big, impl=impl)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gd.forward(*x, impl=impl)


def test_torch_and_jax_inputs_accepted():
    torch = pytest.importorskip("torch")
    x, cot = make_case(1, 1, 2, 6, 3, 2)
    want = gd.forward(*x)[0]
    got = gd.forward(*(torch.tensor(a, dtype=torch.float32) for a in x))[0]
    np.testing.assert_allclose(got, gd.forward(*(a.astype(np.float32) for a in x))[0], rtol=0)
    assert rel(got, want) < 1e-5


# ------------------------------------------------------------------ error scales

def test_scales_bound_values_and_are_exact_when_terms_agree_in_sign():
    x, cot = make_case(1, 2, 4, 12, 3, 5, vector=True, beta_max=2.0)
    vals = _all(x, cot)
    s = gd.scales(*x, *cot)
    assert s._fields == OUTS
    for n in OUTS:
        sc = getattr(s, n)
        assert sc.shape == vals[n].shape
        assert np.all(sc >= np.abs(vals[n]) * (1 - 1e-12)), n
    # With q, k, h0, do, dh_T >= 0 and v, beta <= 0 every term of o and h_T is >= 0 (each step
    # adds |beta| k (|v| + S~^T k)^T), so the scale is the value itself.
    q, k, v, beta, la, h0 = x
    xs = (np.abs(q), np.abs(k), -np.abs(v), -np.abs(beta), la, np.abs(h0))
    o, h_T = gd.forward(*xs)
    s2 = gd.scales(*xs)
    np.testing.assert_allclose(s2.o, o, rtol=1e-13)
    np.testing.assert_allclose(s2.h_T, h_T, rtol=1e-13)
    assert s2.q is None


def test_scales_T1_by_hand():
    """T = 1, DeltaNet: o = scale (h0 + beta k (v - h0^T k)^T)^T q has terms
    scale h0^T q, scale beta (k.q) v and -scale beta (k.q) h0^T k; the scale of o[j] is the sum
    of the absolute values of their scalar terms."""
    x, _ = make_case(1, 1, 1, 1, 2, 2, gates="zero")
    q, k, v, b = x[0][0, 0, 0], x[1][0, 0, 0], x[2][0, 0, 0], x[3][0, 0, 0]
    H0 = x[5][0, 0]
    s = 0.5
    want = np.zeros(2)
    for j in range(2):
        for i in range(2):
            want[j] += abs(s * H0[i, j] * q[i])
            want[j] += abs(s * b * k[i] * q[i] * v[j])
            for m in range(2):
                want[j] += abs(s * b * k[i] * q[i] * H0[m, j] * k[m])
    np.testing.assert_allclose(gd.scales(*x, scale=s).o[0, 0, 0], want, rtol=1e-14)


# ------------------------------------------------------------------ import

def test_import_glaref_loads_neither_numba_nor_jax():
    code = ("import sys, glaref; glaref.delta; assert 'numba' not in sys.modules, 'numba'; "
            "assert 'jax' not in sys.modules, 'jax'; print(glaref.delta.__all__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "forward" in r.stdout


def test_public_face():
    assert set(gd.__all__) == {"Grads", "Scales", "forward", "regimes", "scales", "vjp"}
    assert glaref.delta is gd


def test_scales_overflow_is_explained():
    """Gate 1, L2 keys, beta ~ 1: the sum of |terms| grows by up to 2x a step and overflows float64
    (1e306 at T = 1200, measured) while the values stay O(1)."""
    x, cot = make_case(1, 1, 1, 3000, 2, 2, gates="zero", l2=True)
    x = (*x[:3], np.full(x[3].shape, 0.99), *x[4:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, h_T = gd.forward(*x)
    assert np.isfinite(o).all() and np.abs(h_T).max() < 1e3
    with pytest.warns(glaref.NonFiniteWarning, match=r"sums of \|terms\| exceed float64's range"):
        gd.scales(*x, *cot)
