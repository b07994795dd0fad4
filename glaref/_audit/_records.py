"""One record per row, in the seed report's format: the one place a row's keys are written.

:func:`record` turns what a runner measured (``_runners.Measured``) into the row's record: the
seed report's keys, the verdict's figures per output (``glaref._judge.assess_outputs``) and the
row's parameters (``RECORD_ADDITIONS`` of ``_report``). A row without figures is either a failure
(the kernel raised, with its ``traceback``, or returned the wrong structure: ``ok`` false, the
reason under ``error`` and in ``failures``) or a row glaref declined (its memory guard: ``ok``
null, the reason under the seed's ``skipped`` key, which no failure uses). :func:`header` writes
the report's configuration as run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from .. import _judge, _metrics, _where
from .._claims import Claims
from .._inputs import Dims
from ..tolerances import tol
from . import _report
from ._args import Rows
from ._runners import Measured
from ._subjects import Subject

__all__ = ["Where", "add_probes", "declined", "header", "record"]


@dataclass(frozen=True)
class Where:
    """The row's problem: its config's name, sizes and regime."""

    config: str
    dims: Dims
    regime: str


def _base(subject: Subject, mode: str, where: Where) -> dict[str, Any]:
    d = where.dims
    return {"impl": subject.name, "mode": mode, "config": where.config, "batch": d.B,
            "groups": d.G, "heads": d.H, "seq": d.T, "dk": d.dk, "dv": d.dv}


def _params(c: Claims, where: Where, rows: Rows, final: bool | None, runner: dict[str, Any],
            cu_seqlens) -> dict[str, Any]:
    """The row's parameters: what the kernel was judged as (its claims), where it ran, and the
    runner's own keys (precision; framework, operand_dtype and forward_only for torch and NumPy)."""
    out = {"dtype": c.dtype, "compute_dtype": c.compute_dtype, "precision": runner["precision"],
           "layout": c.layout, "regime": where.regime, "seed": rows.seed, "scale": rows.scale,
           "final_state": final, "chunk_size": c.chunk_size, "accumulate_dtype": c.accumulate_dtype}
    if "operand_dtype" in runner:
        out["operand_dtype"] = runner["operand_dtype"]
    out["dlog_alpha_form"] = c.dlog_alpha_form
    out.update({k: runner[k] for k in ("framework", "forward_only") if k in runner})
    out["gate"] = c.gate
    out["cu_seqlens"] = None if cu_seqlens is None else [int(x) for x in cu_seqlens]
    out.update(rows.family.header)         # the recurrence, for families other than the default
    return out


def declined(subject: Subject, mode: str, where: Where, rows: Rows, reason: str,
             runner: dict[str, Any]) -> dict[str, Any]:
    """A row glaref does not run (the oracle's memory guard): skipped, with the reason."""
    return {**_base(subject, mode, where), "skipped": reason,
            **_params(subject.claims, where, rows, None, runner, None), "ok": None}


def _worst(values: Iterable[float]) -> float:
    vals = list(values)
    if any(v is None or math.isnan(v) for v in vals):
        return math.nan
    return max(vals) if vals else math.nan


