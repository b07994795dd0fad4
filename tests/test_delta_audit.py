"""The gated delta rule under audit (``--recurrence delta``, ``recurrence="delta"``): a zoo of
correct kernels passes every default regime at five seeds, float32 and bfloat16 inputs, every
mutant of ``delta_mutants`` fails one, a kernel claiming its bfloat16 operands is judged as it
claims, and the CLI runs the family end to end. Sweeps (the zoo at T = 65 and 130, the seed
configs at T = 512 and 2048) under ``-m slow``.

The zoo's seeds run in one engine call per dtype (``_audit_seeds``), which traces and compiles
each kernel once for all of them; jax's persistent compilation cache (tests/conftest.py) lets the
other tests, and the next run, load a program compiled before instead of compiling it afresh."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

import glaref  # noqa: E402
from glaref._audit import _args  # noqa: E402
from glaref._audit._claims import Claims  # noqa: E402
from glaref._audit._engine import JaxOptions, audit_jax  # noqa: E402
from glaref._audit._presets import SEED_CONFIGS  # noqa: E402
from glaref.cli import main  # noqa: E402
from glaref.delta._family import AUDIT_REGIMES, DELTA  # noqa: E402
from glaref.testing import check_kernel  # noqa: E402
from glaref.tolerances import tol  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import delta_mutants as dm  # noqa: E402

pytest_plugins = ["pytester"]

SMALL = "1,1,2,16,8"                   # B, G, H, dk, dv: two heads sharing q, k (G < H)
# T = 40 in the default suite: not a multiple of any chunk, so the last chunk is partial
REGIMES = ",".join(AUDIT_REGIMES)
FAST = dict(modes="fwd_bwd", repeats=0, recurrence="delta", regimes=REGIMES)
SEEDS = range(5)
DTYPES = ("float32", "bfloat16")       # bfloat16 inputs: the zoo accumulates in float32
OUTS = ("o", "h_T", "q", "k", "v", "beta", "log_alpha", "h0")


def _audit(kernels, seqs=(40,), configs=SMALL, **over):
    kernels = kernels if isinstance(kernels, list) else [kernels]
    return glaref.audit(kernels, configs, list(seqs), **{**FAST, **over})


def _failing(records):
    return {(r["regime"], n) for r in records if r["ok"] is False for n in r["failed_tier"]}


def _worst(records) -> float:
    """The largest error of any output of ``records`` over what the verdict allows."""
    return max(x / r["allowed_ratio"] for r in records for x in r["reference_ratio"].values())


def test_the_family_plugs_in_by_name_and_its_options_are_checked_once():
    assert _args.family("delta") is DELTA and _args.family("scalar_gate").name == "scalar_gate"
    with pytest.raises(glaref.ClaimError, match="recurrence: got 'nope'"):
        glaref.audit(["scan"], SMALL, [5], recurrence="nope")
    with pytest.raises(glaref.AuditUsageError, match="regime: got 'near_one'"):
        glaref.audit(["scan"], SMALL, [5], recurrence="delta", regimes="near_one")


def _audit_seeds(kernels, seeds, dtype):
    """The records of ``glaref.audit(kernels, SMALL, [40], **FAST, dtype=dtype)`` at every seed
    of ``seeds``, run by one engine call (``audit_jax`` with a row set per seed): each kernel is
    traced and compiled once for all the seeds, and the kernels share each problem's oracle."""
    fam = _args.family("delta")
    rows = [_args.rows(_args.check_preset("quick", fam), _args.problems(seed), configs=SMALL,
                       seqs=[40], modes=FAST["modes"], regimes=REGIMES, fam=fam)
            for seed in seeds]
    claims = Claims(dtype=dtype, recurrence="delta")
    return [r.to_json() for r in audit_jax(kernels, rows, claims, JaxOptions(repeats=0))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_zoo_passes_every_default_regime_at_five_seeds(dtype, record_property):
    recs = _audit_seeds(list(dm.ZOO.values()), SEEDS, dtype)
    assert sorted((r["impl"], r["regime"], r["seed"], r["dtype"]) for r in recs) == sorted(
        (k.__qualname__, g, seed, dtype) for k in dm.ZOO.values() for g in AUDIT_REGIMES
        for seed in SEEDS)
    assert not _failing(recs), [(r["impl"], r["seed"], r["failures"]) for r in recs]
    for r in recs:       # every output and gradient judged, beta's included, and a header key
        assert set(r["reference_ratio"]) == set(OUTS)
        assert r["recurrence"] == "delta" and r["budget_bound"]["beta"] == float("inf")
    worst = {k.__qualname__: _worst([r for r in recs if r["impl"] == k.__qualname__])
             for k in dm.ZOO.values()}
    record_property("worst_of_allowed", worst)


def test_one_engine_call_runs_the_same_rows_at_several_seeds_as_separate_audits():
    together = _audit_seeds([dm.ZOO["scan"]], (3, 4), "float32")
    apart = _audit([dm.ZOO["scan"]], seed=4)
    assert [r["seed"] for r in together] == [3] * len(AUDIT_REGIMES) + [4] * len(AUDIT_REGIMES)
    assert [(r["regime"], r["rel_err_out"], r["rel_err_grads"]) for r in together[4:]] == \
        [(r["regime"], r["rel_err_out"], r["rel_err_grads"]) for r in apart]


@pytest.mark.slow
def test_the_built_in_kernels_pass_in_both_modes_and_a_declared_chunk_of_128():
    recs = glaref.audit(["chunked", "scan"], SMALL, [70], recurrence="delta", repeats=0,
                        regimes="standard")            # 70: a partial second chunk
    assert [(r["impl"], r["mode"], r["ok"]) for r in recs] == [
        ("chunked", "fwd", True), ("scan", "fwd", True), ("chunked", "fwd_bwd", True),
        ("scan", "fwd_bwd", True)]
    assert {r["impl"]: r["chunk_size"] for r in recs} == {"chunked": 64, "scan": 1}
    assert all(r["ok"] for r in _audit(dm.chunked_at(128), seqs=(130,), chunk_size=128,
                                       regimes="standard"))


def test_a_kernel_rounding_its_operands_to_bfloat16_is_judged_as_it_claims(capsys):
    # a bug in a float32 kernel that says nothing: every output and gradient fails
    assert _failing(_audit(dm.bf16_operands, chunk_size=1, regimes="standard")) == \
        {("standard", n) for n in OUTS}
    # its design once claimed, through check_kernel and the CLI, in every default regime
    recs = check_kernel(dm.bf16_operands, framework="jax", recurrence="delta", configs=SMALL,
                        seqs=[40], chunk_size=1, operand_dtype="bfloat16")
    assert [(r["regime"], r["outcome"], r["operand_dtype"]) for r in recs] == \
        [(g, "ok", "bfloat16") for g in AUDIT_REGIMES]
    assert main(["audit", "--recurrence", "delta", "--impl",
                 f"{HERE / 'delta_mutants.py'}:bf16_operands", "--chunk-size", "1",
                 "--operand-dtype", "bfloat16", "--config", SMALL, "--seq", "40", "--mode",
                 "fwd_bwd", "--regime", "converged", "--repeats", "0", "--no-progress"]) == 0, \
        capsys.readouterr().out
    # a built-in kernel audited beside it keeps its own arithmetic (no operand rounding)
    recs = _audit(["scan", dm.bf16_operands], chunk_size=1, operand_dtype="bfloat16",
                  regimes="standard")
    assert [(r["impl"], r["ok"], r.get("operand_dtype")) for r in recs] == [
        ("scan", True, None), ("bf16_operands", True, "bfloat16")]
    assert max(recs[0]["reference_ratio"].values()) > 1 / tol("calibrated_ratio")
    # a claim is trusted: a float32 kernel claiming bfloat16 operands is ok, its error far
    # below that of the bfloat16-operand references its claim holds it to
    (rec,) = _audit(dm.autodiff_scan, chunk_size=1, operand_dtype="bfloat16", regimes="standard")
    assert rec["ok"] and rec["operand_dtype"] == "bfloat16"
    assert max(rec["reference_ratio"].values()) < 1 / tol("calibrated_ratio")


# which output of which default regime each mutant must fail (at least): the bug's own path
CAUGHT = {
    "decay_after_update": ("standard", "o"),
    "state_cotangent_no_projection": ("standard", "k"),
    "dbeta_without_h0": ("standard", "beta"),
    "residual_bf16": ("standard", "o"),
    "mask_with_diagonal": ("standard", "o"),
    "tail_unmasked": ("standard", "h_T"),
}


@pytest.mark.parametrize("name", list(dm.MUTANTS))
def test_every_mutant_fails_in_a_default_regime(name):
    # a bug caught on a forward output is audited forward only (a cheaper program to compile)
    forward = CAUGHT[name][1] in ("o", "h_T")
    failing = _failing(_audit(dm.MUTANTS[name], modes="fwd" if forward else "fwd_bwd"))
    assert CAUGHT[name] in failing, sorted(failing)
    if name == "dbeta_without_h0":            # exact everywhere else
        assert {n for _, n in failing} == {"beta"}, sorted(failing)


def test_check_kernel_takes_the_family_and_raises_naming_the_output():
    recs = check_kernel(dm.ZOO["scan"], framework="jax", recurrence="delta", configs=SMALL,
                        seqs=[40])
    assert {r["regime"] for r in recs} == set(AUDIT_REGIMES) and all(r["ok"] for r in recs)
    with pytest.raises(AssertionError, match=r"beta \(gradient\): calibrated tier: [\d.e+]+x"):
        check_kernel(dm.MUTANTS["dbeta_without_h0"], framework="jax", recurrence="delta",
                     configs=SMALL, seqs=[40], regimes="standard")


def test_cli_audits_the_family_end_to_end(capsys, tmp_path):
    out = tmp_path / "delta.json"
    code = main(["audit", "--recurrence", "delta", "--config", SMALL, "--seq", "40",
                 "--regime", "standard,converged", "--mode", "fwd_bwd", "--repeats", "0",
                 "--no-progress", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert " beta " in text.splitlines()[0] and "OK" in text
    report = json.loads(out.read_text())
    assert report["config"]["recurrence"] == "delta"
    recs = report["results"]
    assert len(recs) == 4 and all(r["ok"] for r in recs)
    assert {r["impl"]: r["chunk_size"] for r in recs} == {"chunked": 64, "scan": 1}


def test_cli_names_the_flag_of_an_unknown_recurrence(capsys):
    assert main(["audit", "--recurrence", "nope"]) == 2
    assert "--recurrence: got 'nope'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_the_zoo_passes_five_seeds_at_longer_lengths(seed):
    for name, kernel in dm.ZOO.items():
        for dtype in DTYPES:
            recs = _audit(kernel, seqs=(65, 130), seed=seed, dtype=dtype)
            assert not _failing(recs), (name, dtype, [r["failures"] for r in recs])


@pytest.mark.slow
@pytest.mark.parametrize("T", (512, 2048))
def test_the_built_in_kernels_pass_the_seed_configs(T):
    recs = glaref.audit(["chunked", "scan"], dict(SEED_CONFIGS), [T], recurrence="delta",
                        repeats=0, modes="fwd_bwd", regimes="standard")
    assert all(r["ok"] for r in recs), [r["failures"] for r in recs if not r["ok"]]


def test_shards_of_a_delta_audit_merge_into_the_unsharded_report(tmp_path):
    from glaref._audit._merge import merge

    paths = []
    for i in range(2):
        paths.append(tmp_path / f"s{i}.json")
        glaref.audit(["scan"], SMALL, [9], recurrence="delta", regimes="standard,converged",
                     repeats=0, modes="fwd", shard=f"{i}/2", json_path=str(paths[-1]))
    merge([str(p) for p in paths], str(tmp_path / "all.json"))
    doc = json.loads((tmp_path / "all.json").read_text())
    assert doc["config"]["recurrence"] == "delta"
    assert [r["regime"] for r in doc["results"]] == ["standard", "converged"]


def test_error_scales_past_float64_never_refuse_a_row():
    # without decay the delta rule's sums of |terms| pass 1e308 near T = 2600 (dk = 64): the
    # calibrated tier never reads them, so the row is judged, budget_ulps reported as nan
    recs = glaref.audit(["scan"], "1,1,1,64,8", [2800], modes="fwd", repeats=0,
                        recurrence="delta", regimes="gate_one")
    assert [r["ok"] for r in recs] == [True], [r.get("failures") or r.get("error") for r in recs]
    assert recs[0]["budget_ulps"]["o"] != recs[0]["budget_ulps"]["o"]      # nan


PLUGIN_TEST = """
    import sys

    import pytest

    sys.path.insert(0, {here!r})
    import delta_mutants as dm


    @pytest.mark.glaref
    def test_correct(glaref_check):
        recs = glaref_check(dm.scan, recurrence="delta", configs="1,1,2,16,8", seqs=[40])
        assert [(r["regime"], r["recurrence"], r["ok"]) for r in recs] == [
            ("standard", "delta", True), ("converged", "delta", True)]


    @pytest.mark.glaref
    def test_mutant(glaref_check):
        glaref_check(dm.state_cotangent_no_projection, recurrence="delta", configs="1,1,2,16,8",
                     seqs=[40])
"""


def test_the_pytest_plugin_checks_a_delta_kernel(pytester):
    # the fixture takes the family; --glaref-regimes takes its regimes (converged is the delta
    # rule's alone)
    pytester.makepyfile(test_delta_kernel=textwrap.dedent(PLUGIN_TEST.format(here=str(HERE))))
    result = pytester.runpytest_inprocess("--strict-markers", "-p", "no:cacheprovider",
                                          "--glaref-regimes=standard,converged")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "kernel disagrees with the glaref oracle on" in out, out
    assert re.search(r"kernel fwd_bwd config \S+ .* T=40 regime standard: FAIL k:", out), out
