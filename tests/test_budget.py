"""Error budgets and the verdict rule.

- The scales dominate the true values (|ref| <= scale elementwise) and equal them when every
  term is nonnegative; the identity scale of dlog_alpha dominates the direct one.
- The bound is an honest worst case: the NumPy reference itself, run in float32 and float16 (a
  step-by-step evaluation, chunk_size 1), stays within it on every regime; the verdict fails
  exactly past it, and on non-finite values.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import glaref
from glaref import regimes
from glaref._audit import _metrics, _verdict
from glaref._audit._claims import Claims
from glaref._inputs import OUTPUTS, Dims, Problem
from glaref.gla import _budget, _judge, _reference
from glaref.gla._designs import yardstick
from glaref.tolerances import SMALLEST_NORMAL, UNIT_ROUNDOFF, tol

SMALL = Dims(B=2, G=2, H=4, T=33, dk=5, dv=3)


def _sizes_ok(d: Dims) -> None:
    # scale_dominates_f64 is derived for T <= 33, dk, dv <= 8 (tolerances.py)
    assert d.T <= 33 and d.dk <= 8 and d.dv <= 8


def _truth(p: Problem, impl: str) -> dict[str, np.ndarray]:
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, impl=impl)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl=impl)
    return dict(zip(OUTPUTS, (o, h_T) + tuple(g)))


@pytest.mark.parametrize("regime", regimes.DEFAULT_REGIMES)
def test_scales_dominate_true_values(regime, impl):
    eps = tol("scale_dominates_f64")
    for d in regimes.REGIMES[regime].cases(SMALL):
        d = replace(d, T=min(d.T, 33))
        _sizes_ok(d)
        p = regimes.make_inputs(regime, d, seed=1)
        s = _budget.problem_scales(p, impl=impl)
        for name, ref in _truth(p, impl).items():
            assert np.all(np.abs(ref) <= s[name] * (1 + eps)), (regime, name)
            assert np.all(s[name] >= 0), (regime, name)
        # the identity's scale is never below the direct form's (docs/budgets.md, section 3)
        assert np.all(s["log_alpha"] <= s["log_alpha_identity"] * (1 + eps)), regime


def test_scales_equal_values_when_terms_are_nonnegative(impl):
    p = regimes.make_inputs("standard", SMALL, seed=2)
    a = np.abs
    pos = p._replace(q=a(p.q), k=a(p.k), v=a(p.v), h0=a(p.h0), do=a(p.do), dh_T=a(p.dh_T))
    s = _budget.problem_scales(pos, impl=impl)
    for name, ref in _truth(pos, impl).items():
        # same inputs, same evaluation: bit-identical
        np.testing.assert_array_equal(s[name], ref, err_msg=name)


def test_scales_are_strictly_larger_with_cancellation():
    p = regimes.make_inputs("standard", SMALL, seed=3)
    s = _budget.problem_scales(p, impl="numpy")
    t = _truth(p, "numpy")
    # random signs: most elements are sums that cancel, so the scale is well above |value|
    assert np.median(s["o"] / np.abs(t["o"])) > 1.5
    ratio_id = s["log_alpha_identity"] / s["log_alpha"]
    assert ratio_id.max() > 2.0   # the identity's scale can be far larger than the direct one


def test_strong_decay_identity_scale_far_larger():
    p = regimes.make_inputs("strong_decay", SMALL, seed=0)
    s = _budget.problem_scales(p, impl="numpy")
    # direct form alpha_t <|S_{t-1}|, |G_t|> carries a factor alpha_t ~ e^-8 on average; the
    # identity's terms do not: the verdict's log_alpha scale is orders of magnitude larger.
    assert np.median(s["log_alpha_identity"] / s["log_alpha"]) > 1e2


def test_public_scales_layouts_and_fields():
    p = regimes.make_inputs("standard", SMALL, seed=4)
    sc = glaref.scales(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl="numpy")
    assert isinstance(sc, _budget.Scales)
    assert sc._fields == ("o", "h_T", "q", "k", "v", "log_alpha", "h0", "log_alpha_identity")
    d = _budget.problem_scales(p, impl="numpy")
    for f in sc._fields:
        np.testing.assert_array_equal(getattr(sc, f), d[f], err_msg=f)
    # bthd: o, v-like and gate-like arrays come back with time before heads
    t = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    sb = glaref.scales(t(p.q), t(p.k), t(p.v), t(p.log_alpha), p.h0, t(p.do), p.dh_T,
                       layout="bthd", impl="numpy")
    for f, kind in (("o", t), ("q", t), ("k", t), ("v", t), ("log_alpha", t),
                    ("log_alpha_identity", t), ("h_T", None), ("h0", None)):
        want = d[f] if kind is None else t(d[f])
        np.testing.assert_allclose(getattr(sb, f), want, rtol=0, atol=0, err_msg=f)
    # forward only: gradient fields are None
    fo = glaref.scales(p.q, p.k, p.v, p.log_alpha, p.h0, impl="numpy")
    assert fo.q is None and fo.log_alpha_identity is None
    np.testing.assert_array_equal(fo.o, d["o"])
    with pytest.raises(ValueError, match=r"v: got shape"):
        glaref.scales(p.q, p.k, p.v[:, :, :5], p.log_alpha, impl="numpy")
    with pytest.raises(TypeError, match="scale: got"):
        glaref.scales(p.q, p.k, p.v, p.log_alpha, scale="x", impl="numpy")


def test_budget_ulps_definition():
    d = Dims(1, 1, 1, 4, 2, 2)
    u = UNIT_ROUNDOFF["float32"]
    ref = np.array([1.0, -2.0, 0.0, 5.0])
    scale = np.array([1.0, 4.0, 0.0, 5.0])
    x = ref + np.array([3 * u, -10 * u * 4.0, 0.0, 0.0])
    ulps, where = _metrics.budget_ulps("o", x, ref, scale, "float32", d)
    floor = _metrics.underflow_floor("o", "float32", d)
    assert floor == 5 * 2 * SMALLEST_NORMAL["float32"]
    assert where == (1,)
    assert ulps == pytest.approx(10.0, rel=tol("figure_closed_form"))
    # an error where the scale is zero is measured against the underflow floor only
    x2 = ref.copy()
    x2[2] = 1e-3
    assert _metrics.budget_ulps("o", x2, ref, scale, "float32", d) == (1e-3 / floor, (2,))
    x3 = ref.copy()
    x3[0] = np.nan
    assert _metrics.budget_ulps("o", x3, ref, scale, "float32", d)[0] == math.inf
    assert _metrics.budget_ulps("o", x[:0], ref[:0], scale[:0], "float32", d) == (0.0, None)
    with pytest.raises(ValueError, match="compute_dtype: got 'int8'"):
        _metrics.budget_ulps("o", x, ref, scale, "int8", d)
    with pytest.raises(ValueError, match="output: got 'z'"):
        _metrics.budget_ulps("z", x, ref, scale, "float32", d)


def test_gate_mass_and_depth_by_hand():
    la = -np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]])
    assert _verdict.gate_mass(la, 2) == 7.0        # chunks (1,2), (3,4), (5): sums 3, 7, 5
    assert _verdict.gate_mass(la, 5) == 15.0
    assert _verdict.gate_mass(la, 1) == 5.0
    assert _verdict.positive_mass(la) == 0.0
    assert _verdict.positive_mass(-la) == 15.0
    d = Dims(B=1, G=2, H=4, T=130, dk=16, dv=8)
    a = tol("budget_step_ops")
    # C = 64: N = 3 chunks, d_S = 64 + 3a
    d_S = 64 + 3 * a
    assert _verdict.accumulation_depth("h_T", d, 64) == d_S
    assert _verdict.accumulation_depth("o", d, 64) == 16 + d_S + a
    assert _verdict.accumulation_depth("q", d, 64) == 8 + d_S + a + 2
    assert _verdict.accumulation_depth("log_alpha", d, 64) == 130 + a + max(16 + 8 + d_S + a + 2, 128 + d_S)
    # scan: one step per "chunk"
    assert _verdict.accumulation_depth("h_T", d, 1) == 1 + 130 * a
    zero = np.zeros((1, 4, 130))
    n = _verdict.accumulation_depth("o", d, 64) + 1.0
    u = UNIT_ROUNDOFF["float32"]
    assert _verdict.budget_bound("o", "float32", d, 64, log_alpha=zero) == pytest.approx(n / (1 - n * u))
    # unknown chunking: the larger of C = 1 and C = T
    unk = _verdict.budget_bound("o", "float32", d, None, log_alpha=zero)
    assert unk == max(_verdict.budget_bound("o", "float32", d, c, log_alpha=zero) for c in (1, 130))
    # all-bfloat16 worst case: gamma_n / u = n / (1 - n u) while n u < 1 ...
    nb = n / (1 - n * UNIT_ROUNDOFF["bfloat16"])
    assert _verdict.budget_bound("o", "bfloat16", d, 64, log_alpha=zero) == pytest.approx(nb)
    # ... and no conclusion possible once n >= 1/u = 256 roundings (here dk = 256)
    assert _verdict.budget_bound("o", "bfloat16", replace(d, dk=256), 64, log_alpha=zero) == math.inf
    mixed = _verdict.budget_bound("o", "bfloat16", d, 64, log_alpha=zero, accumulate_dtype="float32")
    assert tol("budget_narrow_roundings") < mixed < tol("budget_narrow_roundings") + 1
    with pytest.raises(ValueError, match="accumulate_dtype: got 'bfloat16'"):
        _verdict.budget_bound("o", "float32", d, 64, log_alpha=zero, accumulate_dtype="bfloat16")
    with pytest.raises(ValueError, match="^accumulate_dtype: got 'int8', expected one of"):
        _verdict.budget_bound("o", "float32", d, 64, log_alpha=zero, accumulate_dtype="int8")
    with pytest.raises(ValueError, match="chunk_size: got 0"):
        _verdict.budget_bound("o", "float32", d, 0, log_alpha=zero)


def _assess_case(err_factor: float, ref_factor: float = 1.0, chunk_size=16):
    """One output ("v") of a small problem: the kernel's value is ref + err_factor * e and each
    reference kernel's ref + ref_factor * e, e a fixed pattern of size 1e-7 relative."""
    d = Dims(1, 1, 2, 40, 4, 4)
    la = np.full((1, 2, 40), -0.5)
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 2, 40, 4))
    e = 1e-7 * rng.standard_normal(ref.shape)
    scale = 2 * np.abs(ref) + 1.0
    refs = {"scan": ref + ref_factor * e, "chunked": ref - ref_factor * e,
            "chunked_wide": ref + ref_factor * e}
    return _verdict.assess("v", ref + err_factor * e, ref, scale=scale,
                           claims=Claims(compute_dtype="float32", chunk_size=chunk_size),
                           view=_verdict.BudgetView(d, la),
                           reference_outputs=_verdict.References(refs, yardstick(chunk_size)))


