"""The audit engine through its Python face, ``glaref.audit(...)``, on small shapes.

Expected figures come from outside the engine: jax run by hand on the same inputs and compared
with glaref.forward/vjp, exact defects of known size (o * 1.01), NaNs planted at known indices.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import glaref  # noqa: E402
from glaref._audit import _metrics, _verdict  # noqa: E402
from glaref._audit._report import summary  # noqa: E402
from glaref._errors import AuditUsageError  # noqa: E402
from glaref._inputs import Dims  # noqa: E402
from glaref.regimes import make_inputs  # noqa: E402
from glaref.tolerances import UNIT_ROUNDOFF, tol  # noqa: E402

import audit_kernels as ak  # noqa: E402

pytestmark = pytest.mark.jax

TINY = {"tiny": (1, 1, 2, 8, 4)}          # B, G, H, dk, dv
GQA = {"gqa": (2, 2, 4, 8, 6)}            # G < H, dk != dv
FAST = dict(repeats=1, oracle_impl="numpy")
SEED_JSON = Path(__file__).resolve().parents[2] / "shared" / "reference" / "seed_benchmark_cpu.json"

# The seed report's keys (from ../shared/reference/seed_benchmark_cpu.json), written out so the
# test does not need the file; when the file is there, a test checks these against it.
SEED_FWD = {"impl", "mode", "config", "batch", "groups", "heads", "seq", "dk", "dv", "compile_s",
            "inner", "median_ms", "q1_ms", "q3_ms", "xla_temp_mb", "xla_arg_mb", "xla_out_mb",
            "rel_err"}
SEED_FWD_BWD = SEED_FWD | {"residual_mb", "rel_err_grads"}
SEED_SKIPPED = {"impl", "mode", "config", "batch", "groups", "heads", "seq", "dk", "dv", "skipped"}
SEED_GRADS = {"q", "k", "v", "log_alpha", "h0"}
SEED_DEVICE = {"jax", "backend", "devices", "python", "device_kind", "gpu", "driver",
               "gpu_memory_gb", "torch", "torch_cuda"}
SEED_CONFIG = {"device", "configs", "seq_lens", "impls", "repeats"}
OUR_ADDITIONS = {"rel_err_out", "max_abs_err", "reference_rel_err", "reference_ratio",
                 "allowed_ratio", "failed_tier", "budget_ulps", "budget_bound", "budget_ulps_direct",
                 "nonfinite", "nonfinite_first_index", "dtype", "compute_dtype", "precision",
                 "layout", "regime", "seed", "scale", "final_state", "chunk_size",
                 "accumulate_dtype", "dlog_alpha_form", "gate", "cu_seqlens", "ok", "failures",
                 "notes", "verdict", "oracle_ms", "where", "diagnosis", "probes", "outcome",
                 "outcomes", "x_best", "envelope_ratio", "mismatched"}


def _nrel(x, ref):
    return float(np.linalg.norm((np.asarray(x, np.float64) - ref).ravel()) / np.linalg.norm(ref.ravel()))


def _rounded(p, dtype):
    r = lambda x: np.asarray(x).astype(dtype).astype(np.float64)  # noqa: E731
    return p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha), h0=r(p.h0),
                      do=r(p.do), dh_T=r(p.dh_T))


# ---------------------------------------------------------------- figures against an outside computation

def test_errors_match_a_hand_run_of_jax_against_the_oracle():
    recs = glaref.audit([ak.scan_kernel_final], GQA, [19], **FAST)
    assert [r["mode"] for r in recs] == ["fwd", "fwd_bwd"]
    assert all(r["ok"] for r in recs), [r.get("failures") for r in recs]

    # the same problem, run by hand: float32 inputs, jax.vjp, float64 oracle on the rounded inputs
    p = _rounded(make_inputs("standard", Dims(2, 2, 4, 19, 8, 6), 0), np.float32)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    (o, h_T), pull = jax.vjp(ak.scan_kernel_final, *args)
    grads = pull((jnp.asarray(p.do, jnp.float32), jnp.asarray(p.dh_T, jnp.float32)))
    o_ref, hT_ref = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, impl="numpy")
    g_ref = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl="numpy")

    fwd, bwd = recs
    assert fwd["rel_err_out"]["o"] == pytest.approx(_nrel(o, o_ref), rel=tol("audit_figure_by_hand"))
    assert fwd["rel_err_out"]["h_T"] == pytest.approx(_nrel(h_T, hT_ref), rel=tol("audit_figure_by_hand"))
    for name, g, gr in zip(glaref.Grads._fields, grads, g_ref):
        assert bwd["rel_err_grads"][name] == pytest.approx(_nrel(g, gr),
                                                           rel=tol("audit_figure_by_hand")), name
    assert bwd["rel_err"] == max(list(bwd["rel_err_grads"].values()) + list(bwd["rel_err_out"].values()))
    # errors of a float32 recurrence are float32-sized but not zero: the comparison is real
    assert 0 < fwd["rel_err_out"]["o"] <= tol("audit_rel_err_float32")

    # budget_ulps = max |x - ref| / (u scale) by hand, scales from the public glaref.scales
    # (the underflow floor is ~1e-36 here, far below u * scale, so it is left out)
    sc = glaref.scales(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl="numpy")
    u = UNIT_ROUNDOFF["float32"]
    by_hand = {"o": (o, o_ref, sc.o), "h_T": (h_T, hT_ref, sc.h_T)}
    by_hand.update({n: (g, gr, sc.log_alpha_identity if n == "log_alpha" else getattr(sc, n))
                    for n, g, gr in zip(glaref.Grads._fields, grads, g_ref)})
    for name, (x, ref, s) in by_hand.items():
        want = float(np.max(np.abs(np.asarray(x, np.float64) - ref) / (u * s)))
        assert bwd["budget_ulps"][name] == pytest.approx(want, rel=tol("audit_figure_by_hand")), name
        assert 0 < bwd["budget_ulps"][name] <= bwd["budget_bound"][name], name
    want = float(np.max(np.abs(np.asarray(grads[3], np.float64) - g_ref.log_alpha) / (u * sc.log_alpha)))
    assert bwd["budget_ulps_direct"]["log_alpha"] == pytest.approx(want, rel=tol("audit_figure_by_hand"))
    # a user callable is judged with unknown chunking and no wider accumulation
    assert bwd["chunk_size"] is None and bwd["accumulate_dtype"] is None


def test_a_kernel_returning_o_only_gets_no_dh_T():
    # with dh_T = 0 the reference gradients differ from those with dh_T; the audit must use the former
    recs = glaref.audit([ak.scan_kernel], TINY, [9], ["fwd_bwd"], **FAST)
    (r,) = recs
    assert r["ok"] and r["final_state"] is False and set(r["rel_err_out"]) == {"o"}
    assert r["rel_err_grads"]["h0"] <= tol("audit_rel_err_float32")


def test_a_kernel_returning_a_list_is_audited_like_a_tuple():
    a = glaref.audit([ak.list_kernel, ak.scan_kernel_final], TINY, [9], ["fwd_bwd"], **FAST)
    assert all(r["ok"] and r["final_state"] for r in a), [r.get("skipped") for r in a]
    assert a[0]["rel_err_grads"] == a[1]["rel_err_grads"]


def test_a_one_percent_defect_is_measured_as_one_percent_and_fails():
    (r,) = glaref.audit([ak.wrong_kernel], TINY, [9], ["fwd"], **FAST)
    assert r["rel_err_out"]["o"] == pytest.approx(0.01, abs=1.01 * tol("audit_rel_err_float32"))
    # a 1 % error is beyond any correct kernel's rounding: the proven tier names it, and it is
    # also tens of thousands of times the reference kernels' error (the calibrated tier)
    assert r["ok"] is False and r["failures"][0].startswith("o: beyond any correct kernel: budget_ulps")
    assert r["budget_ulps"]["o"] > r["budget_bound"]["o"] and r["verdict"] == "FAIL o:proven"
    assert r["reference_ratio"]["o"] > 1e4 * r["allowed_ratio"]
    code, line = summary([r])
    assert code == 1 and "o: beyond any correct kernel" in line


def test_nan_outputs_are_counted_and_located_in_the_kernels_layout(tmp_path):
    out = tmp_path / "r.json"
    recs = glaref.audit([ak.nan_kernel_bthd], TINY, [9], layout="bthd", json_path=out, **FAST)
    for r in recs:
        assert r["ok"] is False
        assert r["nonfinite"]["o"] == 2
        assert r["nonfinite_first_index"]["o"] == [0, 5, 1, 0]      # (b, t, h, dv) as returned
        assert r["nonfinite"]["h_T"] == 0 and "h_T" not in r["nonfinite_first_index"]
        assert "non-finite" in r["failures"][0]
    doc = json.loads(out.read_text())          # strict JSON: NaN figures are written as null
    assert doc["results"][0]["rel_err_out"]["o"] is None
    assert summary(recs)[0] == 1


def test_bthd_layout_kernel_passes_and_matches_bhtd():
    a = glaref.audit([ak.scan_kernel_bthd], GQA, [12], layout="bthd", **FAST)
    b = glaref.audit([ak.scan_kernel_final], GQA, [12], layout="bhtd", **FAST)
    assert all(r["ok"] for r in a + b)
    for ra, rb in zip(a, b):
        for key in ("rel_err_out", "rel_err_grads"):
            for name, x in (ra.get(key) or {}).items():
                assert x == pytest.approx(rb[key][name], rel=1e-3, abs=tol("audit_rel_err_float32")), name


def test_scale_reaches_a_kernel_that_takes_it():
    (r,) = glaref.audit([ak.scaled_kernel], TINY, [9], ["fwd"], scale=0.25, **FAST)
    assert r["ok"], r["failures"]
    (bad,) = glaref.audit([ak.scan_kernel], TINY, [9], ["fwd"], scale=0.25, **FAST)
    assert bad["ok"] is False      # applies no scale: 0.25 * o expected, o returned


def test_bfloat16_inputs_reach_the_kernel_and_the_oracle_sees_the_same_rounded_values():
    (r,) = glaref.audit([ak.bf16_only_kernel], TINY, [9], ["fwd"], dtype="bfloat16", **FAST)
    assert "skipped" not in r, r.get("skipped")
    assert r["dtype"] == "bfloat16" and r["compute_dtype"] == "bfloat16"
    # a float32 computation on the bf16 inputs: float32-sized error, far below bfloat16's u
    assert r["rel_err_out"]["o"] <= tol("audit_rel_err_float32")
    assert r["rel_err_out"]["o"] < UNIT_ROUNDOFF["bfloat16"] / 100


def test_float64_enables_x64_for_the_run():
    recs = glaref.audit([ak.scan_kernel_final], TINY, [9], dtype="float64", **FAST)
    assert all(r["ok"] and r["compute_dtype"] == "float64" for r in recs)
    assert max(r["rel_err"] for r in recs) <= tol("audit_rel_err_float64")
    assert jnp.zeros(1).dtype == jnp.float32          # x64 was scoped to the audit


# ---------------------------------------------------------------- residual memory

def test_residual_mb_is_zero_for_custom_vjp_and_every_state_for_plain_autodiff():
    B, G, H, dk, dv = TINY["tiny"]
    T = 16
    cv, plain = glaref.audit([ak.custom_vjp_kernel, ak.scan_kernel_final], TINY, [T],
                             ["fwd_bwd"], **FAST)
    assert cv["ok"] and plain["ok"]
    assert cv["residual_mb"] == 0.0
    states = B * H * T * dk * dv * 4 / 2**20          # one float32 state per step, in MiB
    assert plain["residual_mb"] >= states


# ---------------------------------------------------------------- a kernel that raises / is interrupted

def test_a_raising_kernel_is_a_failed_row_and_the_audit_goes_on():
    recs = glaref.audit([ak.raising_kernel], TINY, [9, 20, 11], ["fwd"], **FAST)
    assert [r["seq"] for r in recs] == [9, 20, 11]
    why = "kernel raised ValueError: unsupported shape: T=20"
    assert recs[1]["error"] == why and recs[1]["ok"] is False and recs[1]["failures"] == [why]
    assert "skipped" not in recs[1], recs[1]      # the seed's key is for rows glaref declines
    assert recs[0]["ok"] and recs[2]["ok"]
    code, line = summary(recs)
    assert code == 1 and line.startswith("FAIL: 1 of 3 rows fail the verdict") and why in line, line
    assert summary(recs, first=False) == (1, "FAIL: 1 of 3 rows fail the verdict")  # the plot's title


def test_an_interrupted_audit_keeps_the_rows_it_measured(tmp_path):
    out = tmp_path / "partial.json"
    with pytest.raises(KeyboardInterrupt):
        glaref.audit([ak.interrupting_kernel], TINY, [9, 20], ["fwd", "fwd_bwd"], json_path=out, **FAST)
    doc = json.loads(out.read_text())
    assert [(r["seq"], r["mode"]) for r in doc["results"]] == [(9, "fwd"), (9, "fwd_bwd")]
    assert all(r["ok"] for r in doc["results"])
    assert not [f for f in os.listdir(tmp_path) if f != "partial.json"]   # no temp file left


def test_memory_guard_skips_a_row_that_cannot_fit(monkeypatch):
    from glaref._audit import _device
    monkeypatch.setattr(_device, "available_bytes", lambda device: 1)
    (r,) = glaref.audit([ak.scan_kernel], TINY, [9], ["fwd"], **FAST)
    assert r["skipped"].startswith("needs ") and r["ok"] is None and r["xla_temp_mb"] is not None


# ---------------------------------------------------------------- schema

def test_json_schema_is_the_seeds_plus_our_additions(tmp_path):
    out = tmp_path / "r.json"
    glaref.audit([ak.scan_kernel_final, ak.raising_kernel], TINY, [20], json_path=out, **FAST)
    doc = json.loads(out.read_text())
    assert set(doc) == {"device", "config", "results"}
    assert SEED_DEVICE <= set(doc["device"]) and {"x64", "matmul_precision"} <= set(doc["device"])
    assert SEED_CONFIG <= set(doc["config"])
    by = {(r["impl"].rsplit(".", 1)[-1], r["mode"]): r for r in doc["results"]}
    assert set(by["scan_kernel_final", "fwd"]) == SEED_FWD | OUR_ADDITIONS
    assert set(by["scan_kernel_final", "fwd_bwd"]) == SEED_FWD_BWD | OUR_ADDITIONS
    assert set(by["scan_kernel_final", "fwd_bwd"]["rel_err_grads"]) == SEED_GRADS
    raised = by["raising_kernel", "fwd"]
    assert SEED_SKIPPED - {"skipped"} <= set(raised) and "rel_err" not in raised
    assert raised["ok"] is False and raised["error"] == raised["failures"][0] \
        and "skipped" not in raised and "Traceback" in raised["traceback"], raised


@pytest.mark.skipif(not SEED_JSON.exists(), reason="the seed report is not on this machine")
def test_seed_key_sets_written_here_are_the_seed_reports():
    doc = json.loads(SEED_JSON.read_text())
    assert set(doc["device"]) == SEED_DEVICE and set(doc["config"]) == SEED_CONFIG
    kinds = {("skipped" in r, r["mode"]): set(r) for r in doc["results"]}
    assert kinds == {(False, "fwd"): SEED_FWD, (False, "fwd_bwd"): SEED_FWD_BWD,
                     (True, "fwd"): SEED_SKIPPED, (True, "fwd_bwd"): SEED_SKIPPED}


# ---------------------------------------------------------------- the built-in kernels, specs, usage

def test_builtin_kernels_pass_every_output_and_chunked_saves_no_residuals():
    recs = glaref.audit(None, GQA, [70], **FAST)
    assert {r["impl"] for r in recs} == {"chunked", "scan"}
    assert all(r["ok"] for r in recs), [r.get("failures") or r.get("skipped") for r in recs]
    assert all(r["final_state"] for r in recs)
    fb = {r["impl"]: r for r in recs if r["mode"] == "fwd_bwd"}
    assert fb["chunked"]["residual_mb"] == 0.0 and fb["scan"]["residual_mb"] > 0


def test_module_and_file_specs_load_the_same_kernel():
    path = Path(ak.__file__)
    a = glaref.audit(["audit_kernels:scan_kernel", f"{path}:scan_kernel"], TINY, [9], ["fwd"], **FAST)
    assert [r["impl"] for r in a] == ["audit_kernels:scan_kernel", f"{path}:scan_kernel"]
    assert a[0]["rel_err"] == a[1]["rel_err"] and a[0]["ok"]


@pytest.mark.parametrize("kwargs, word", [
    (dict(preset="huge"), "preset"), (dict(configs="1,2"), "config"), (dict(configs="nope"), "config"),
    (dict(modes="bwd"), "mode"), (dict(dtype="int8"), "dtype"), (dict(precision="tf32"), "precision"),
    (dict(seqs="0"), "seq"), (dict(layout="tbhd"), "layout"), (dict(regimes="wild"), "regime"),
    (dict(impls="no_such_module_xyz:f"), "impl"), (dict(impls="missing_file.py:f"), "impl"),
    (dict(impls="justaname"), "impl"), (dict(repeats=-1), "repeats"),
    (dict(chunk_size=0), "chunk_size"), (dict(accumulate_dtype="int8"), "accumulate_dtype"),
    (dict(accumulate_dtype="bfloat16"), "accumulate_dtype"),     # coarser than float32 inputs
])
def test_bad_arguments_are_usage_errors_naming_the_argument(kwargs, word):
    with pytest.raises(AuditUsageError, match=word):
        glaref.audit(**{"configs": TINY, "seqs": [9], **kwargs})


def test_glaref_audit_is_the_engines_function():
    import inspect
    import subprocess
    import sys
    # in a fresh interpreter: the lazy attribute is the engine's function, before and after its
    # private package is imported
    code = ("import inspect, glaref; a = glaref.audit; import glaref._audit._engine as e; "
            "print(inspect.isfunction(a), a is e.audit is glaref.audit)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
    assert inspect.isfunction(glaref.audit)


def test_repeats_0_measures_accuracy_without_timing():
    a, = glaref.audit([ak.scan_kernel_final], TINY, [9], ["fwd_bwd"], repeats=0, oracle_impl="numpy")
    b, = glaref.audit([ak.scan_kernel_final], TINY, [9], ["fwd_bwd"], **FAST)
    assert a["ok"] and all(a[k] is None for k in ("inner", "median_ms", "q1_ms", "q3_ms"))
    assert a["compile_s"] > 0 and a["residual_mb"] == b["residual_mb"]
    assert b["inner"] >= 1 and b["median_ms"] > 0
    assert a["rel_err_grads"] == b["rel_err_grads"] and a["budget_ulps"] == b["budget_ulps"]


def test_chunk_size_and_accumulate_dtype_describe_user_kernels():
    # a step-by-step kernel declared as such gets a bound no larger than with unknown chunking
    known, = glaref.audit([ak.scan_kernel_final], GQA, [40], ["fwd_bwd"], chunk_size=1, **FAST)
    unknown, = glaref.audit([ak.scan_kernel_final], GQA, [40], ["fwd_bwd"], **FAST)
    assert known["ok"] and known["chunk_size"] == 1
    assert all(known["budget_bound"][n] <= unknown["budget_bound"][n] for n in known["budget_bound"])
    assert known["budget_bound"]["h_T"] < unknown["budget_bound"]["h_T"]

    # bfloat16 inputs, o wrong by 50 %: by default (float32 accumulation, as production kernels
    # do) the proven bound is a few bfloat16 roundings and fails it; declared as rounding every
    # operation to bfloat16 the proven bound is gamma_n of bfloat16 (thousands of ulps even here,
    # infinite on realistic sizes) and proves nothing, but the calibrated tier still compares the
    # kernel with reference kernels that round their sums to bfloat16 too, and fails it
    def half_wrong(q, k, v, log_alpha, h0):
        return ak.bf16_only_kernel(q, k, v, log_alpha, h0) * 1.5

    loose, = glaref.audit([half_wrong], TINY, [9], ["fwd"], dtype="bfloat16",
                          accumulate_dtype="bfloat16", **FAST)
    strict, = glaref.audit([half_wrong], TINY, [9], ["fwd"], dtype="bfloat16", **FAST)
    assert loose["accumulate_dtype"] is None and strict["accumulate_dtype"] == "float32"
    assert loose["budget_bound"]["o"] > 100 * strict["budget_bound"]["o"]
    assert loose["ok"] is False and loose["failed_tier"] == {"o": "calibrated"}
    assert strict["ok"] is False and strict["failed_tier"] == {"o": "proven"}
    # the kernel's own rounding figures are the same; only the bound differs
    assert strict["budget_ulps"] == loose["budget_ulps"]


def test_builtin_kernels_are_judged_with_their_chunk_and_float32_accumulation():
    recs = glaref.audit(None, TINY, [9], ["fwd_bwd"], dtype="bfloat16", repeats=0, oracle_impl="numpy")
    by = {r["impl"]: r for r in recs}
    assert by["chunked"]["chunk_size"] == 64 and by["scan"]["chunk_size"] == 1
    assert all(r["ok"] and r["accumulate_dtype"] == "float32" for r in recs), \
        [r.get("failures") for r in recs]
    f32 = glaref.audit(None, TINY, [9], ["fwd_bwd"], repeats=0, oracle_impl="numpy")
    assert all(r["accumulate_dtype"] is None for r in f32)   # float32 inputs: nothing wider


# ---------------------------------------------------------------- metrics

def test_metrics_on_known_values():
    ref = np.array([3.0, 4.0])
    assert _metrics.rel_err(np.array([3.0, 4.5]), ref) == 0.1
    assert _metrics.rel_err(np.zeros(2), np.zeros(2)) == 0.0
    assert _metrics.rel_err(np.ones(2), np.zeros(2)) == math.inf
    assert math.isnan(_metrics.rel_err(np.array([np.nan, 4.0]), ref))
    assert _metrics.max_abs_err(np.array([3.0, 4.5]), ref) == 0.5
    # budget_ulps of measure: max |x - ref| / (u scale + floor), floor negligible at scale 2
    m = _metrics.measure("h_T", np.array([3.0, 4.5]), ref, np.array([1.0, 2.0]), "bfloat16",
                         Dims(1, 1, 1, 1, 1, 1))
    want = 0.5 / (2.0 * UNIT_ROUNDOFF["bfloat16"])
    assert m["budget_ulps"] == pytest.approx(want, rel=tol("figure_closed_form"))
    assert m["rel_err"] == 0.1 and m["max_abs_err"] == 0.5
    assert _metrics.nonfinite(np.array([[1.0, 2.0], [np.inf, np.nan]])) == (2, [1, 0])
    assert _metrics.nonfinite(ref) == (0, None)
    assert _verdict.compute_dtype("float32", "default", "gpu") == "tf32"
    assert _verdict.compute_dtype("float32", "highest", "gpu") == "float32"
    assert _verdict.compute_dtype("float32", "default", "cpu") == "float32"


# ---------------------------------------------------------------- no silent wrong answers (issues 10, 17)

@pytest.mark.parametrize("kernel, T, why", [
    (ak.complex_kernel, 9, "o: got dtype complex64, expected a real floating dtype"),
    (ak.int_kernel, 9, "o: got dtype int32, expected a real floating dtype"),
    (ak.bool_kernel, 9, "o: got dtype bool, expected a real floating dtype"),
    (ak.none_kernel, 9, "kernel returned None, expected o or (o, h_T)"),
    (ak.exiting_kernel, 9, "kernel raised SystemExit (sys.exit(7))"),
    (ak.memory_error_kernel, 20, "kernel raised MemoryError: cannot allocate the states for T=20"),
])
def test_a_kernel_that_returns_a_wrong_kind_or_raises_is_a_failed_row(kernel, T, why):
    recs = glaref.audit([kernel], TINY, [T], **FAST)
    for r in recs:
        assert r["ok"] is False and r["error"].startswith(why) and r["failures"] == [r["error"]], r
        assert "skipped" not in r, r
    code, line = summary(recs)
    assert code == 1 and why in line


@pytest.mark.parametrize("kwargs, message", [
    (dict(configs=[]), "config: got [], expected at least one config"),
    (dict(configs={}), "config: got {}, expected at least one config"),
    (dict(configs=[(1, 1, 2, 8, 4.5)]), "config '(1, 1, 2, 8, 4.5)': got 4.5 as dv, expected an integer"),
    (dict(seqs=(2.5,)), "seq: got 2.5 (float), expected a positive integer"),
    (dict(seqs=[True]), "seq: got True (bool), expected a positive integer"),
    (dict(seqs=[]), "seq: got [], expected at least one sequence length"),
    (dict(seqs="9,x"), "seq: got 'x' (str), expected a positive integer"),
    (dict(seed=-1), "seed: got -1, expected an integer >= 0"),
    (dict(seed=1.5), "seed: got 1.5 (float), expected an integer >= 0"),
    (dict(scale="0.5"), "scale: got '0.5' (builtins.str), expected a real number"),
    (dict(scale=True), "scale: got True (builtins.bool), expected a real number"),
    (dict(scale=10**400), "scale: got an integer of 1329 bits"),
    (dict(chunk_size=0), "chunk_size: got 0, expected a positive integer"),
    (dict(chunk_size=2.0), "chunk_size: got 2.0 (float), expected a positive integer"),
    (dict(impls="chunked", chunk_size=16), "chunk_size: got 16, but it describes user kernels and "
                                            "every kernel here is built in (chunked)"),
    (dict(impls="chunked,scan", accumulate_dtype="float32"), "accumulate_dtype: got 'float32', but"),
    (dict(modes=5), "mode: got 5, expected one of ('fwd', 'fwd_bwd')"),
    (dict(preset=["quick"]), "preset: got ['quick'], expected one of"),
    (dict(backend=0), "backend: got 0, expected a platform name"),
    (dict(impls=f"{ak.__file__}:not_a_kernel"), "impl: '"),
])
def test_bad_arguments_are_refused_before_any_work_naming_what_they_got(kwargs, message):
    with pytest.raises(AuditUsageError) as e:
        glaref.audit(**{"impls": [ak.scan_kernel], "configs": TINY, "seqs": [9], **kwargs})
    assert str(e.value).startswith(message), str(e.value)


def test_a_non_callable_kernel_name_says_what_it_names():
    with pytest.raises(AuditUsageError) as e:
        glaref.audit([f"{ak.__file__}:not_a_kernel"], TINY, [9])
    assert str(e.value).endswith("not_a_kernel' names 3 (type int), expected a callable"), str(e.value)


def test_unwritable_json_paths_are_refused_before_any_work(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = {str(tmp_path): "which is a directory; expected a file name",
             "/proc/version": "no file can be created in '/proc'",
             str(afile / "r.json"): "is not a directory"}
    for path, text in cases.items():
        with pytest.raises(AuditUsageError) as e:
            glaref.audit([ak.scan_kernel], TINY, [9], json_path=path, **FAST)
        assert str(e.value).startswith("json_path: ") and text in str(e.value), str(e.value)
    # a missing directory is created, as for the plot
    out = tmp_path / "new" / "dir" / "r.json"
    glaref.audit([ak.scan_kernel], TINY, [9], ["fwd"], json_path=out, **FAST)
    assert json.loads(out.read_text())["results"][0]["ok"]


def test_the_oracles_memory_is_estimated_and_rows_that_cannot_fit_are_skipped(monkeypatch):
    from glaref._audit import _device, _engine

    # the estimate covers at least what is certainly held at once: the generated inputs, their
    # rounded copy and the oracle's forward; the gradients add to it
    d = Dims(1, 1, 2, 9, 8, 4)
    p = make_inputs("standard", d, 0)
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0)
    held = 2 * sum(x.nbytes for x in p[:7]) + o.nbytes + h_T.nbytes
    assert held <= _engine.oracle_bytes(d, ["fwd"]) < _engine.oracle_bytes(d, ["fwd", "fwd_bwd"])
    need = _engine.oracle_bytes(d, ["fwd", "fwd_bwd"])
    monkeypatch.setattr(_device, "host_available_bytes", lambda: need - 1)
    monkeypatch.setattr("glaref.regimes.make_inputs", lambda *a, **k: pytest.fail("inputs made"))
    recs = glaref.audit([ak.scan_kernel], TINY, [9], **FAST)
    assert [r["mode"] for r in recs] == ["fwd", "fwd_bwd"]
    for r in recs:
        assert r["ok"] is None and r["skipped"].startswith(
            f"the oracle needs about {need / 2**30:.3g} GiB of host memory"), r
    code, line = summary(recs)
    assert code == 3 and re.match(r"INCOMPLETE: 0 rows within .*, 2 of 2 skipped by glaref", line), line


def test_absurd_sizes_are_skipped_not_allocated():
    # 10**12 and 10**30 steps: the estimate alone refuses them (numpy could not even make the shape)
    recs = glaref.audit([ak.scan_kernel], {"big_b": (10**11, 1, 1, 8, 8), **TINY},
                        [9, 10**12, 10**30], ["fwd"], **FAST)
    assert [(r["config"], r["seq"], r["ok"]) for r in recs] == [
        ("big_b", 9, None), ("big_b", 10**12, None), ("big_b", 10**30, None),
        ("tiny", 9, True), ("tiny", 10**12, None), ("tiny", 10**30, None)]
    assert summary(recs)[0] == 3


def test_an_oracle_that_would_overflow_is_a_usage_error_naming_scale():
    with pytest.raises(AuditUsageError) as e:
        glaref.audit([ak.scan_kernel], TINY, [9], ["fwd"], scale=1e308, **FAST)
    msg = str(e.value)
    # the error scales (sums of |terms|) overflow first, before the values themselves
    assert re.match(r"scale: got 1e\+308; the oracle's (forward|error scales): non-finite results: "
                    r"o has ", msg), msg
    assert "Likely cause: scale (1e+308)" in msg, msg


def test_a_kernel_file_imports_its_sibling_modules_and_sys_path_is_restored(tmp_path, monkeypatch):
    kdir = tmp_path / "kdir"
    kdir.mkdir()
    (kdir / "glaref_sibling_helper.py").write_text("FACTOR = 1.0\n")
    (kdir / "kernel.py").write_text(
        "import glaref_sibling_helper\n"
        f"import sys; sys.path.insert(0, {str(Path(ak.__file__).parent)!r})\n"
        "from audit_kernels import scan_kernel\n"
        "def fn(q, k, v, log_alpha, h0):\n"
        "    return scan_kernel(q, k, v, log_alpha, h0) * glaref_sibling_helper.FACTOR\n")
    monkeypatch.chdir(tmp_path.parent)
    before = list(__import__("sys").path)
    (r,) = glaref.audit([f"{kdir / 'kernel.py'}:fn"], TINY, [9], ["fwd"], **FAST)
    assert r["ok"], r
    after = list(__import__("sys").path)
    assert str(kdir) not in after and len(after) == len(before) + 1      # the kernel's own insert


def test_a_kernel_module_that_exits_on_import_is_a_usage_error(tmp_path):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(7)\n")
    with pytest.raises(AuditUsageError) as e:
        glaref.audit([f"{tmp_path / 'exits.py'}:fn"], TINY, [9], **FAST)
    assert str(e.value).endswith("exits.py' failed: it called sys.exit(7)"), str(e.value)


# ---------------------------------------------------------------- failing kernels fail; table, plot
# (issue 10)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "audit_user_kernels.py"


def test_a_kernel_whose_backward_raises_fails_its_row_and_check_kernel_agrees():
    # a custom_vjp whose backward raises NotImplementedError used to be a skipped row (exit 0)
    fwd, bwd = glaref.audit([ak.no_backward_kernel], TINY, [9], **FAST)
    assert fwd["ok"] is True, fwd
    why = "kernel raised NotImplementedError: backward not written yet"
    assert bwd["ok"] is False and bwd["failures"] == [why] and bwd["error"] == why, bwd
    assert "skipped" not in bwd, bwd
    line = (f"FAIL: 1 of 2 rows fail the verdict (first: {bwd['impl']} fwd_bwd tiny T=9 (standard): "
            f"{why}); ran 1 kernel x 1 regime (standard) x float32, T 9")
    assert summary([fwd, bwd]) == (1, line)
    from glaref.testing import check_kernel

    with pytest.raises(AssertionError, match="NotImplementedError: backward not written yet"):
        check_kernel(ak.no_backward_kernel, framework="jax", configs=TINY, seqs=[9])


def test_a_row_without_a_finite_bound_is_decided_by_the_reference_kernels():
    # float32 at T = 4000 with no --chunk-size: no finite proven bound (inf; null in the JSON). The
    # table used to show "0 ok" there; now the calibrated tier decides and "proven" shows "-".
    from glaref._audit._report import Table

    (r,) = glaref.audit([ak.scan_kernel], TINY, [4000], ["fwd"], **FAST)
    assert r["budget_bound"]["o"] == math.inf and r["failed_tier"] == {} and r["ok"] is True, r
    assert 0 < r["reference_ratio"]["o"] <= r["allowed_ratio"]
    table = Table([r["impl"]], [r["config"]], None)
    head = table.header.split()
    line = table.line(r).split()
    assert line[head.index("proven")] == "-" and line[-1] == "ok", table.line(r)
    assert line[head.index("x_ref")] == f"{r['reference_ratio']['o']:.2g}(o)"


def test_a_row_without_a_verdict_says_so_and_is_not_counted_ok():
    # the verdict's "undecided" tier (the reference kernels gave a non-finite error): named in
    # the table and the summary, and a failed row, never an "ok"
    from glaref._audit._report import Table

    why = "o: no verdict: the float32 reference kernels gave a non-finite error"
    r = {"impl": "k", "mode": "fwd", "config": "tiny", "seq": 9, "regime": "standard",
         "rel_err_out": {"o": 1e-7}, "budget_ulps": {"o": 1.0}, "budget_bound": {"o": None},
         "reference_ratio": {"o": None}, "ok": False, "failed_tier": {"o": "undecided"},
         "failures": [why]}
    assert Table(["k"], ["tiny"], None).line(r).endswith("  FAIL o:undecided")
    line = (f"FAIL: 1 of 1 rows fail the verdict (first: k fwd tiny T=9 (standard): {why}); ran "
            "1 kernel x 1 regime (standard), T 9")
    assert summary([r]) == (1, line)


def test_the_plot_draws_each_outputs_allowed_error_dotted_beside_the_measured_one(monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from glaref._audit._report import plot

    recs = glaref.audit([f"{EXAMPLES}:chunked_dq_bug"], TINY, [9, 17], chunk_size=64, **FAST)
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: saved.append(fig))
    plot(recs, "unused.png")
    (fig,) = saved
    panels = {ax.get_title(): ax for ax in fig.axes}
    for name, title in (("o", "rel_err o"), ("q", "rel_err q (gradient)"),
                        ("log_alpha", "rel_err log_alpha (gradient)")):
        lines = panels[title].get_lines()
        mode = "fwd" if name == "o" else "fwd_bwd"
        rs = [r for r in recs if r["mode"] == mode]
        errs = {**rs[0]["rel_err_out"], **(rs[0].get("rel_err_grads") or {})}
        measured = [ln for ln in lines if ln.get_linestyle() == "-"]
        allowed = [ln for ln in lines if ln.get_linestyle() == ":"]
        assert len(measured) == 1 and len(allowed) == 1, title
        assert measured[0].get_ydata()[0] == errs[name]
        assert list(allowed[0].get_ydata()) == [r["allowed_ratio"] * r["reference_rel_err"][name]
                                               for r in rs]
        crosses = [ln for ln in lines if ln.get_marker() == "x"]
        assert bool(crosses) == (name == "q"), title          # dq * 1.01 fails on dq only
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "solid: measured rel_err" in labels and "verdict failed" in labels
    assert f"dotted: allowed rel_err ({tol('calibrated_ratio'):g}x the reference kernels')" in labels
    assert fig._suptitle.get_text() == "FAIL: 2 of 4 rows fail the verdict", fig._suptitle.get_text()


def test_the_example_user_kernels_pass_and_fail_as_docs_reports_audit_examples_shows():
    good = glaref.audit([f"{EXAMPLES}:chunked"], TINY, [9], ["fwd_bwd"], chunk_size=64, **FAST)
    bad = glaref.audit([f"{EXAMPLES}:chunked_dq_bug"], TINY, [9], ["fwd_bwd"], chunk_size=64, **FAST)
    assert [r["ok"] for r in good] == [True], good
    (r,) = bad
    assert r["ok"] is False and list(r["failed_tier"]) == ["q"], r
    # dq * 1.01: a normwise relative error of 0.01, plus at most the float32 kernel's own error
    assert r["rel_err_grads"]["q"] == pytest.approx(0.01, abs=1.01 * tol("audit_rel_err_float32"))


def test_rows_of_one_program_share_its_compile():
    """Rows of the same kernel, mode and shapes (two regimes here) compile one program: the
    kernel is traced for compiling once, not once per row, and both rows carry that compile's
    figure; a packed row (its offsets baked in) would compile its own."""
    traced = []

    def kernel(q, k, v, log_alpha, h0):
        traced.append(1)
        return glaref.kernels.scan(q, k, v, log_alpha, h0)

    recs = glaref.audit([kernel], TINY, [9], ["fwd"], regimes="standard,strong_decay",
                        repeats=0, oracle_impl="numpy")
    assert len(recs) == 2 and all(r["ok"] for r in recs), recs
    # one trace for the structure (jax.eval_shape, cached across rows of equal shapes) and one
    # for the single compile; a compile per row traces a third time
    assert len(traced) == 2, len(traced)
    assert recs[0]["compile_s"] == recs[1]["compile_s"] > 0
