"""glaref.testing.check_kernel and the pytest plugin: thin faces over the audit engine.

The verdicts themselves are the engine's (tests/test_detection.py holds their detection power);
here: correct kernels pass, a broken one fails with its figures in the message, a kernel that
raises fails naming the exception, the plugin's fixture and options work in a real pytest run, and
loading the plugin imports neither jax nor numba.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("jax", reason="check_kernel runs JAX kernels (the jax extra)")

import glaref.kernels  # noqa: E402
from glaref._inputs import OUTPUTS  # noqa: E402
from glaref.testing import assert_close_to_oracle, check_kernel  # noqa: E402

import mutants  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.jax

# the rows these tests assert on: check_kernel's defaults before they gained strong_decay,
# near_one and T = 1000 (tests/test_first_hour.py checks today's defaults)
OLD_SEQS = (1, 63, 65)

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("name, chunk_size", [("chunked", 64), ("scan", 1)])
def test_correct_kernels_pass_and_their_records_come_back(name, chunk_size):
    # the kernels as plain user callables (they return o only), judged with their chunk length
    recs = check_kernel(getattr(glaref.kernels, name), chunk_size=chunk_size,
                        seqs=OLD_SEQS, regimes="standard")
    assert [r["seq"] for r in recs] == list(OLD_SEQS)
    for r in recs:
        assert r["ok"] is True and r["mode"] == "fwd_bwd" and r["regime"] == "standard"
        assert set(r["budget_ulps"]) == {"o", "q", "k", "v", "log_alpha", "h0"}
        assert all(r["budget_ulps"][n] <= r["budget_bound"][n] for n in r["budget_ulps"])


def test_a_broken_kernel_fails_with_the_figures_of_each_failing_output():
    with pytest.raises(AssertionError) as info:
        check_kernel(mutants.gate_late, chunk_size=mutants.MUTANT_CHUNK, seqs=OLD_SEQS, regimes="standard")
    msg = str(info.value)
    assert "on 3 of 3 rows" in msg
    for T in OLD_SEQS:
        assert f"gate_late fwd_bwd config b1g2h4_dk16_dv16 (B=1 G=2 H=4 dk=16 dv=16) T={T} " \
               "regime standard: FAIL o:" in msg
    # each failing output on its own line with the tier that failed it and every figure
    lines = re.findall(r"^  (\w+)(?: \(gradient\))?: (\w+) tier: (\S+)x the reference kernels' "
                       r"error \(allowed (\S+)x; rel_err (\S+) vs (\S+)\), budget_ulps (\S+) "
                       r"\(proven bound (\S+)\), max_abs_err (\S+)$", msg, flags=re.M)
    assert {ln[0] for ln in lines} == set(OUTPUTS)
    for name, tier, ratio, allowed, rel, base, ulps, bound, abs_err in lines:
        assert tier in ("calibrated", "proven"), (name, tier)
        assert float(ratio) > float(allowed), (name, ratio, allowed)
        if tier == "proven":
            assert float(ulps) > float(bound), (name, ulps, bound)
        assert float(rel) > float(base) > 0 and float(abs_err) > 0


def test_a_nonfinite_output_is_reported_with_its_first_index():
    import jax.numpy as jnp

    def nan_at_one_element(q, k, v, log_alpha, h0, scale):
        o = glaref.kernels.chunked(q, k, v, log_alpha, h0, scale=scale)
        return o.at[0, 1, 2, 3].set(jnp.nan)

    with pytest.raises(AssertionError) as info:
        check_kernel(nan_at_one_element, seqs=[5], modes=["fwd"], chunk_size=64, regimes="standard")
    msg = str(info.value)
    assert "FAIL o" in msg and "o: 1 non-finite value(s), first at (0, 1, 2, 3)" in msg, msg
    # no ratio, budget or error figure describes a non-finite output
    o_line = [ln for ln in msg.splitlines() if ln.startswith("  o: ")][0]
    assert "reference kernels' error" not in o_line and "budget_ulps" not in o_line, o_line


def test_a_kernel_that_raises_is_a_failure_naming_the_exception():
    def raises(q, k, v, log_alpha, h0):
        raise RuntimeError("deliberately broken")

    with pytest.raises(AssertionError) as info:
        check_kernel(raises, seqs=[5], regimes="standard")
    msg = str(info.value)
    assert "on 1 of 1 rows" in msg
    assert "T=5 regime standard: kernel not measured: RuntimeError: deliberately broken" in msg, msg


def test_bad_arguments_are_usage_errors_not_assertion_failures():
    from glaref._errors import AuditUsageError

    with pytest.raises(AuditUsageError, match="regime: got 'nope'"):
        check_kernel("chunked", regimes="nope")


PLUGIN_TEST = """
    import pytest
    import glaref.kernels


    def shifted_gates(q, k, v, log_alpha, h0, scale):
        # gate applied one step late: a structural bug
        import jax.numpy as jnp
        la = jnp.concatenate([jnp.zeros_like(log_alpha[..., :1]), log_alpha[..., :-1]], axis=-1)
        return glaref.kernels.chunked(q, k, v, la, h0, scale=scale)


    @pytest.mark.glaref
    def test_correct(glaref_check):
        recs = glaref_check(glaref.kernels.scan, configs="1,1,2,4,4", seqs=[6], chunk_size=1)
        assert [(r["regime"], r["dtype"], r["ok"]) for r in recs] == [("zero_gate", "float64", True)]


    @pytest.mark.glaref
    def test_broken(glaref_check):
        glaref_check(shifted_gates, configs="1,1,2,4,4", seqs=[6], chunk_size=64)


    def test_call_arguments_win(glaref_check):
        (rec,) = glaref_check(glaref.kernels.scan, configs="1,1,2,4,4", seqs=[6], chunk_size=1,
                              regimes="standard", dtype="float32")
        assert (rec["regime"], rec["dtype"]) == ("standard", "float32")