def test_calibrated_tier_fails_exactly_past_the_allowed_ratio():
    R = tol("calibrated_ratio")
    a = _assess_case(0.999 * R)
    assert a.ok and a.ratio == pytest.approx(0.999 * R, rel=tol("figure_by_difference"))
    a = _assess_case(1.001 * R)
    assert not a.ok and a.failed_tier == "calibrated"
    assert a.reason.startswith(f"v: {a.ratio:.3g}x the error of the float32 reference kernels")
    # the baseline is reported relative to ||ref||, and the kernel's own rel_err beside it
    assert a.baseline_rel_err * R * 1.001 == pytest.approx(a.rel_err, rel=tol("figure_by_difference"))


def test_calibrated_floor_is_one_rounding_of_the_result():
    # reference kernels exact: the baseline is u ||ref|| (one rounding of every element)
    a = _assess_case(0.0, ref_factor=0.0)
    assert a.ok and a.ratio == 0.0
    u = UNIT_ROUNDOFF["float32"]
    assert a.baseline_rel_err == pytest.approx(tol("calibrated_floor") * u, rel=tol("figure_closed_form"))
    b = _assess_case(1.0, ref_factor=0.0)    # ~1e-7 relative: below R u ~ 3.6e-7
    assert b.ok
    c = _assess_case(100.0, ref_factor=0.0)  # ~1e-5 relative: ~170 x the floor
    assert not c.ok and c.failed_tier == "calibrated"


