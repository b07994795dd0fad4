"""Vector gates (log_alpha (B, H, T, dk), docs/math.md section 9) in the oracle.

The trust checks from outside the oracle (complex step, mpmath closed forms, finite differences,
jax.vjp of a float64 scan) run on vector-gate cases in tests/test_reference_trust.py. Here: the
Numba path against the NumPy reference, thread-count determinism, the scalar gate as the special
case of equal per-dimension gates, the per-dimension dlog_alpha identity, the scales, layouts and
input validation.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import glaref
from glaref import ShapeError
from glaref.gla import _reference
from glaref.tolerances import tol

from conftest import IMPLS, abs_problem, assert_scaled, logsigmoid, rand_problem, rel_err

_numba = pytest.importorskip("glaref.gla._numba")

NAMES = ("o", "h_T", "dq", "dk", "dv", "dlog_alpha", "dh0")


def _strong(rng, shape):           # per-step log decays down to about -30, every third step -30
    la = logsigmoid(rng.standard_normal(shape)) / 0.1
    la[:, :, ::3] = -30.0
    return la


def _mixed_dims(rng, shape):       # per key dimension: strongly decayed, near 1, or growing
    kind = np.arange(shape[-1]) % 3
    return np.select([kind == 0, kind == 1], [-30.0 * rng.uniform(0.5, 1.5, shape),
                                              -1e-4 * rng.uniform(0.5, 1.5, shape)],
                     rng.uniform(0.0, 0.05, shape))


GATES = {
    "standard": "standard",
    "strong_decay": _strong,
    "zero": 0.0,
    "near_one": lambda rng, shape: -1e-4 * rng.uniform(0.5, 1.5, shape),
    "positive": lambda rng, shape: rng.uniform(0.0, 0.05, shape),
    "mixed_dims": _mixed_dims,
}


def make_case(B, G, H, T, dk, dv, gate="standard", h0_scale=1.0, seed=0):
    return rand_problem(B, G, H, T, dk, dv, seed=[seed, B, G, H, T, dk, dv], log_alpha=GATES[gate],
                        h0_scale=h0_scale, vector_gate=True)


def both(p, scale=0.7, dh_T=True):
    dh = p.dh_T if dh_T else None
    a = (p.q, p.k, p.v, p.log_alpha, p.h0)
    ref = _reference.forward(*a, scale) + _reference.vjp(*a, p.do, dh, scale)
    got = _numba.forward(*a, scale) + _numba.vjp(*a, p.do, dh, scale)
    return dict(zip(NAMES, got)), dict(zip(NAMES, ref))


def assert_agree(p, scale=0.7, dh_T=True):
    __tracebackhide__ = True
    got, ref = both(p, scale, dh_T)
    errs = {}
    for name in NAMES:
        assert got[name].shape == ref[name].shape and got[name].dtype == np.float64, name
        errs[name] = rel_err(got[name], ref[name])
    bad = {n: e for n, e in errs.items() if not e <= tol("numba_vs_numpy")}
    assert not bad, f"numba vs numpy (vector gates) above {tol('numba_vs_numpy'):g}: {bad}; all: {errs}"
    return errs


# (B, G, H, T, dk, dv)
SHAPES = [(2, 2, 4, 37, 8, 8), (1, 3, 3, 20, 6, 5), (2, 1, 2, 1, 4, 4), (1, 2, 4, 131, 48, 40),
          (1, 1, 1, 200, 16, 24), (1, 1, 2, 70, 24, 9)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_numba_agrees_with_numpy(shape):
    assert_agree(make_case(*shape))


@pytest.mark.parametrize("gate", [g for g in GATES if g != "standard"])
@pytest.mark.parametrize("shape", [(1, 2, 4, 150, 16, 12), (1, 1, 1, 67, 48, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_numba_agrees_with_numpy_under_stress_gates(gate, shape):
    assert_agree(make_case(*shape, gate=gate))


def test_numba_agrees_many_chunks_h0_dominant_and_without_dh_T():
    C = _numba.VCHUNK
    for T in (2 * C, 9 * C + 5):
        assert_agree(make_case(1, 1, 2, T, 8, 6, gate="mixed_dims"))
    assert_agree(make_case(1, 2, 4, 90, 16, 16, gate="near_one", h0_scale=1e4))
    assert_agree(make_case(1, 1, 2, 40, 8, 8), dh_T=False)


def test_per_head_matches_reference_and_sums_to_grouped():
    p = make_case(1, 2, 6, 45, 8, 7)
    a = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, 0.5)
    got = _numba.vjp(*a, per_head=True)
    ref = _reference.vjp(*a, per_head=True)
    for g, r in zip(got[:2], ref[:2]):
        assert g.shape == (1, 6, 45, 8)
        assert rel_err(g, r) <= tol("numba_vs_numpy")
    grouped = _numba.vjp(*a)
    for g_head, g_sum in zip(got[:2], grouped[:2]):   # left-to-right sum over heads: same bits
        np.testing.assert_array_equal(g_sum, (g_head[:, [0, 3]] + g_head[:, [1, 4]]) + g_head[:, [2, 5]])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,T", [(0, 5), (2, 0)])
def test_empty(impl, B, T):
    p = rand_problem(B, 2, 4, T, 6, 5, seed=1, vector_gate=True)
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, impl=impl)
    assert o.shape == (B, 4, T, 5) and h_T.shape == (B, 4, 6, 5)
    np.testing.assert_array_equal(h_T, p.h0)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl=impl)
    assert g.log_alpha.shape == (B, 4, T, 6) and g.q.shape == (B, 2, T, 6)
    np.testing.assert_array_equal(g.h0, p.dh_T)


_THREAD_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from glaref.gla import _numba
    import numba
    assert numba.get_num_threads() == {n}, numba.get_num_threads()
    rng = np.random.default_rng(7)
    blobs = []
    # (2, 2, 4): groups >= threads (heads of a group in one worker); (1, 1, 3): per-head dq, dk
    # summed after the parallel loop. Both paths must give the same bits on 1 and 2 threads.
    for B, G, H, T, dk, dv in [(2, 2, 4, 100, 24, 20), (1, 1, 3, 70, 16, 8)]:
        q = rng.standard_normal((B, G, T, dk)) / 5; k = rng.standard_normal((B, G, T, dk)) / 5
        v = rng.standard_normal((B, H, T, dv))
        la = -np.logaddexp(0, -rng.standard_normal((B, H, T, dk)))
        la[0, 0, ::4, ::2] = -30.0
        h0 = rng.standard_normal((B, H, dk, dv)); do = rng.standard_normal((B, H, T, dv))
        dh_T = rng.standard_normal((B, H, dk, dv))
        outs = _numba.forward(q, k, v, la, h0, 0.3) + _numba.vjp(q, k, v, la, h0, do, dh_T, 0.3)
        outs += _numba.vjp(q, k, v, la, h0, do, dh_T, 0.3, per_head=True)[:2]
        blobs += [np.ascontiguousarray(x).tobytes() for x in outs]
    # packed sequences (scalar and vector gates): the sequences are the parallel items
    cu = np.array([0, 17, 17, 60, 61, 100])
    G, H, T, dk, dv = 2, 4, 100, 12, 10
    q = rng.standard_normal((1, G, T, dk)) / 4; k = rng.standard_normal((1, G, T, dk)) / 4
    v = rng.standard_normal((1, H, T, dv)); do = rng.standard_normal((1, H, T, dv))
    h0 = rng.standard_normal((5, H, dk, dv)); dh_T = rng.standard_normal((5, H, dk, dv))
    for la in (-np.logaddexp(0, -rng.standard_normal((1, H, T))),
               -np.logaddexp(0, -rng.standard_normal((1, H, T, dk)))):
        outs = (_numba.forward(q, k, v, la, h0, 0.3, cu_seqlens=cu)
                + _numba.vjp(q, k, v, la, h0, do, dh_T, 0.3, cu_seqlens=cu))
        blobs += [np.ascontiguousarray(x).tobytes() for x in outs]
    sys.stdout.buffer.write(b"".join(blobs))
""")


