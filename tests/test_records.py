"""The typed record (``glaref._audit._records.Record``): its JSON form is the seed report's, read
back whole; the messages come from its fields; usage errors name their argument as data."""

from __future__ import annotations

import pytest

import glaref
from glaref._audit import _args
from glaref._audit._messages import describe, verdict
from glaref._audit._records import Record
from glaref._audit._report import jsonable, summary
from glaref._errors import AuditUsageError, ClaimError, GlarefError, SeqlensError
from glaref.cli import main


def test_usage_errors_carry_their_argument_and_the_cli_shows_its_flag(capsys):
    assert main(["audit", "--cu-seqlens", "0,5,3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glaref audit: error: --cu-seqlens: got [0, 5, 3], expected "
                          "nondecreasing offsets"), err
    assert main(["audit", "--cu-seqlens", "1,5,9"]) == 2
    assert "error: --cu-seqlens: got [1, 5, 9]" in capsys.readouterr().err
    # the argument travels as data: the message is untouched, a face renames only the argument
    exc = SeqlensError("cu_seqlens: got [1], expected two offsets or more", argument="cu_seqlens")
    assert exc.argument == "cu_seqlens" and str(exc).startswith("cu_seqlens: got")
    assert exc.worded({"cu_seqlens": "--cu-seqlens"}) == \
        "--cu-seqlens: got [1], expected two offsets or more"
    assert GlarefError("no argument here").worded({"no": "--no"}) == "no argument here"
    claim = ClaimError("chunk_size", "got 0, expected a positive integer")
    assert (claim.argument, claim.detail) == ("chunk_size", "got 0, expected a positive integer")
    assert claim.worded({"chunk_size": "--chunk-size"}).startswith("--chunk-size: got 0")
    with pytest.raises(AuditUsageError) as e:
        _args.parse_shard("3/2")
    assert e.value.argument == "shard"


def _measured(**over):
    """A measured record's JSON form by hand: o passes, q fails its calibrated tier."""
    d = {"impl": "k", "mode": "fwd_bwd", "config": "tiny", "batch": 1, "groups": 1, "heads": 2,
         "seq": 9, "dk": 8, "dv": 4, "rel_err_grads": {"q": 0.5}, "rel_err_out": {"o": 1e-7},
         "max_abs_err": {"o": 1e-7, "q": 0.25}, "reference_rel_err": {"o": 1e-7, "q": 1e-7},
         "reference_ratio": {"o": 1.0, "q": 5e6}, "allowed_ratio": 6.0,
         "budget_ulps": {"o": 1.0, "q": 1e6}, "budget_bound": {"o": 10.0, "q": 10.0},
         "nonfinite": {"o": 0, "q": 0}, "layout": "bhtd", "regime": "standard", "ok": False,
         "failed_tier": {"q": "calibrated"}, "failures": ["q: 5e+06x the error (made up)"],
         "notes": [], "outcomes": {"o": "ok", "q": "fail"}, "where": {}, "diagnosis": None,
         "probes": [{"probe": "determinism", "passed": False, "detail": "differs"}]}
    d.update(over)
    return d


def test_the_verdict_and_the_messages_come_from_the_typed_fields():
    rec = Record.from_json(_measured())
    assert rec.failing == ["q"] and rec.ok is False and rec.outcome == "fail"
    assert rec.outputs["q"].reason == "q: 5e+06x the error (made up)"
    # the failing probe fails the row beside q, in the verdict and the failures
    assert verdict(rec) == "FAIL q:5e+06x,probe determinism"
    assert rec.failures == ["q: 5e+06x the error (made up)", "probe determinism: differs"]
    text = describe(rec)
    assert text.splitlines()[0] == ("k fwd_bwd config tiny (B=1 G=1 H=2 dk=8 dv=4) T=9 regime "
                                    "standard: FAIL q:5e+06x,probe determinism")
    assert "  q (gradient): calibrated tier: 5e+06x the reference kernels' error (allowed 6x" in text
    assert text.endswith("  probe determinism: differs")
    code, line = summary([rec])
    assert code == 1 and "(first: k fwd_bwd tiny T=9 (standard): q: 5e+06x the error" in line


def test_a_failing_probe_makes_the_row_fail_though_every_output_passes():
    # the outcome is the row's: a probe failure is a failure like an output's
    rec = Record.from_json(_measured(rel_err_grads={"q": 1e-7}, reference_ratio={"o": 1.0, "q": 1.0},
                                     failed_tier={}, failures=["probe determinism: differs"],
                                     outcomes={"o": "ok", "q": "ok"}))
    assert rec.failing == [] and rec.failed_probes and rec.ok is False
    assert rec.outcome == "fail" and rec.to_json()["outcome"] == "fail"
    assert Record.from_json(_measured(probes=None, outcomes={"o": "ok", "q": "ok"},
                                      failed_tier={})).outcome == "ok"


def test_a_record_reads_back_from_its_json_form_whole():
    # a less accurate output's reason closes the notes; a failing one's opens the failures
    less = _measured(rel_err_grads={"q": 1e-6}, reference_ratio={"o": 1.0, "q": 9.0},
                     ok=True, failed_tier={}, failures=[], probes=None,
                     notes=["o: chunk structure unknown (made up)", "q: less accurate (made up)"],
                     outcomes={"o": "ok", "q": "less_accurate"}, x_best={"o": 1.0, "q": 9.0})
    rec = Record.from_json(less)
    assert rec.ok and rec.outcome == "less_accurate" and rec.less_accurate == ["q"]
    assert rec.notes == ["o: chunk structure unknown (made up)"]
    assert rec.outputs["q"].reason == "q: less accurate (made up)"
    assert verdict(rec) == "less accurate q:9x"
    again = jsonable(Record.from_json(rec.to_json()).to_json())
    assert again == jsonable(rec.to_json())
    assert again["notes"] == less["notes"] and again["verdict"] == "less accurate q:9x"
    # rows without figures: a kernel that raised, a row glaref declined
    raised = {"impl": "k", "mode": "fwd", "config": "tiny", "seq": 9, "error": "kernel raised X",
              "ok": False, "failures": ["kernel raised X"], "traceback": "tb", "where": {},
              "diagnosis": None, "probes": None}
    assert jsonable(Record.from_json(raised).to_json()) == raised
    skipped = {"impl": "k", "mode": "fwd", "config": "tiny", "seq": 9, "skipped": "no memory",
               "ok": None}
    assert Record.from_json(skipped).to_json() == skipped


@pytest.mark.jax
def test_audited_records_read_back_whole():
    pytest.importorskip("jax")
    import audit_kernels as ak

    recs = glaref.audit([ak.wrong_kernel, ak.raising_kernel, ak.scan_kernel], "1,1,2,8,4", [9],
                        regimes="standard", repeats=0, oracle_impl="numpy", probes="determinism")
    assert {r["ok"] for r in recs} == {True, False}
    for r in recs:
        assert jsonable(Record.from_json(r).to_json()) == jsonable(r), r["impl"]