def test_proven_tier_fails_past_the_worst_case_bound_whatever_the_references():
    a = _assess_case(1e6, ref_factor=1e6)          # references as wrong as the kernel
    assert a.ratio == pytest.approx(1.0, rel=tol("figure_by_difference"))
    assert not a.ok and a.failed_tier == "proven"
    assert a.reason.startswith("v: beyond any correct kernel: budget_ulps")
    assert a.budget_ulps > a.bound


def test_nonfinite_and_undecided():
    f32 = Claims(compute_dtype="float32")
    d = Dims(1, 1, 2, 40, 4, 4)
    la = np.full((1, 2, 40), -0.5)
    ref = np.ones((1, 2, 40, 4))
    x = ref.copy()
    x[0, 1, 2, 3] = np.nan
    a = _verdict.assess("v", x, ref, scale=ref, claims=f32, view=_verdict.BudgetView(d, la),
                        reference_outputs=_verdict.References(
                            {"scan": ref, "chunked": ref, "chunked_wide": ref}, yardstick(None)))
    assert a.failed_tier == "nonfinite" and a.reason == "v: 1 non-finite value(s), first at (0, 1, 2, 3)"
    b = _verdict.assess("v", ref, ref, scale=ref, claims=f32, view=_verdict.BudgetView(d, la),
                        reference_outputs=None)
    assert b.failed_tier == "undecided" and not b.ok
    with pytest.raises(ValueError, match="output: got 'dq'"):
        _verdict.assess("dq", ref, ref, scale=ref, claims=f32, view=_verdict.BudgetView(d, la),
                        reference_outputs=None)


