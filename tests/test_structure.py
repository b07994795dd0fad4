"""Structural properties of the recurrence that hold exactly, checked on the public oracle.

Each comparison is two float64 evaluations of the same exact quantity, measured element by
element in units of its term scale (the quantity on absolute values), tolerance
"trust_structural". Layout changes move data only and must be bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest

import glaref
from glaref._inputs import ARRAYS, GRADS
from glaref.gla import _reference
from glaref.tolerances import U64, tol

from conftest import IMPLS, abs_problem, assert_scaled, rand_problem, rel_err


def _fwd(p, impl, scale=1.0, **over):
    a = {n: over.get(n, getattr(p, n)) for n in GRADS}
    return glaref.forward(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], scale=scale, impl=impl)


def _vjp(p, impl, scale=1.0, **over):
    a = {n: over.get(n, getattr(p, n)) for n in ARRAYS}
    return glaref.vjp(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], a["do"], a["dh_T"],
                      scale=scale, impl=impl)


def _abs_fwd(p, scale=1.0):
    pa = abs_problem(p)
    return _reference.forward(pa.q, pa.k, pa.v, pa.log_alpha, pa.h0, abs(scale))


def _abs_vjp(p, scale=1.0):
    pa = abs_problem(p)
    return _reference.vjp(pa.q, pa.k, pa.v, pa.log_alpha, pa.h0, pa.do, pa.dh_T, abs(scale))


@pytest.mark.parametrize("impl", IMPLS)
def test_o_is_linear_in_v_and_in_q(impl):
    t = tol("trust_structural")
    p = rand_problem(2, 2, 4, 13, 5, 3, seed=1)
    p2 = rand_problem(2, 2, 4, 13, 5, 3, seed=2)
    a, b = 0.75, -1.5
    # v: o and h_T are linear in v when h0 = 0 (with h0 they are affine)
    zero = np.zeros_like(p.h0)
    o1, s1 = _fwd(p, impl, h0=zero)
    o2, s2 = _fwd(p, impl, v=p2.v, h0=zero)
    o, s = _fwd(p, impl, v=a * p.v + b * p2.v, h0=zero)
    sc1 = _abs_fwd(p._replace(h0=zero))
    sc2 = _abs_fwd(p._replace(v=p2.v, h0=zero))
    assert_scaled(o, a * o1 + b * o2, abs(a) * sc1[0] + abs(b) * sc2[0], t, "o(a v1 + b v2)")
    assert_scaled(s, a * s1 + b * s2, abs(a) * sc1[1] + abs(b) * sc2[1], t, "h_T(a v1 + b v2)")
    # q: o is linear in q whatever h0 is; h_T does not depend on q at all
    o1, s1 = _fwd(p, impl)
    o2, s2 = _fwd(p, impl, q=p2.q)
    o, s = _fwd(p, impl, q=a * p.q + b * p2.q)
    sc1 = _abs_fwd(p)[0]
    sc2 = _abs_fwd(p._replace(q=p2.q))[0]
    assert_scaled(o, a * o1 + b * o2, abs(a) * sc1 + abs(b) * sc2, t, "o(a q1 + b q2)")
    assert np.array_equal(s, s1) and np.array_equal(s, s2), "h_T changed with q"


@pytest.mark.parametrize("impl", IMPLS)
def test_linearity_check_sees_a_nonlinear_change(impl):
    # teeth: doubling v with h0 present is not doubling o (h0's part does not double)
    p = rand_problem(1, 1, 2, 6, 3, 2, seed=3)
    o1, _ = _fwd(p, impl)
    o2, _ = _fwd(p, impl, v=2 * p.v)
    with pytest.raises(AssertionError):
        assert_scaled(o2, 2 * o1, 2 * _abs_fwd(p)[0], tol("trust_structural"), "o(2 v)")


@pytest.mark.parametrize("impl", IMPLS)
def test_T0_returns_h0_and_empty_outputs(impl):
    p = rand_problem(2, 1, 3, 0, 4, 5, seed=4)
    o, h_T = _fwd(p, impl)
    assert o.shape == (2, 3, 0, 5) and o.dtype == np.float64
    assert np.array_equal(h_T, p.h0)
    g = _vjp(p, impl)
    assert g.q.shape == (2, 1, 0, 4) and g.k.shape == (2, 1, 0, 4)
    assert g.v.shape == (2, 3, 0, 5) and g.log_alpha.shape == (2, 3, 0)
    # with no step, h_T = h0, so dh0 = dh_T exactly (and zero without dh_T)
    assert np.array_equal(g.h0, p.dh_T)
    g0 = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, None, impl=impl)
    assert np.array_equal(g0.h0, np.zeros_like(p.h0))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("G,H", [(3, 3), (2, 4), (1, 3)])
def test_heads_equal_single_head_runs(impl, G, H):
    """Each head equals a G = H = 1 run with its group's q, k (g = h // (H // G)); dq, dk of a
    group are the sums of their heads' dq, dk."""
    t = tol("trust_structural")
    p = rand_problem(2, G, H, 11, 4, 3, seed=5)
    o, h_T = _fwd(p, impl, scale=0.6)
    g = _vjp(p, impl, scale=0.6)
    so, sh = _abs_fwd(p, 0.6)
    sg = _abs_vjp(p, 0.6)
    dq_sum, dk_sum = np.zeros_like(g.q), np.zeros_like(g.k)
    dq_sc, dk_sc = np.zeros_like(g.q), np.zeros_like(g.k)
    for h in range(H):
        grp = h // (H // G)
        one = p._replace(q=p.q[:, grp:grp + 1], k=p.k[:, grp:grp + 1], v=p.v[:, h:h + 1],
                         log_alpha=p.log_alpha[:, h:h + 1], h0=p.h0[:, h:h + 1],
                         do=p.do[:, h:h + 1], dh_T=p.dh_T[:, h:h + 1])
        o1, s1 = _fwd(one, impl, scale=0.6)
        g1 = _vjp(one, impl, scale=0.6)
        sg1 = _abs_vjp(one, 0.6)
        assert_scaled(o[:, h:h + 1], o1, so[:, h:h + 1], t, f"o head {h}")
        assert_scaled(h_T[:, h:h + 1], s1, sh[:, h:h + 1], t, f"h_T head {h}")
        assert_scaled(g.v[:, h:h + 1], g1.v, sg[2][:, h:h + 1], t, f"dv head {h}")
        assert_scaled(g.log_alpha[:, h:h + 1], g1.log_alpha, sg[3][:, h:h + 1], t, f"dlog_alpha head {h}")
        assert_scaled(g.h0[:, h:h + 1], g1.h0, sg[4][:, h:h + 1], t, f"dh0 head {h}")
        dq_sum[:, grp:grp + 1] += g1.q
        dk_sum[:, grp:grp + 1] += g1.k
        dq_sc[:, grp:grp + 1] += sg1[0]
        dk_sc[:, grp:grp + 1] += sg1[1]
    # the group sum adds H // G more roundings: within the same tolerance for H // G <= 3
    assert_scaled(g.q, dq_sum, dq_sc, t, "dq group sum")
    assert_scaled(g.k, dk_sum, dk_sc, t, "dk group sum")