"""


def test_plugin_fixture_and_options_in_a_real_pytest_run(pytester):
    # the plugin is loaded through its pytest11 entry point, as in any project that installs glaref
    pytester.makepyfile(test_user_kernel=textwrap.dedent(PLUGIN_TEST))
    result = pytester.runpytest_subprocess("--strict-markers", "--glaref-regimes=zero_gate",
                                           "--glaref-dtype=float64", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "AssertionError: kernel disagrees with the glaref oracle on 1 of 1 rows" in out
    # with zero gates (log_alpha = 0) a gate one step late changes only the gate's gradient
    assert re.search(r"shifted_gates fwd_bwd config \S+ .* T=6 regime zero_gate: FAIL log_alpha:proven$",
                     out, flags=re.M), out
    assert "log_alpha (gradient): proven tier:" in out
    result = pytester.runpytest_subprocess("--strict-markers", "-m", "glaref", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*2/3 tests collected (1 deselected)*"])


def test_loading_the_plugin_imports_neither_jax_nor_numba():
    code = ("import sys, glaref.pytest_plugin; "
            "heavy = [m for m in ('jax', 'numba', 'torch') if m in sys.modules]; "
            "assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- no silent wrong answers (issue 17)

import audit_kernels as ak  # noqa: E402


@pytest.mark.parametrize("kernel, dtype", [(ak.complex_kernel, "complex64"), (ak.int_kernel, "int32"),
                                           (ak.bool_kernel, "bool")])
def test_outputs_of_a_wrong_dtype_fail_naming_the_dtype(kernel, dtype):
    # correct + 1e3j used to pass (numpy dropped the imaginary part with a ComplexWarning)
    with pytest.raises(AssertionError) as info:
        check_kernel(kernel, seqs=[5], modes=["fwd"], regimes="standard")
    msg = str(info.value)
    assert f"kernel not measured: o: got dtype {dtype}, expected a real floating dtype" in msg, msg
    assert "budget_ulps" not in msg.split(":\n", 1)[1]          # no accuracy figures for it


@pytest.mark.parametrize("kwargs, text", [
    (dict(configs=[]), "config: got [], expected at least one config"),
    (dict(configs={}), "config: got {}, expected at least one config"),
    (dict(seqs=(2.5,)), "seq: got 2.5 (float), expected a positive integer"),
    (dict(modes=()), "mode: got nothing"),
])
def test_zero_rows_and_truncated_lengths_are_usage_errors(kwargs, text):
    from glaref._errors import AuditUsageError

    with pytest.raises(AuditUsageError) as info:
        check_kernel("scan", **kwargs, regimes="standard")
    assert str(info.value).startswith(text), str(info.value)


def test_a_kernel_calling_sys_exit_fails_instead_of_exiting(tmp_path):
    # as a JAX kernel (the audit engine) and as a NumPy one (glaref._audit._frameworks)
    with pytest.raises(AssertionError,
                       match=r"kernel not measured: kernel raised SystemExit \(sys.exit\(7\)\)"):
        check_kernel(ak.exiting_kernel, framework="jax", seqs=[5], modes=["fwd"], regimes="standard")
    with pytest.raises(AssertionError, match=r"kernel not measured: SystemExit: 7"):
        check_kernel(ak.exiting_kernel, framework="numpy", seqs=[5], modes=["fwd"], regimes="standard")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(7)\n")
    from glaref._errors import AuditUsageError
    with pytest.raises(AuditUsageError, match=r"failed: it called sys.exit\(7\)$"):
        check_kernel(f"{tmp_path / 'exits.py'}:fn", seqs=OLD_SEQS, regimes="standard")


def test_rows_glaref_declines_are_an_environment_error_not_a_pass(monkeypatch):
    from glaref._audit import _device
    from glaref._errors import AuditEnvironmentError

    monkeypatch.setattr(_device, "host_available_bytes", lambda: 1)
    with pytest.raises(AuditEnvironmentError, match=r"^1 of 1 rows not checked: fwd_bwd config "
                                                     r"\S+ T=5: the oracle needs about"):
        check_kernel("scan", seqs=[5], regimes="standard")


BAD_ARGUMENT_TEST = """
    import glaref.testing


    def test_bad_regime():
        glaref.testing.check_kernel("scan", regimes="nope")


    def test_uses_fixture(glaref_check):
        glaref_check("scan", seqs=[3])