def test_baseline_follows_what_is_known_of_the_structure():
    e = {"scan": 9.0, "chunked": 1.0, "chunked_wide": 4.0}
    assert _judge.baseline_error(e, 1) == 9.0           # a step-by-step kernel: the scan
    assert _judge.baseline_error(e, 64) == 1.0          # a chunked one: the chunked reference
    assert _judge.baseline_error(e, None) == 3.0        # unknown: widened to the geometric mean
    assert _judge.baseline_error({**e, "scan": 1.0}, None) == 2.0      # ... towards either extreme
    assert _judge.baseline_error({**e, "scan": 0.5, "chunked_wide": 0.5}, None) == 1.0
    assert _judge.baseline_error({**e, "scan": math.inf}, None) == math.inf
    # an extreme erring more than (R/m)^2 times the chunks is itself correct: a kernel erring up to
    # m times as much still passes
    R, m = tol("calibrated_ratio"), tol("calibrated_extreme_margin")
    far = {**e, "scan": 4 * (R / m) ** 2}
    assert _judge.baseline_error(far, None) == pytest.approx(4 * R / m, rel=1e-15)
    assert _judge.baseline_error(far, None) > math.sqrt(far["scan"])
    assert R * _judge.baseline_error(far, None) == pytest.approx(m * far["scan"], rel=1e-15)
    near = {**e, "scan": (R / m) ** 2 / 2}              # within (R/m)^2: the geometric mean rules
    assert _judge.baseline_error(near, None) == math.sqrt(near["scan"])


def _narrow(p: Problem, dtype) -> Problem:
    """The problem's arrays rounded to ``dtype`` (kept in that dtype)."""
    return Problem(*(x.astype(dtype) for x in p[:7]), p.dims)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("regime", [r for r in regimes.DEFAULT_REGIMES if r != "large_values"])
def test_reference_in_low_precision_stays_within_the_bound(regime, dtype):
    """An independent evaluation: the NumPy reference run step by step in float32 / float16
    (chunk_size 1) against the float64 oracle on the same rounded inputs. large_values is out
    of float16's range (o ~ 1e4 and states ~ 1e5 overflow 65504), so it is left out for both."""
    base = Dims(B=1, G=2, H=4, T=64, dk=8, dv=8)
    for d in regimes.REGIMES[regime].cases(base):
        d = replace(d, T=min(d.T, 200))
        p = _narrow(regimes.make_inputs(regime, d, seed=5), np.dtype(dtype))
        w = Problem(*(x.astype(np.float64) for x in p[:7]), d)     # exact widening
        o, h_T = _reference.forward(p.q, p.k, p.v, p.log_alpha, p.h0)
        g = _reference.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
        refs = _truth(w, "numpy")
        s = _budget.problem_scales(w, impl="numpy")
        for name, x in zip(OUTPUTS, (o, h_T) + tuple(g)):
            assert x.dtype == np.dtype(dtype)
            scale = s["log_alpha_identity"] if name == "log_alpha" else s[name]
            ulps, where = _metrics.budget_ulps(name, x, refs[name], scale, dtype, d)
            assert np.isfinite(x.astype(np.float64)).all(), (regime, name)
            bound = _verdict.budget_bound(name, dtype, d, 1, log_alpha=w.log_alpha)
            assert ulps <= bound, f"{regime} T={d.T} {name}: budget_ulps {ulps} > {bound} at {where}"