@pytest.mark.parametrize("impl", IMPLS)
def test_scale_enters_linearly(impl):
    """o(scale) = scale * o(1); h_T does not depend on scale; vjp(scale, do) = vjp(1, scale * do)
    (L = sum(scale * o1 * do) + <h_T, dh_T>), with dh_T present."""
    t = tol("trust_structural")
    s = -2.5
    p = rand_problem(1, 2, 4, 9, 3, 4, seed=6)
    o1, h1 = _fwd(p, impl)
    os_, hs = _fwd(p, impl, scale=s)
    assert_scaled(os_, s * o1, abs(s) * _abs_fwd(p)[0], t, "o(scale)")
    assert np.array_equal(hs, h1), "h_T changed with scale"
    g_s = _vjp(p, impl, scale=s)
    g_1 = _vjp(p, impl, scale=1.0, do=s * p.do)
    sc = _abs_vjp(p._replace(do=abs(s) * p.do), 1.0)
    for name, a, b, c in zip(GRADS, g_s, g_1, sc):
        assert_scaled(a, b, c, t, f"d{name} with scale folded into do")


@pytest.mark.parametrize("impl", IMPLS)
def test_bthd_layout_is_the_transposed_bhtd(impl):
    """Layout changes only move data: results are bit-identical after transposing back."""
    p = rand_problem(2, 2, 4, 7, 3, 5, seed=7)
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale=0.9, impl=impl)
    o_t, h_T_t = glaref.forward(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, scale=0.9,
                                layout="bthd", impl=impl)
    assert o_t.shape == (2, 7, 4, 5)
    assert np.array_equal(sw(o_t), o) and np.array_equal(h_T_t, h_T)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=0.9, impl=impl)
    g_t = glaref.vjp(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, sw(p.do), p.dh_T,
                     scale=0.9, layout="bthd", impl=impl)
    assert g_t.q.shape == (2, 7, 2, 3) and g_t.log_alpha.shape == (2, 7, 4) and g_t.h0.shape == (2, 4, 3, 5)
    for name, a, b in zip(GRADS, g_t, g):
        a = a if name == "h0" else sw(a)
        assert np.array_equal(a, b), f"d{name}: bthd differs from bhtd"


