"""The gated delta rule under audit (``--recurrence delta``, ``recurrence="delta"``): a zoo of
correct kernels passes every default regime, every mutant of ``delta_mutants`` fails one, and the
CLI runs the family end to end. Sweeps (seeds, the seed configs at T = 512 and 2048) under
``-m slow``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

import glaref  # noqa: E402
from glaref._audit import _args  # noqa: E402
from glaref._audit._presets import SEED_CONFIGS  # noqa: E402
from glaref.cli import main  # noqa: E402
from glaref.delta._family import AUDIT_REGIMES, DELTA  # noqa: E402
from glaref.testing import check_kernel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import delta_mutants as dm  # noqa: E402

SMALL = "1,1,2,16,8"                   # B, G, H, dk, dv: two heads sharing q, k (G < H)
# T = 40 in the default suite: not a multiple of any chunk, so the last chunk is partial
REGIMES = ",".join(AUDIT_REGIMES)
FAST = dict(modes="fwd_bwd", repeats=0, recurrence="delta", regimes=REGIMES)


def _audit(kernel, seqs=(40,), configs=SMALL, **over):
    return glaref.audit([kernel], configs, list(seqs), **{**FAST, **over})


def _failing(records):
    return {(r["regime"], n) for r in records if r["ok"] is False for n in r["failed_tier"]}


def test_the_family_plugs_in_by_name_and_its_options_are_checked_once():
    assert _args.family("delta") is DELTA and _args.family("scalar_gate").name == "scalar_gate"
    with pytest.raises(glaref.ClaimError, match="recurrence: got 'nope'"):
        glaref.audit(["scan"], SMALL, [5], recurrence="nope")
    with pytest.raises(glaref.AuditUsageError, match="regime: got 'near_one'"):
        glaref.audit(["scan"], SMALL, [5], recurrence="delta", regimes="near_one")


@pytest.mark.parametrize("name", list(dm.ZOO))
def test_a_correct_kernel_passes_every_default_regime(name):
    recs = _audit(dm.ZOO[name])
    assert len(recs) == len(AUDIT_REGIMES)
    assert not _failing(recs), [r["failures"] for r in recs]
    for r in recs:       # every output and gradient judged, beta's included, and a header key
        assert set(r["reference_ratio"]) == {"o", "h_T", "q", "k", "v", "beta", "log_alpha", "h0"}
        assert r["recurrence"] == "delta" and r["budget_bound"]["beta"] == float("inf")


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


def test_bfloat16_inputs_accumulating_in_float32_pass():
    recs = _audit(dm.ZOO["chunked_C32"], dtype="bfloat16")
    assert not _failing(recs), [r["failures"] for r in recs]
    assert {r["dtype"] for r in recs} == {"bfloat16"}


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
    failing = _failing(_audit(dm.MUTANTS[name]))
    assert CAUGHT[name] in failing, sorted(failing)
    if name == "dbeta_without_h0":            # exact everywhere else
        assert {n for _, n in failing} == {"beta"}, sorted(failing)


def test_check_kernel_takes_the_family_and_raises_naming_the_output():
    recs = check_kernel(dm.ZOO["scan"], framework="jax", recurrence="delta", configs=SMALL,
                        seqs=[33])
    assert {r["regime"] for r in recs} == set(AUDIT_REGIMES) and all(r["ok"] for r in recs)
    with pytest.raises(AssertionError, match=r"beta \(gradient\): calibrated tier: [\d.e+]+x"):
        check_kernel(dm.MUTANTS["dbeta_without_h0"], framework="jax", recurrence="delta",
                     configs=SMALL, seqs=[33], regimes="standard")


def test_cli_audits_the_family_end_to_end(capsys, tmp_path):
    out = tmp_path / "delta.json"
    code = main(["audit", "--recurrence", "delta", "--config", SMALL, "--seq", "40",
                 "--regime", "standard,converged", "--repeats", "0", "--no-progress",
                 "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert " beta " in text.splitlines()[0] and "OK" in text
    report = json.loads(out.read_text())
    assert report["config"]["recurrence"] == "delta"
    recs = report["results"]
    assert len(recs) == 8 and all(r["ok"] for r in recs)
    assert {r["impl"]: r["chunk_size"] for r in recs} == {"chunked": 64, "scan": 1}


def test_cli_names_the_flag_of_an_unknown_recurrence(capsys):
    assert main(["audit", "--recurrence", "nope"]) == 2
    assert "--recurrence: got 'nope'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_the_zoo_passes_five_seeds(seed):
    for name, kernel in dm.ZOO.items():
        for dtype in ("float32", "bfloat16"):
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
