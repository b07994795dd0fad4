"""Trust in the oracle from outside it: four independent checks, all in float64.

1. complex-step derivatives of the NumPy reference forward (run in complex128) along random
   projections, against ``glaref.vjp`` for each of the five gradients;
2. an independent mpmath implementation (>= 40 digits) of the *closed form* of the forward and
   of every gradient, derived by hand, on tiny shapes and extreme decays;
3. central finite differences along random projections;
4. ``jax.vjp`` of a float64 ``lax.scan`` written here.

Errors are measured in units of each quantity's term scale (the same quantity evaluated on
absolute values, by the independent method itself wherever it can), so that cancellation in the
true value never passes for an oracle error. The ``measure_*`` functions return the figures;
the tests assert them against glaref/tolerances.py and tools can print them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import glaref
from glaref._inputs import ARRAYS, GRADS, Problem
from glaref.gla import _reference
from glaref.gla._exact import MP_DPS
from glaref.gla._exact import closed_form as _mp_closed_form
from glaref.gla._exact import scaled_error as _mp_scaled_err
from glaref.tolerances import U64, tol

from conftest import IMPLS, abs_problem, assert_scaled, rand_problem, rel_err

# Sizes of the trust checks. The tolerances' derivations assume T <= 16, dk, dv <= 8 and at most
# 4096 summed elements (see glaref/tolerances.py); _check_trust_shape holds every case to that.
# A few "multichunk" cases (T <= 160, dk, dv <= 4) cross the Numba oracle's chunk boundaries
# (64 steps) and use the wider, derived "trust_multichunk" tolerance.
PROJ_CASES = [
    # id, (B, G, H, T, dk, dv), log_alpha, scale, h0_scale
    ("g1h3", (2, 1, 3, 11, 4, 3), "standard", 0.7, 1.0),
    ("g2h2", (1, 2, 2, 9, 3, 5), "standard", 1.3, 1.0),
    ("g2h4_growth", (1, 2, 4, 16, 4, 4), lambda rng, s: 0.1 * rng.random(s), 0.45, 0.5),
    ("g1h1_strong", (1, 1, 1, 7, 2, 3), lambda rng, s: -3.0 - 3.0 * rng.random(s), 2.0, 1.0),
]
MULTICHUNK_CASES = [
    ("g1h2_T150", (1, 1, 2, 150, 4, 4), "standard", 0.5, 1.0),
    ("g2h2_T130_mild", (1, 2, 2, 130, 3, 4), lambda rng, s: -0.05 * rng.random(s), 0.25, 1.0),
]
CS_CASES = PROJ_CASES + MULTICHUNK_CASES

# Vector gates (log_alpha (B, H, T, dk), docs/math.md section 9): the same checks on the same
# sizes; the trailing dict is passed to conftest.rand_problem. "mixed dims" decays half of the key
# dimensions strongly and leaves the others near 1, the case that per-dimension decay adds.
V = {"vector_gate": True}


def _mixed_dims(rng, s):
    """Per key dimension: every other dimension strongly decayed (~ -20), the rest near 1."""
    strong = (np.arange(s[-1]) % 2 == 0)
    return np.where(strong, -20.0 * rng.uniform(0.5, 1.5, s), -1e-3 * rng.uniform(0.5, 1.5, s))


VEC_PROJ_CASES = [
    ("vec_g1h3", (2, 1, 3, 11, 4, 3), "standard", 0.7, 1.0, V),
    ("vec_g2h4_growth", (1, 2, 4, 16, 4, 4), lambda rng, s: 0.1 * rng.random(s), 0.45, 0.5, V),
    ("vec_g1h1_strong", (1, 1, 1, 7, 2, 3), lambda rng, s: -3.0 - 3.0 * rng.random(s), 2.0, 1.0, V),
    ("vec_g2h2_mixed_dims", (1, 2, 2, 9, 6, 3), _mixed_dims, 1.3, 1.0, V),
]
VEC_MULTICHUNK_CASES = [   # cross the Numba oracle's 32-step chunks of vector gates
    ("vec_g1h2_T70", (1, 1, 2, 70, 4, 4), "standard", 0.5, 1.0, V),
    ("vec_g2h2_T130_mild", (1, 2, 2, 130, 3, 4), lambda rng, s: -0.05 * rng.random(s), 0.25, 1.0, V),
]
PROJ_CASES = PROJ_CASES + VEC_PROJ_CASES
CS_CASES = CS_CASES + VEC_PROJ_CASES + VEC_MULTICHUNK_CASES


def _check_trust_shape(p: Problem) -> str:
    """'short' or 'multichunk': which derivation in glaref/tolerances.py covers this size."""
    d = p.dims
    if d.B * d.H * max(d.T, d.dk) * d.dv <= 4096:
        if d.T <= 16 and d.dk <= 8 and d.dv <= 8:
            return "short"
        if d.T <= 160 and d.dk <= 4 and d.dv <= 4:
            return "multichunk"
    raise AssertionError(f"trust case {d} is outside the shapes the trust tolerances were derived for")


def _tol(name: str, p: Problem) -> float:
    return tol(name) if _check_trust_shape(p) == "short" else tol("trust_multichunk")


def _problem(case, seed=0) -> tuple[Problem, float]:
    _, dims, la, scale, h0_scale, *extra = case
    p = rand_problem(*dims, seed=seed, log_alpha=la, h0_scale=h0_scale, **(extra[0] if extra else {}))
    _check_trust_shape(p)
    return p, scale


def _directions(p: Problem, seed: int) -> dict[str, np.ndarray]:
    """One random direction per input, scaled like that input (so steps are relative)."""
    rng = np.random.default_rng(seed + 1000)
    out = {}
    for name in GRADS:
        x = getattr(p, name)
        rms = float(np.sqrt(np.mean(x * x))) if x.size else 1.0
        out[name] = max(rms, 1e-3) * rng.standard_normal(x.shape)
    return out


def _loss_reference(p: Problem, scale: float, **override) -> complex | float:
    """L = sum(o * do) + sum(h_T * dh_T) through the NumPy reference forward (any dtype)."""
    a = {n: override.get(n, getattr(p, n)) for n in GRADS}
    o, h_T = _reference.forward(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], scale)
    return np.sum(o * p.do) + np.sum(h_T * p.dh_T)


# --------------------------------------------------------------------------------------------
# 1. complex step

CS_STEP = 1e-30


def complex_step_derivative(p: Problem, scale: float, name: str, u: np.ndarray) -> float:
    """d/de L(x + e u) at e = 0 as Im L(x + i h u) / h: no subtraction, so no cancellation."""
    x = getattr(p, name)
    L = _loss_reference(p, scale, **{name: x + 1j * CS_STEP * u})
    return float(np.imag(L) / CS_STEP)


def measure_complex_step(case, impl: str, seed: int = 0) -> dict[str, dict[str, float]]:
    p, scale = _problem(case, seed)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=scale, impl=impl)
    pa = abs_problem(p)
    out = {}
    for name, u in _directions(p, seed).items():
        exact = complex_step_derivative(p, scale, name, u)
        got = float(np.sum(getattr(g, name) * u))
        # The scale of <g, u>: the same derivative of the loss on absolute values along |u|
        # (complex step again), i.e. the sum of |every term| of the projection.
        term_scale = complex_step_derivative(pa, abs(scale), name, np.abs(u))
        out[name] = {"scaled": abs(got - exact) / term_scale,
                     "rel": abs(got - exact) / abs(exact), "exact": exact, "got": got}
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CS_CASES, ids=[c[0] for c in CS_CASES])
def test_complex_step_projections(case, impl):
    res = measure_complex_step(case, impl)
    t = _tol("trust_complex_step", _problem(case)[0])
    bad = {n: r for n, r in res.items() if not r["scaled"] <= t}
    assert not bad, f"complex step disagrees with vjp ({impl}): {bad}"


def test_complex_step_sees_a_wrong_gradient():
    # The check has teeth: a gradient off by 1e-9 in one element is caught.
    case = PROJ_CASES[0]
    p, scale = _problem(case)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=scale, impl="numpy")
    u = _directions(p, 0)["log_alpha"]
    dla = g.log_alpha.copy()
    dla[0, 0, 3] *= 1 + 1e-9
    exact = complex_step_derivative(p, scale, "log_alpha", u)
    term_scale = complex_step_derivative(abs_problem(p), abs(scale), "log_alpha", np.abs(u))
    assert abs(np.sum(dla * u) - exact) / term_scale > tol("trust_complex_step")


# --------------------------------------------------------------------------------------------
# 2. mpmath: an independent closed form, derived by hand
#
# The scalar-gate closed form (derived in glaref/gla/_exact.py's docstring) lives in the package,
# where the golden vectors' manifest (glaref/gla/_golden.py) uses it too; the vector-gate
# closed form follows.


def _mp_closed_form_vector(p: Problem, scale: float, mp) -> dict[str, np.ndarray]:
    """The closed forms of docs/math.md section 9 (vector gates), exact to ~MP_DPS digits.

    Per (b, h), with c_t[i] = log_alpha_1[i] + ... + log_alpha_t[i] and
    e(t, s, i) = exp(c_t[i] - c_s[i]) (1-based; s = 0 gives exp(c_t[i])),
    A[t, s] = sum_i q_t[i] k_s[i] e(t, s, i):
      o_t       = scale (sum_i q_t[i] e(t, 0, i) h0[i, :] + sum_{s<=t} A[t, s] v_s)
      h_T[i, :] = e(T, 0, i) h0[i, :] + sum_s e(T, s, i) k_s[i] v_s
      dv_s      = scale sum_{t>=s} A[t, s] do_t + sum_i e(T, s, i) k_s[i] dh_T[i, :]
      dk_s[i]   = scale sum_{t>=s} e(t, s, i) q_t[i] (v_s.do_t) + e(T, s, i) (dh_T v_s^T)[i]
      dq_t[i]   = scale (e(t, 0, i) (h0 do_t^T)[i] + sum_{s<=t} e(t, s, i) k_s[i] (v_s.do_t))
      dh0[i, :] = scale sum_t e(t, 0, i) q_t[i] do_t + e(T, 0, i) dh_T[i, :]
      dlog_alpha_r[i] = scale sum_{t>=r} [e(t, 0, i) q_t[i] (h0 do_t^T)[i]
                                         + sum_{s<r} e(t, s, i) q_t[i] k_s[i] (v_s.do_t)]
                        + e(T, 0, i) sum_j h0[i, j] dh_T[i, j] + sum_{s<r} e(T, s, i) k_s[i] (dh_T v_s^T)[i]
    """
    B, G, H, T, dk, dv = (p.dims.B, p.dims.G, p.dims.H, p.dims.T, p.dims.dk, p.dims.dv)
    F = mp.mpf
    sc = F(scale)

    def cv(x):
        return np.vectorize(F, otypes=[object])(x) if x.size else np.empty(x.shape, object)

    q, k, v, la, h0, do, dh = (cv(getattr(p, n)) for n in ARRAYS)

    def dot(a, b):
        return mp.fsum(x * y for x, y in zip(a, b))

    zeros = lambda *s: np.full(s, F(0), dtype=object)  # noqa: E731
    o, hT, dq, dk_, dvv, dla, dh0 = (zeros(B, H, T, dv), zeros(B, H, dk, dv), zeros(B, G, T, dk),
                                     zeros(B, G, T, dk), zeros(B, H, T, dv), zeros(B, H, T, dk),
                                     zeros(B, H, dk, dv))
    n = H // G
    for b in range(B):
        for h in range(H):
            g = h // n
            Q, K, V, DO, H0, DH = q[b, g], k[b, g], v[b, h], do[b, h], h0[b, h], dh[b, h]
            c = [[F(0)] * dk]
            for t in range(T):
                c.append([c[-1][i] + la[b, h, t, i] for i in range(dk)])
            ex = {(t, s): [mp.exp(c[t][i] - c[s][i]) for i in range(dk)]
                  for t in range(T + 1) for s in range(t + 1)}
            e = lambda t, s, i: ex[(t, s)][i]  # noqa: E731, B023  (1-based t, s)
            # 0-based index j stands for step j + 1 below
            vdo = [[dot(V[s], DO[t]) for s in range(T)] for t in range(T)]     # vdo[t][s] = v_s.do_t
            h0do = [[dot(H0[i], DO[t]) for i in range(dk)] for t in range(T)]
            dhv = [[dot(DH[i], V[s]) for i in range(dk)] for s in range(T)]
            h0dh = [dot(H0[i], DH[i]) for i in range(dk)]
            A = [[mp.fsum(Q[t, i] * K[s, i] * e(t + 1, s + 1, i) for i in range(dk)) if s <= t else F(0)
                  for s in range(T)] for t in range(T)]
            for t in range(T):
                for m in range(dv):
                    o[b, h, t, m] = sc * (mp.fsum(Q[t, i] * e(t + 1, 0, i) * H0[i, m] for i in range(dk))
                                          + mp.fsum(A[t][s] * V[s, m] for s in range(t + 1)))
            for i in range(dk):
                for m in range(dv):
                    hT[b, h, i, m] = e(T, 0, i) * H0[i, m] + mp.fsum(e(T, s + 1, i) * K[s, i] * V[s, m]
                                                                     for s in range(T))
                    dh0[b, h, i, m] = (sc * mp.fsum(e(t + 1, 0, i) * Q[t, i] * DO[t, m] for t in range(T))
                                       + e(T, 0, i) * DH[i, m])
            for s in range(T):
                for m in range(dv):
                    dvv[b, h, s, m] = (sc * mp.fsum(A[t][s] * DO[t, m] for t in range(s, T))
                                       + mp.fsum(e(T, s + 1, i) * K[s, i] * DH[i, m] for i in range(dk)))
                for i in range(dk):
                    dk_[b, g, s, i] += (sc * mp.fsum(e(t + 1, s + 1, i) * Q[t, i] * vdo[t][s]
                                                     for t in range(s, T))
                                        + e(T, s + 1, i) * dhv[s][i])
            for t in range(T):
                for i in range(dk):
                    dq[b, g, t, i] += sc * (e(t + 1, 0, i) * h0do[t][i]
                                            + mp.fsum(e(t + 1, s + 1, i) * K[s, i] * vdo[t][s]
                                                      for s in range(t + 1)))
            for r in range(1, T + 1):
                for i in range(dk):
                    acc = [e(T, 0, i) * h0dh[i]]
                    acc += [e(T, s, i) * K[s - 1, i] * dhv[s - 1][i] for s in range(1, r)]
                    for t in range(r, T + 1):
                        acc.append(sc * e(t, 0, i) * Q[t - 1, i] * h0do[t - 1][i])
                        acc += [sc * e(t, s, i) * Q[t - 1, i] * K[s - 1, i] * vdo[t - 1][s - 1]
                                for s in range(1, r)]
                    dla[b, h, r - 1, i] = mp.fsum(acc)
    return {"o": o, "h_T": hT, "q": dq, "k": dk_, "v": dvv, "log_alpha": dla, "h0": dh0}


MP_REGIMES = {
    "strong_decay": dict(log_alpha=-30.0),
    "zero_gate": dict(log_alpha=0.0),
    "positive": dict(log_alpha=lambda rng, s: 0.2 + 0.3 * rng.random(s)),
    "h0_dominant": dict(log_alpha="standard", h0_scale=1e4),
    "standard": dict(log_alpha="standard"),
}
MP_SHAPES = {  # (B, G, H, T, dk, dv)
    "g1h2": (1, 1, 2, 8, 3, 2),
    "g2h4": (1, 2, 4, 6, 2, 3),
    "g2h2": (2, 2, 2, 5, 3, 3),
    "g2h2_T70": (1, 2, 2, 70, 2, 2),   # crosses the Numba oracle's 64-step chunk boundary
}


_MP_EXACT: dict = {}   # (regime, shape, seed) or (sweep case, seed) -> exact values and term scales


def _oracle_outputs(p: Problem, scale: float, impl: str) -> dict[str, np.ndarray]:
    """o, h_T and the five gradients of the oracle ``impl`` on ``p``, by name."""
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale=scale, impl=impl)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=scale, impl=impl)
    return {"o": o, "h_T": h_T, **g._asdict()}


def _mp_errors(p: Problem, scale: float, got: dict, mp, key: tuple) -> dict[str, tuple[float, float]]:
    """Scaled errors of ``got`` against the exact closed form at MP_DPS digits; the exact values
    and term scales are computed once per ``key`` and shared by the implementations."""
    old = mp.dps
    try:
        mp.dps = MP_DPS
        if key not in _MP_EXACT:
            # term scales: the same closed form on absolute values, also exact
            closed = _mp_closed_form_vector if p.vector_gate else _mp_closed_form
            _MP_EXACT[key] = (closed(p, scale, mp), closed(abs_problem(p), abs(scale), mp))
        exact, term_scale = _MP_EXACT[key]
        return {n: _mp_scaled_err(got[n], exact[n], term_scale[n], mp) for n in got}
    finally:
        mp.dps = old


def measure_mpmath(regime: str, shape: str, impl: str, seed: int = 0,
                   vector: bool = False) -> dict[str, tuple[float, float]]:
    mp = pytest.importorskip("mpmath").mp
    dims = (VEC_MP_SHAPES if vector else MP_SHAPES)[shape]
    regimes = VEC_MP_REGIMES if vector else MP_REGIMES
    p = rand_problem(*dims, seed=seed, vector_gate=vector, **regimes[regime])
    tiny = dims[3] <= 8 and dims[4] <= 3 and dims[5] <= 3
    assert tiny or _check_trust_shape(p) == "multichunk"
    scale = 0.8
    return _mp_errors(p, scale, _oracle_outputs(p, scale, impl), mp, key=(regime, shape, seed, vector))


# The multichunk shape costs seconds in mpmath: by default only the regimes where a chunk
# boundary is most delicate (decay underflowing across it, growth across it); all under -m slow.
MP_PARAMS = [pytest.param(r, sh, marks=() if sh != "g2h2_T70" or r in ("strong_decay", "positive")
                          else pytest.mark.slow, id=f"{r}-{sh}")
             for r in MP_REGIMES for sh in MP_SHAPES]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("regime,shape", MP_PARAMS)
def test_mpmath_closed_form(regime, shape, impl):
    res = measure_mpmath(regime, shape, impl)
    t = tol("trust_mpmath") if MP_SHAPES[shape][3] <= 8 else tol("trust_multichunk")
    bad = {n: r for n, r in res.items() if not r[0] <= t}
    assert not bad, f"oracle ({impl}) vs mpmath, {regime} {shape}: (scaled, normwise) = {bad}"


# Vector gates: the same regimes plus "mixed_dims" (half the key dimensions at -30 per step, the
# others near 1), on tiny shapes and one that crosses the Numba oracle's 32-step chunks.
VEC_MP_REGIMES = dict(MP_REGIMES, mixed_dims=dict(log_alpha=lambda rng, s: np.where(
    np.arange(s[-1]) % 2 == 0, -30.0, -1e-3) * rng.uniform(0.5, 1.5, s)))
VEC_MP_SHAPES = {  # (B, G, H, T, dk, dv)
    "g1h2": (1, 1, 2, 8, 3, 2),
    "g2h4": (1, 2, 4, 6, 2, 3),
    "g2h2": (2, 2, 2, 5, 3, 3),
    "g1h2_T40": (1, 1, 2, 40, 2, 2),   # crosses the 32-step chunk boundary of vector gates
}
VEC_MP_PARAMS = [pytest.param(r, sh, marks=() if sh != "g1h2_T40"
                              or r in ("strong_decay", "mixed_dims", "positive")
                              else pytest.mark.slow, id=f"vec-{r}-{sh}")
                 for r in VEC_MP_REGIMES for sh in VEC_MP_SHAPES]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("regime,shape", VEC_MP_PARAMS)
def test_mpmath_closed_form_vector_gates(regime, shape, impl):
    res = measure_mpmath(regime, shape, impl, vector=True)
    t = tol("trust_mpmath") if VEC_MP_SHAPES[shape][3] <= 8 else tol("trust_multichunk")
    bad = {n: r for n, r in res.items() if not r[0] <= t}
    assert not bad, f"oracle ({impl}) vs mpmath, vector gates, {regime} {shape}: (scaled, normwise) = {bad}"


def test_mpmath_vector_closed_form_reduces_to_the_scalar_one():
    # Two closed forms written independently: with every key dimension given the same gate, the
    # vector form's outputs equal the scalar form's and its dlog_alpha sums over dk to the scalar
    # dlog_alpha (docs/math.md, section 9).
    mp = pytest.importorskip("mpmath").mp
    old = mp.dps
    p = rand_problem(1, 1, 2, 5, 3, 2, seed=3)
    pv = p._replace(log_alpha=np.repeat(p.log_alpha[..., None], 3, axis=-1))
    try:
        mp.dps = MP_DPS
        a, b = _mp_closed_form(p, 0.6, mp), _mp_closed_form_vector(pv, 0.6, mp)
        tiny = mp.mpf(10) ** (10 - MP_DPS)
        for name in ("o", "h_T", "q", "k", "v", "h0"):
            assert all(abs(x - y) <= tiny * (1 + abs(x))
                       for x, y in zip(a[name].ravel(), b[name].ravel())), name
        summed = b["log_alpha"].sum(axis=-1)
        assert all(abs(x - y) <= tiny * (1 + abs(x)) for x, y in zip(a["log_alpha"].ravel(), summed.ravel()))
    finally:
        mp.dps = old


def test_mpmath_restores_precision_and_closed_form_is_exact_on_a_hand_case():
    # A 1-step, 1x1 case worked by hand: o = scale * q * (alpha * h0 + k * v).
    mp = pytest.importorskip("mpmath").mp
    old = mp.dps
    z = np.zeros
    p = Problem(np.full((1, 1, 1, 1), 2.0), np.full((1, 1, 1, 1), 3.0), np.full((1, 1, 1, 1), 5.0),
                np.full((1, 1, 1), math.log(0.5)), np.full((1, 1, 1, 1), 7.0),
                np.full((1, 1, 1, 1), 1.0), z((1, 1, 1, 1)), glaref._inputs.Dims(1, 1, 1, 1, 1, 1))
    try:
        mp.dps = MP_DPS
        r = _mp_closed_form(p, 1.0, mp)
        alpha = mp.exp(mp.mpf(math.log(0.5)))  # the decay of the float64 log(0.5), ~0.5
        assert abs(r["o"][0, 0, 0, 0] - 2 * (alpha * 7 + 15)) < mp.mpf(10) ** -40
        # dL/dlog_alpha = alpha * q * h0 * do = alpha * 2 * 7
        assert abs(r["log_alpha"][0, 0, 0] - alpha * 14) < mp.mpf(10) ** -40
    finally:
        mp.dps = old
    assert mp.dps == old


# --------------------------------------------------------------------------------------------
# 3. central finite differences
#
# Along a direction u scaled like the inputs, with the relative step eps = u64^(1/3), the central
# difference (L(x + eps u) - L(x - eps u)) / (2 eps) differs from <g, u> by
#   truncation  <= eps^2 / 6 * max |third derivative of L along u|,
#   rounding    <= n u64 L_abs / eps,
# L_abs being the loss on absolute values (each evaluation of L is within n u64 L_abs: entry
# "trust_f64_evaluation"; one more u64 for rounding x +- eps u). L is a sum of terms
# c * prod(x_i + e u_i) * exp(sum(la + e u_la)) whose Taylor coefficients in e are dominated by
# those of the same terms on |x|, |u|; a series with nonnegative coefficients has
# a_3 <= F(delta) / delta^3 for every delta > 0, so the third derivative over 6 is at most
# min_delta L_abs(|x| + (eps + delta) |u|) / delta^3 over the whole interval [-eps, eps].
# The test holds the measured gap to this bound, computed per case; both halves are
# ~ u64^(2/3) ~ 2e-11 times the case's factors.

FD_EPS = U64 ** (1.0 / 3.0)
FD_DELTAS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0)


def _abs_loss(pa: Problem, scale: float, names, dirs, e: float) -> float:
    return float(_loss_reference(pa, scale, **{n: getattr(pa, n) + e * np.abs(dirs[n]) for n in names}))


def measure_finite_difference(case, impl: str, seed: int = 0) -> dict[str, dict[str, float]]:
    p, scale = _problem(case, seed)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=scale, impl=impl)
    dirs = _directions(p, seed)
    pa = abs_problem(p)
    out = {}
    for label, names in [(n, (n,)) for n in GRADS] + [("joint", GRADS)]:
        plus = {n: getattr(p, n) + FD_EPS * dirs[n] for n in names}
        minus = {n: getattr(p, n) - FD_EPS * dirs[n] for n in names}
        fd = float(_loss_reference(p, scale, **plus) - _loss_reference(p, scale, **minus)) / (2 * FD_EPS)
        got = float(sum(np.sum(getattr(g, n) * dirs[n]) for n in names))
        term_scale = sum(complex_step_derivative(pa, abs(scale), n, np.abs(dirs[n])) for n in names)
        L_abs = _abs_loss(pa, abs(scale), names, dirs, FD_EPS)
        a3 = min(_abs_loss(pa, abs(scale), names, dirs, FD_EPS + d) / d**3 for d in FD_DELTAS)
        bound = (tol("trust_f64_evaluation") + U64) * L_abs / FD_EPS + FD_EPS**2 * a3
        out[label] = {"of_bound": abs(got - fd) / bound, "scaled": abs(got - fd) / term_scale,
                      "rel": abs(got - fd) / abs(got), "bound_scaled": bound / term_scale}
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", PROJ_CASES, ids=[c[0] for c in PROJ_CASES])
def test_finite_difference_projections(case, impl):
    res = measure_finite_difference(case, impl)
    bad = {n: r for n, r in res.items() if not r["of_bound"] <= 1.0}
    assert not bad, f"central differences disagree with vjp ({impl}) beyond their error bound: {bad}"


# --------------------------------------------------------------------------------------------
# 4. jax.vjp of a float64 lax.scan written here

@pytest.fixture
def jax_x64():
    jax = pytest.importorskip("jax")
    from glaref._audit._device import x64_scope

    with x64_scope():
        yield jax


def _jax_scan(jax, q, k, v, log_alpha, h0, scale):
    """The recurrence as a plain lax.scan over time, one (B, H) batch of states."""
    jnp = jax.numpy
    H, G = v.shape[1], q.shape[1]
    qh, kh = jnp.repeat(q, H // G, axis=1), jnp.repeat(k, H // G, axis=1)

    def step(S, xs):
        q_t, k_t, v_t, la_t = xs
        a = jnp.exp(la_t)                           # (B, H) scalar gates, (B, H, dk) vector gates
        a = a[:, :, :, None] if a.ndim == 3 else a[:, :, None, None]
        S = a * S + k_t[:, :, :, None] * v_t[:, :, None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", q_t, S)

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (qh, kh, v, log_alpha))
    h_T, o = jax.lax.scan(step, h0, xs)
    return jnp.moveaxis(o, 0, 2), h_T


def _jax_all(jax, p: Problem, scale: float) -> dict[str, np.ndarray]:
    jnp = jax.numpy
    args = [jnp.asarray(getattr(p, n), dtype=jnp.float64) for n in GRADS]
    (o, h_T), pullback = jax.vjp(lambda *a: _jax_scan(jax, *a, scale), *args)
    grads = pullback((jnp.asarray(p.do), jnp.asarray(p.dh_T)))
    return {"o": np.asarray(o), "h_T": np.asarray(h_T), **{n: np.asarray(x) for n, x in zip(GRADS, grads)}}


JAX_CASES = CS_CASES + [("g2h4_T16_d8", (1, 2, 4, 16, 8, 8), "standard", 0.35, 1.0),
                        ("vec_g2h4_T16_d8", (1, 2, 4, 16, 8, 8), "standard", 0.35, 1.0, V)]


def measure_jax_scan(jax, case, impl: str, seed: int = 0) -> dict[str, tuple[float, float]]:
    p, scale = _problem(case, seed)
    ref = _jax_all(jax, p, scale)
    assert all(x.dtype == np.float64 for x in ref.values())
    term_scale = _jax_all(jax, abs_problem(p), abs(scale))
    got = _oracle_outputs(p, scale, impl)
    return {n: (assert_scaled(got[n], ref[n], term_scale[n], math.inf, n), rel_err(got[n], ref[n]))
            for n in got}


@pytest.mark.jax
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", JAX_CASES, ids=[c[0] for c in JAX_CASES])
def test_jax_scan_vjp(jax_x64, case, impl):
    res = measure_jax_scan(jax_x64, case, impl)
    t = _tol("trust_jax_scan_f64", _problem(case)[0])
    bad = {n: r for n, r in res.items() if not r[0] <= t}
    assert not bad, f"oracle ({impl}) vs jax.vjp(lax.scan) f64: (scaled, normwise) = {bad}"


# --------------------------------------------------------------------------------------------
# Sweep (-m slow): random short shapes, gates and scales, complex step and mpmath on each.

def _sweep_case(i: int):
    rng = np.random.default_rng(4242 + i)
    G = int(rng.integers(1, 4))
    H = G * int(rng.integers(1, 4))
    dims = (int(rng.integers(1, 3)), G, H, int(rng.integers(1, 9)), int(rng.integers(1, 4)),
            int(rng.integers(1, 4)))
    kind = i % 4
    la = ["standard", lambda r, s: -30.0 * r.random(s), lambda r, s: 0.5 * r.random(s), 0.0][kind]
    return (f"sweep{i}", dims, la, float(rng.uniform(-2, 2)) or 1.0, float(10 ** rng.uniform(-2, 3)))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("i", range(200))
def test_sweep_complex_step_and_mpmath(i, impl):
    _sweep_check(_sweep_case(i), i, impl)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("i", range(100))
def test_sweep_vector_gates(i, impl):
    _sweep_check(_sweep_case(1000 + i) + (V,), 1000 + i, impl)


def _sweep_check(case, i, impl):
    res = measure_complex_step(case, impl, seed=i)
    assert all(r["scaled"] <= tol("trust_complex_step") for r in res.values()), res
    mp = pytest.importorskip("mpmath").mp
    p, scale = _problem(case, seed=i)
    errs = _mp_errors(p, scale, _oracle_outputs(p, scale, impl), mp, key=(case[0], i))
    assert all(e[0] <= tol("trust_mpmath") for e in errs.values()), errs


# --------------------------------------------------------------------------------------------
# `python tests/test_reference_trust.py` prints the worst measured figure of every check.

def _report(impls=("numpy", "numba")) -> None:  # pragma: no cover - a reporting aid
    import test_structure as ts

    import conftest

    def worst(rows, keys):
        out = {}
        for row in rows:
            for name, r in row.items():
                vals = [r[k] for k in keys] if isinstance(r, dict) else list(r)
                out[name] = [max(a, b) for a, b in zip(out.get(name, [0.0] * len(vals)), vals)]
        return out

    def show(title, w):
        cols = " | ".join(f"{n} {'/'.join(f'{x:.1e}' for x in v)}" for n, v in w.items())
        allmax = [max(v[i] for v in w.values()) for i in range(len(next(iter(w.values()))))]
        print(f"{title}: worst {'/'.join(f'{x:.2e}' for x in allmax)}\n    {cols}")

    def split(cases):   # (scalar-gate cases, vector-gate cases)
        return [c for c in cases if len(c) == 5], [c for c in cases if len(c) > 5]

    for impl in impls:
        if impl == "numba" and not conftest.HAS_NUMBA_MODULE:
            continue
        print(f"== impl {impl}   (figures: error / term scale, then relative error)")
        for kind, pick in (("scalar gates", 0), ("vector gates", 1)):
            print(f"-- {kind}")
            show("complex step", worst([measure_complex_step(c, impl) for c in split(CS_CASES)[pick]],
                                       ["scaled", "rel"]))
            show("finite differences (scaled, rel, fraction of derived bound)",
                 worst([measure_finite_difference(c, impl) for c in split(PROJ_CASES)[pick]],
                       ["scaled", "rel", "of_bound"]))
            mp_cases = ([(r, s, False) for r in MP_REGIMES for s in MP_SHAPES] if pick == 0 else
                        [(r, s, True) for r in VEC_MP_REGIMES for s in VEC_MP_SHAPES])
            show("mpmath closed form, 50 digits (scaled, normwise rel)",
                 worst([measure_mpmath(r, s, impl, vector=vec) for r, s, vec in mp_cases], [0, 1]))
            import jax
            old = jax.config.jax_enable_x64
            jax.config.update("jax_enable_x64", True)
            try:
                show("jax.vjp of f64 lax.scan (scaled, normwise rel)",
                     worst([measure_jax_scan(jax, c, impl) for c in split(JAX_CASES)[pick]], [0, 1]))
            finally:
                jax.config.update("jax_enable_x64", old)
        well = [ts.measure_identity(conftest.rand_problem(2, G, H, 12, 4, 3, seed=8), impl, scale=0.7)
                for G, H in [(1, 2), (2, 4), (3, 3)]]
        print("dlog_alpha identity, well conditioned: worst error/scale %.2e, elementwise rel %.2e"
              % (max(r["scaled"] for r in well), max(r["rel"] for r in well)))
        r = ts.measure_identity(conftest.rand_problem(1, 1, 2, 8, 3, 3, seed=10, log_alpha=-30.0), impl)
        print("dlog_alpha identity, log_alpha=-30: error/scale %.2e, elementwise rel %.2e, normwise rel "
              "%.2e, cancellation %.1e" % (r["scaled"], r["rel"], r["normwise_rel"], r["cancellation"]))


if __name__ == "__main__":  # pragma: no cover
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _report()