def test_numba_bit_identical_on_1_and_2_threads():
    # vector gates, and packed sequences of both gate kinds
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    blobs = []
    for n in (1, 2):
        env = dict(os.environ, NUMBA_NUM_THREADS=str(n))
        r = subprocess.run([sys.executable, "-c", _THREAD_SCRIPT.format(root=root, n=n)],
                           env=env, capture_output=True, timeout=600)
        assert r.returncode == 0, r.stderr.decode()
        blobs.append(r.stdout)
    assert len(blobs[0]) > 0
    assert blobs[0] == blobs[1]


# ---- the scalar gate as a special case --------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_equal_gates_per_dimension_give_the_scalar_gate(impl):
    """log_alpha[..., i] = the scalar gate for every i: the same o, h_T and gradients, and the
    vector dlog_alpha summed over dk is the scalar dlog_alpha (docs/math.md, section 9)."""
    p = rand_problem(2, 2, 4, 45, 5, 3, seed=4, log_alpha=_strong)
    pv = p._replace(log_alpha=np.repeat(p.log_alpha[..., None], 5, axis=-1))
    outs = {}
    for name, x in (("scalar", p), ("vector", pv)):
        o, h_T = glaref.forward(x.q, x.k, x.v, x.log_alpha, x.h0, scale=0.6, impl=impl)
        g = glaref.vjp(x.q, x.k, x.v, x.log_alpha, x.h0, x.do, x.dh_T, scale=0.6, impl=impl)
        outs[name] = {"o": o, "h_T": h_T, **g._asdict()}
    s, v = outs["scalar"], outs["vector"]
    # scales of the scalar problem (the terms are the same; the vector dlog_alpha splits them by row)
    sc = glaref.scales(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=0.6, impl="numpy")
    t = tol("trust_structural")
    for name in ("o", "h_T", "q", "k", "v", "h0"):
        assert_scaled(v[name], s[name], getattr(sc, name), t, name)
    assert v["log_alpha"].shape == pv.log_alpha.shape
    assert_scaled(v["log_alpha"].sum(axis=-1), s["log_alpha"], sc.log_alpha, t, "log_alpha summed over dk")


