"""The calibrated tier's one decision (``glaref._audit._verdict.calibrated``) on given figures,
family-neutral: a yardstick written here, errors chosen by hand, each outcome and its wording."""

from __future__ import annotations

import math

import pytest

from glaref._audit import _verdict
from glaref._audit._designs import Design, Yardstick
from glaref.tolerances import tol

R = tol("calibrated_ratio")
NEAR = Design("chunked", 16, "16-step chunks", family="design near", declares="near=True")
FAR = Design("chunked", 256, "256-step chunks", family="design far")
STICK = Yardstick({"held": Design("chunked", 64, "64-step chunks"), "near": NEAR, "far": FAR},
                  "held", field=("near", "far"))


def _judge(err: float, errors: dict[str, float] | None, **kw) -> _verdict.Assessment:
    a = _verdict.Assessment("o", err / 10.0, 0.0, None, math.inf, None, None, R)
    kw.setdefault("label", "float32")
    kw.setdefault("strict", False)
    _verdict.calibrated(a, err, _verdict.Calibration(errors, STICK, 0.0, 10.0), **kw)
    return a


def test_ok_within_R_times_the_held_to_reference():
    a = _judge(0.5 * R, {"held": 1.0, "near": 1.0, "far": 1.0})
    assert a.outcome == "ok" and a.ratio == pytest.approx(0.5 * R) and a.baseline_rel_err == 0.1
    assert a.reason == f"o: {0.5 * R:.3g}x the float32 reference kernels' error (allowed {R:g}x)"


def test_less_accurate_names_the_field_design_nearest_the_error_and_the_hint():
    # err 1.5 R: beyond R x held (1), within R x both field designs (1.4 R and 20 R); the
    # error is 1.5 / 1.4 = 1.07 times "near"'s and 1.5 / 20 = 1 / 13 times "far"'s, the widest:
    # the nearest, "near", explains it
    errors = {"held": 1.0, "near": 1.4 * R, "far": 20.0 * R}
    a = _judge(1.5 * R, errors, wording=_verdict.Wording(hint=lambda d: f"declare {d.declares}"))
    assert a.outcome == "less_accurate" and a.failed_tier is None and a.design == "design near"
    assert a.reason.startswith("o: less accurate: ")
    assert a.reason.endswith("that of a correct design the field ships: design near; "
                             "declare near=True")
    b = _judge(1.5 * R, errors, strict=True)
    assert b.failed_tier == "strict" and b.reason.endswith("design near; a failure under strict")


def test_fail_beyond_the_envelope_with_or_without_the_envelope_clause():
    errors = {"held": 1.0, "near": 2.0, "far": 3.0}
    plain = _judge(4.0 * R, errors)
    assert plain.outcome == "fail" and plain.failed_tier == "calibrated"
    assert plain.envelope_ratio == pytest.approx(4.0 * R / 3.0)
    assert plain.reason.endswith(f"; allowed {R:g}x)")
    worded = _judge(4.0 * R, errors, wording=_verdict.Wording(envelope=True))
    assert worded.reason == plain.reason + (f", {4.0 * R / 3.0:.3g}x that of every correct design "
                                            "the field ships (the least accurate here: design far)")


def test_no_references_or_a_non_finite_baseline_is_undecided_and_proven_comes_first():
    assert _judge(0.0, None).reason == "o: no verdict: the float32 reference kernels did not run"
    a = _judge(1.0, {"held": math.inf, "near": 1.0, "far": 1.0})
    assert a.failed_tier == "undecided" and a.reason.endswith("gave a non-finite error")
    p = _judge(100.0 * R, {"held": 1.0, "near": 1.0, "far": 1.0}, proven="o: proven says no")
    assert p.failed_tier == "proven" and p.reason == "o: proven says no"
    assert p.ratio == pytest.approx(100.0 * R)      # the calibrated figures are still filled