# ----------------------------------------------------------------------------------------------
# dlog_alpha through the reverse-cumsum identity


def _identity_scale(p, scale=1.0):
    """Term scale of the identity sum_{s>=t}(q_s.dq_s - k_s.dk_s) + <h_T, dh_T>: the same sums
    on |q|, |k| and the term scales of per-head dq, dk and of h_T."""
    pa = abs_problem(p)
    dqa, dka, _, dla_abs, _ = _reference.vjp(pa.q, pa.k, pa.v, pa.log_alpha, pa.h0, pa.do, pa.dh_T,
                                             abs(scale), per_head=True)
    _, hTa = _reference.forward(pa.q, pa.k, pa.v, pa.log_alpha, pa.h0, abs(scale))
    H = p.dims.H
    qh, kh = np.repeat(pa.q, H // p.dims.G, axis=1), np.repeat(pa.k, H // p.dims.G, axis=1)
    d = np.einsum("bhtk,bhtk->bht", qh, dqa) + np.einsum("bhtk,bhtk->bht", kh, dka)
    ident = np.flip(np.cumsum(np.flip(d, axis=2), axis=2), axis=2)
    ident = ident + np.einsum("bhkv,bhkv->bh", hTa, pa.dh_T)[:, :, None]
    return ident, dla_abs


def measure_identity(p, impl, scale=1.0):
    """(max |identity - direct| / (identity scale + direct scale), max elementwise relative
    error |identity - direct| / |direct|, min cancellation ratio identity scale / |direct|)."""
    direct = _vjp(p, impl, scale=scale).log_alpha
    ident = glaref.dlog_alpha_identity(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=scale, impl=impl)
    isc, dsc = _identity_scale(p, scale)
    diff = np.abs(ident - direct)
    return {"scaled": float(np.max(diff / (isc + dsc))),
            "rel": float(np.max(diff / np.abs(direct))),
            "normwise_rel": rel_err(ident, direct),
            "cancellation": float(np.max(isc / np.abs(direct)))}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("G,H", [(1, 2), (2, 4), (3, 3)])
def test_dlog_alpha_identity_equals_direct_when_well_conditioned(impl, G, H):
    t = tol("dlog_alpha_identity")
    p = rand_problem(2, G, H, 12, 4, 3, seed=8)
    r = measure_identity(p, impl, scale=0.7)
    assert r["scaled"] <= t, r
    # and on a layout other than the canonical one
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    a = glaref.dlog_alpha_identity(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, sw(p.do), p.dh_T,
                                   scale=0.7, layout="bthd", impl=impl)
    b = glaref.dlog_alpha_identity(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=0.7, impl=impl)
    assert np.array_equal(sw(a), b)


@pytest.mark.parametrize("impl", IMPLS)
def test_dlog_alpha_identity_needs_the_final_state_term(impl):
    # teeth: dropping <h_T, dh_T> (a real kernel bug) is far outside the tolerance
    p = rand_problem(1, 1, 2, 8, 3, 3, seed=9)
    direct = _vjp(p, impl).log_alpha
    wrong = glaref.dlog_alpha_identity(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, None, impl=impl)
    right = glaref.dlog_alpha_identity(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl=impl)
    isc, dsc = _identity_scale(p)
    assert np.max(np.abs(right - direct) / (isc + dsc)) <= tol("dlog_alpha_identity")
    assert np.max(np.abs(wrong - direct) / (isc + dsc)) > 1e6 * tol("dlog_alpha_identity")


@pytest.mark.parametrize("impl", IMPLS)
def test_dlog_alpha_identity_loses_accuracy_under_strong_decay(impl):
    """Documents (measures) the identity's failure mode: at log_alpha = -30 the direct
    dlog_alpha_t = alpha_t <S_{t-1}, G_t> is ~ e^-30 times O(1) terms, while the identity adds
    O(1) terms that cancel down to it. Its error stays ~ u times its own term scale (so the
    rounding model holds), but relative to the result that is u times the cancellation ratio,
    ~ 1e13 here: the identity keeps almost no correct digit, the direct form keeps them all."""
    p = rand_problem(1, 1, 2, 8, 3, 3, seed=10, log_alpha=-30.0)
    r = measure_identity(p, impl)
    print(f"\nidentity under log_alpha=-30 ({impl}): {r}")
    assert r["scaled"] <= tol("dlog_alpha_identity"), r        # the cause: rounding x cancellation
    assert r["cancellation"] > 1e10, r                        # e^30 ~ 1e13 between terms and result
    assert r["rel"] > 1e6 * U64, r         # so far beyond what rounding gives the direct form
    # the direct form itself is fine there: it agrees with the mpmath closed form in
    # test_reference_trust (regime strong_decay) to a few u.