"""


def test_a_bad_argument_or_option_reports_one_line_not_the_engines_source(pytester):
    pytester.makepyfile(test_args=textwrap.dedent(BAD_ARGUMENT_TEST))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "bad_regime")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "AuditUsageError: regime: got 'nope', expected one of" in out
    # the engine's code is not in the report: only the test's own line and the error
    assert "def audit(" not in out and "_engine.py" not in out, out
    # a bad option of the plugin: one usage error for the run, before any test
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--glaref-regimes=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--glaref-regimes: got 'nope', expected comma-separated names from" in err, err
    assert "Traceback" not in err and "_engine.py" not in err
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--glaref-dtype=int8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--glaref-dtype: got 'int8', expected one of" in result.stderr.str()


def _numpy_kernel(kind):
    """A NumPy kernel (run through glaref._audit._frameworks) of the given wrong kind."""
    import numpy as np

    from glaref.gla import _reference

    def kernel(q, k, v, log_alpha, h0):
        o = _reference.forward(*(np.asarray(x, np.float64) for x in (q, k, v, log_alpha, h0)))[0]
        if kind == "complex":
            return o + 1e3j
        if kind == "int32":
            return o.astype(np.int32)
        if kind == "none":
            return None
        import sys
        sys.exit(7)

    kernel.__name__ = f"numpy_{kind}"
    return kernel


@pytest.mark.parametrize("kind, why", [
    ("complex", "o: got dtype complex128, expected a real floating dtype"),
    ("int32", "o: got dtype int32, expected a real floating dtype"),
    ("none", "kernel returned None, expected o or (o, h_T)"),
    ("exit", "SystemExit: 7"),
])
def test_numpy_kernels_of_a_wrong_kind_fail_the_same_way(kind, why):
    # the torch/NumPy path (glaref._audit._frameworks) checks outputs with the same function as the
    # JAX path: a failed row naming the problem, never a DTypeError or an exit out of check_kernel
    with pytest.raises(AssertionError) as info:
        check_kernel(_numpy_kernel(kind), framework="numpy", seqs=[5], modes=["fwd"], chunk_size=1,
                     regimes="standard")
    assert f"T=5 regime standard: kernel not measured: {why}" in str(info.value), str(info.value)


def _torch_vector_scan(mean_gate: bool):
    """A float32 torch kernel of vector gates, step by step (direct-form dlog_alpha through
    autograd); ``mean_gate`` decays every key dimension by the mean of its gates (a bug)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'glaref[field]')")

    def kernel(q, k, v, log_alpha, h0, scale=1.0):
        G, H = q.shape[1], v.shape[1]
        q, k = (x.repeat_interleave(H // G, dim=1) for x in (q, k))
        if mean_gate:
            log_alpha = log_alpha.mean(-1, keepdim=True).expand_as(log_alpha)
        S, outs = h0, []
        for t in range(q.shape[2]):
            S = S * torch.exp(log_alpha[:, :, t])[..., None] + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append(scale * (q[:, :, t, :, None] * S).sum(-2))
        return torch.stack(outs, 2), S

    kernel.__name__ = "mean_gate_scan" if mean_gate else "vector_scan"
    return kernel


def test_torch_kernels_of_vector_gates_are_checked_with_their_dlog_alpha_form():
    recs = check_kernel(_torch_vector_scan(False), framework="torch", gate="vector", seqs=[40],
                        regimes="standard,strong_decay", dlog_alpha_form="direct")
    assert len(recs) == 2 and all(r["ok"] for r in recs)
    assert all((r["gate"], r["dlog_alpha_form"], r["mode"]) == ("vector", "direct", "fwd_bwd")
               for r in recs)
    with pytest.raises(AssertionError) as info:
        check_kernel(_torch_vector_scan(True), framework="torch", gate="vector", seqs=[40],
                     regimes="standard")
    assert "T=40 regime standard gate vector: FAIL" in str(info.value), str(info.value)
    assert "\n  log_alpha (gradient): " in str(info.value)
    with pytest.raises(glaref.AuditUsageError, match="gate: got 'diagonal'"):
        check_kernel(_torch_vector_scan(False), framework="torch", gate="diagonal", seqs=[40],
                     regimes="standard")
    with pytest.raises(glaref.AuditUsageError, match="dlog_alpha_form: got 'exact'"):
        check_kernel(_torch_vector_scan(False), framework="torch", dlog_alpha_form="exact", seqs=[40],
                     regimes="standard")


# FLA's "bthd" layout (batch, time, head, feature): a wrong element planted at a known index must
# be reported at that index of the caller's own arrays, not of glaref's canonical "bhtd" ones.
O_AT, DK_AT = (0, 5, 1, 2), (0, 6, 1, 3)
B_, T_, G_, H_, DK_, DV_ = 1, 9, 2, 2, 4, 3


def _bthd_problem():
    rng = np.random.default_rng(3)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    q, k, v, do = f32(B_, T_, G_, DK_), f32(B_, T_, G_, DK_), f32(B_, T_, H_, DV_), f32(B_, T_, H_, DV_)
    la = -rng.uniform(0.05, 1.0, (B_, T_, H_)).astype(np.float32)
    h0 = np.zeros((B_, H_, DK_, DV_), np.float32)
    return dict(q=q, k=k, v=v, log_alpha=la, h0=h0, do=do)


def test_mismatched_elements_and_the_worst_index_are_in_the_callers_layout():
    p = _bthd_problem()
    o, _ = glaref.forward(p["q"], p["k"], p["v"], p["log_alpha"], p["h0"], layout="bthd", impl="numpy")
    g = glaref.vjp(*(p[n] for n in ("q", "k", "v", "log_alpha", "h0", "do")), layout="bthd",
                   impl="numpy")
    o, dk = o.astype(np.float32), g.k.astype(np.float32)
    o[O_AT] += 1.0
    dk[DK_AT] -= 1.0
    with pytest.raises(AssertionError) as info:
        assert_close_to_oracle({"o": o, "k": dk}, p, layout="bthd", dtype="float32", oracle_impl="numpy")
    msg = str(info.value)
    assert re.search(rf"\n  o: mismatched elements: 1 / {o.size} \(1\.85%\) beyond the proven bound of "
                     r"[0-9.]+ budget units; worst [0-9.e+]+ at \(0, 5, 1, 2\) \(bthd\)\n", msg), msg
    assert re.search(rf"\n  k: mismatched elements: 1 / {dk.size} \(1\.39%\) beyond .* at "
                     r"\(0, 6, 1, 3\) \(bthd\)\n", msg), msg


def _planted_bthd_kernel(q, k, v, log_alpha, h0):
    o, h_T = glaref.forward(q, k, v, log_alpha, h0, layout="bthd", impl="numpy")
    o = o.astype(q.dtype)
    o[O_AT] += 1.0
    return o, h_T.astype(q.dtype)


def test_check_kernel_and_the_records_give_mismatched_elements_in_the_callers_layout():
    with pytest.raises(AssertionError) as info:
        check_kernel(_planted_bthd_kernel, framework="numpy", layout="bthd", seqs=[T_],
                     configs=f"{B_},{G_},{H_},{DK_},{DV_}", modes=["fwd"], regimes="standard",
                     chunk_size=1)
    (rec,) = info.value.records
    size = B_ * T_ * H_ * DV_
    assert rec["mismatched"]["o"]["count"] == 1 and rec["mismatched"]["o"]["size"] == size, rec
    assert rec["mismatched"]["o"]["worst_index"] == list(O_AT), rec["mismatched"]
    assert "h_T" not in rec["mismatched"]            # only failing outputs are counted
    assert re.search(r"\n  o: mismatched elements: 1 / 54 \(1\.85%\) beyond the proven bound of "
                     r"[0-9.]+ budget units; worst [0-9.e+]+ at \(0, 5, 1, 2\) \(bthd\)",
                     str(info.value)), str(info.value)
    # the profile's worst element too, in the caller's axes
    assert "o: worst element" in str(info.value) and "at (b, t, h, d) = (0, 5, 1, 2)" in str(info.value)