def record(subject: Subject, where: Where, rows: Rows, truth: _judge.Truth,
           m: Measured) -> dict[str, Any]:
    """The record of one measured row (module docstring)."""
    rec = _base(subject, m.mode, where)
    params = _params(subject.claims, where, rows, m.final, m.params, truth.p.cu_seqlens)
    if m.failure is not None:
        if m.declined:
            rec.update({"skipped": m.failure, **m.fields, **params, "ok": None})
        else:
            rec.update({"error": m.failure, **m.fields, **params, "ok": False,
                        "failures": [m.failure]})
            if m.traceback:
                rec["traceback"] = m.traceback
        rec.update({"where": {}, "diagnosis": None, "probes": None})
        return rec
    truth = m.truth or truth
    final, layout = bool(m.final), subject.claims.layout
    judge = rows.family.judge               # the recurrence family's verdict (_family.Judge)
    per = judge.assess_outputs(truth, m.values, m.dtypes, final=final,
                               grads=m.mode == "fwd_bwd", claims=subject.claims)
    judge.locate_nonfinite(per, m.values, layout)   # the first bad index in the caller's layout
    direct: dict[str, Any] = {}
    if judge.direct_log_alpha and "log_alpha" in per:   # the direct form's beside the identity's
        direct["log_alpha"] = _metrics.budget_ulps(
            "log_alpha", m.values["log_alpha"], truth.reference("log_alpha", final),
            truth.scales(final, True)["log_alpha"], subject.claims.compute_dtype,
            truth.budget_view()[0])[0]
    failures = [a.reason for a in per.values() if not a.ok]
    rec.update(m.fields)
    rec["rel_err"] = _worst(a.rel_err for a in per.values())
    if m.mode == "fwd_bwd":
        rec["rel_err_grads"] = {n: per[n].rel_err for n in rows.family.grads if n in per}
    rec["rel_err_out"] = {n: per[n].rel_err for n in rows.family.outputs if n in per}
    rec["max_abs_err"] = {n: a.max_abs_err for n, a in per.items()}
    rec["reference_rel_err"] = {n: a.baseline_rel_err for n, a in per.items()}
    rec["reference_ratio"] = {n: a.ratio for n, a in per.items()}
    rec["allowed_ratio"] = tol("calibrated_ratio")
    rec["budget_ulps"] = {n: a.budget_ulps for n, a in per.items()}
    rec["budget_bound"] = {n: a.bound for n, a in per.items()}
    rec["budget_ulps_direct"] = direct
    rec["nonfinite"] = {n: a.nonfinite for n, a in per.items()}
    rec["nonfinite_first_index"] = {n: a.first_nonfinite for n, a in per.items() if a.nonfinite}
    # numpy.testing's "mismatched elements: n / N" per failing output, indices in the caller's layout
    rec["mismatched"] = {n: mm.summary() for n, mm in judge.mismatches(
        truth, per, m.values, final=final, grads=m.mode == "fwd_bwd", claims=subject.claims,
        layout=layout).items()}
    rec.update(params)
    rec["ok"] = not failures
    rec["failed_tier"] = {n: a.failed_tier for n, a in per.items() if not a.ok}
    rec["failures"] = failures
    rec["notes"] = [note for a in per.values() for note in a.notes]
    # the three outcomes (glaref._verdict.Assessment.outcome): the less accurate outputs' reasons
    # (their x_best, the design that explains them, the declaration that sharpens the verdict)
    # join the notes, so the table and the testing API show them
    rec["outcomes"] = {n: a.outcome for n, a in per.items()}
    rec["x_best"] = {n: a.x_best for n, a in per.items()}
    rec["envelope_ratio"] = {n: a.envelope_ratio for n, a in per.items()}
    less = [n for n, a in per.items() if a.outcome == "less_accurate" and a.ok]
    rec["notes"] += [per[n].reason for n in less]
    rec["outcome"] = "fail" if failures else ("less_accurate" if less else "ok")
    rec["verdict"] = _report.verdict(rec)
    # where the error is (glaref._where): every output's profile, the failing ones' in full
    profiles = {} if judge.row_profiles is None else judge.row_profiles(
        truth, m.values, m.dtypes, final=final, grads=m.mode == "fwd_bwd", claims=subject.claims)
    failing = [n for n, a in per.items() if not a.ok]
    rec["where"] = {n: p.summary(full=n in failing) for n, p in profiles.items()}
    rec["diagnosis"] = _where.diagnose(profiles, failing)[0] if profiles else None
    rec["probes"] = None
    # the oracle's own time on these inputs (never part of the kernel's figures)
    wanted = ["forward", "scales", "reference_scan", "reference_chunked"] if m.mode == "fwd" else \
        ["forward", "vjp_dh_T" if final else "vjp", "scales_vjp", "reference_scan_vjp",
         "reference_chunked_vjp"]
    rec["oracle_ms"] = {k: truth.ms[k] for k in wanted if k in truth.ms}
    return rec


def add_probes(rec: dict[str, Any], results) -> dict[str, Any]:
    """The probes' results (``glaref._probes.ProbeResult``) into a measured row's record: under
    ``probes``, and each failing one among its failures (the row fails)."""
    rec["probes"] = [r.summary() for r in results]
    bad = [r for r in results if r.passed is False]
    if bad and "rel_err" in rec:            # a measured row (probes run on no other)
        rec["failures"] = rec.get("failures", []) + [f"probe {r.probe}: {r.detail}" for r in bad]
        rec["failed_tier"] = {**rec.get("failed_tier", {}),
                              **{f"probe {r.probe}": "probe" for r in bad}}
        rec["ok"] = False
        rec["verdict"] = _report.verdict(rec)
    return rec


def header(platform: str, *, preset: str, rows: Rows, impls: list[str], repeats: int,
           claims: Claims, precision: str) -> dict[str, Any]:
    """The report's "config": the audit as run (``claims`` as the caller gave them, before a
    compute dtype resolved them; ``shard`` only in a shard's report, which ``glaref report merge``
    joins)."""
    shard = {} if rows.shard is None else {"shard": f"{rows.shard[0]}/{rows.shard[1]}"}
    return {"device": platform, "configs": {k: list(v) for k, v in rows.configs.items()},
            "seq_lens": rows.seqs, "impls": impls, "repeats": repeats, "modes": rows.modes,
            "dtype": claims.dtype, "layout": claims.layout, "scale": rows.scale,
            "seed": rows.seed, "regimes": rows.regimes, "oracle": rows.oracle, "preset": preset,
            "chunk_size": claims.chunk_size, "accumulate_dtype": claims.accumulate_dtype,
            "dlog_alpha_form": claims.dlog_alpha_form, "gate": claims.gate,
            "precision": precision, "cu_seqlens": rows.cu_seqlens(), **rows.family.header,
            **shard}