# ---- the identity and the scales --------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_identity_equals_direct_per_dimension(impl):
    p = make_case(2, 2, 4, 12, 4, 3, seed=8)
    args = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    ident = glaref.dlog_alpha_identity(*args, scale=0.7, impl=impl)
    direct = glaref.vjp(*args, scale=0.7, impl=impl).log_alpha
    sc = glaref.scales(*args, scale=0.7, impl=impl)
    assert ident.shape == direct.shape == p.log_alpha.shape
    assert_scaled(ident, direct, sc.log_alpha_identity + sc.log_alpha, tol("dlog_alpha_identity"),
                  "identity vs direct")


@pytest.mark.parametrize("impl", IMPLS)
def test_identity_needs_the_final_state_rows(impl):
    # teeth: without the row sums of h_T * dh_T (a kernel that ignores dh_T in dlog_alpha) the
    # identity is far outside its tolerance
    p = make_case(1, 1, 2, 10, 3, 3, seed=2)
    args = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do)
    direct = glaref.vjp(*args, p.dh_T, impl=impl).log_alpha
    right = glaref.dlog_alpha_identity(*args, p.dh_T, impl=impl)
    wrong = glaref.dlog_alpha_identity(*args, None, impl=impl)
    sc = glaref.scales(*args, p.dh_T, impl=impl)
    t = tol("dlog_alpha_identity")
    assert_scaled(right, direct, sc.log_alpha_identity + sc.log_alpha, t, "identity")
    assert np.max(np.abs(wrong - direct) / (sc.log_alpha_identity + sc.log_alpha)) > 1e6 * t


@pytest.mark.parametrize("impl", IMPLS)
def test_identity_loses_accuracy_only_in_the_strongly_decayed_dimensions(impl):
    # mixed dims: the identity cancels catastrophically where the decay is strong, not elsewhere
    p = rand_problem(1, 1, 2, 8, 4, 3, seed=10, vector_gate=True,
                     log_alpha=lambda rng, s: np.where(np.arange(s[-1]) < 2, -30.0, -0.1) * np.ones(s))
    args = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    ident = glaref.dlog_alpha_identity(*args, impl=impl)
    direct = glaref.vjp(*args, impl=impl).log_alpha
    sc = glaref.scales(*args, impl=impl)
    t = tol("dlog_alpha_identity")
    # within its own scale everywhere (rounding, not a bug) ...
    assert_scaled(ident, direct, sc.log_alpha_identity + sc.log_alpha, t, "identity")
    # ... but that scale dwarfs the result in the strong dimensions only (cancellation ratio
    # ~ e^30 there; O(10) in the mild ones, up to an occasional result that is itself near zero)
    kappa = sc.log_alpha_identity / np.abs(direct)
    assert kappa[..., :2].min() > 1e10 and np.median(kappa[..., 2:]) < 1e2, kappa


@pytest.mark.parametrize("impl", IMPLS)
def test_scales_dominate_and_equal_values_on_nonnegative_inputs(impl):
    p = make_case(1, 2, 4, 33, 6, 5, gate="mixed_dims", seed=5)
    args = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    sc = glaref.scales(*args, scale=0.8, impl=impl)
    o, h_T = glaref.forward(*args[:5], scale=0.8, impl=impl)
    g = glaref.vjp(*args, scale=0.8, impl=impl)
    vals = {"o": o, "h_T": h_T, **g._asdict()}
    t = tol("scale_dominates_f64")
    for name, x in vals.items():
        s = getattr(sc, name)
        assert s.shape == x.shape, name
        assert np.all(np.abs(x) <= s * (1 + t)), name
    assert sc.log_alpha_identity.shape == p.log_alpha.shape
    assert np.all(sc.log_alpha_identity >= sc.log_alpha * (1 - t))
    # nonnegative inputs: the abs-value run is the run itself
    pa = abs_problem(p)
    a = (pa.q, pa.k, pa.v, pa.log_alpha, pa.h0, pa.do, pa.dh_T)
    sca = glaref.scales(*a, impl=impl)
    ga = glaref.vjp(*a, impl=impl)
    np.testing.assert_array_equal(sca.log_alpha, ga.log_alpha)
    np.testing.assert_array_equal(sca.q, ga.q)


def test_bthd_layout_moves_data_only():
    p = make_case(2, 1, 3, 17, 5, 4, seed=9)
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    for impl in ("numpy", "numba"):
        o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, impl=impl)
        ot, h_Tt = glaref.forward(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, layout="bthd", impl=impl)
        np.testing.assert_array_equal(sw(ot), o)
        np.testing.assert_array_equal(h_Tt, h_T)
        g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl=impl)
        gt = glaref.vjp(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, sw(p.do), p.dh_T,
                        layout="bthd", impl=impl)
        assert gt.log_alpha.shape == (2, 17, 3, 5)
        np.testing.assert_array_equal(sw(gt.log_alpha), g.log_alpha)
        np.testing.assert_array_equal(sw(gt.q), g.q)


# ---- input validation -------------------------------------------------------------------------

def test_gate_rank_and_shape_errors_name_log_alpha():
    p = make_case(2, 2, 4, 5, 3, 2)
    with pytest.raises(ShapeError, match=re.escape("log_alpha: got shape (2, 4, 5, 3, 1) (5 dims), expected "
                                                   "3 dims (B, H, T) (scalar gate) or 4 dims (B, H, T, dk) "
                                                   "(vector gate)")):
        glaref.forward(p.q, p.k, p.v, p.log_alpha[..., None], impl="numpy")
    with pytest.raises(ShapeError, match=re.escape("log_alpha: got shape (2, 4, 5, 2), expected (2, 4, 5, 3) "
                                                   "(B, H, T, dk) (vector gate)")):
        glaref.forward(p.q, p.k, p.v, p.log_alpha[..., :2], impl="numpy")
    sw = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    with pytest.raises(ShapeError, match=re.escape("log_alpha: got shape (2, 5, 3, 3), expected (2, 5, 4, 3) "
                                                   "(B, T, H, dk) (vector gate)")):
        glaref.forward(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha)[:, :, :3], layout="bthd", impl="numpy")
    with pytest.raises(ShapeError, match=r"^log_alpha: got shape \(2, 4\) \(2 dims\)"):
        glaref.vjp(p.q, p.k, p.v, p.log_alpha[:, :, 0, 0], p.h0, p.do, impl="numpy")
