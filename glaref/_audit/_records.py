"""One typed record per row (:class:`Record`), written in the seed report's format by
:meth:`Record.to_json`: the one place a row's keys are written.

:func:`record` turns what a runner measured (``_runners.Measured``) into the row's record: the
seed report's keys (``head``, the runner's ``figures``), the verdict's figures per output
(:class:`Output`, from ``glaref.gla._judge.assess_outputs``) and the row's parameters (``params``,
``RECORD_ADDITIONS`` of ``_report``). A row without figures is either a failure (the kernel
raised, with its ``traceback``, or returned the wrong structure: ``ok`` false, the reason under
``error`` and in ``failures``) or a row glaref declined (its memory guard: ``ok`` null, the reason
under the seed's ``skipped`` key, which no failure uses). What is derived (``ok``, ``failures``,
``failed_tier``, the outcome, the verdict) is computed from the typed fields, never stored twice;
every message about a row is worded from them (``_messages``). :meth:`Record.from_json` reads a
record back from its JSON form (a report file, a merged report). :func:`header` writes the
report's configuration as run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .._inputs import Dims
from ..tolerances import tol
from . import _messages, _metrics, _where
from ._args import Rows
from ._claims import Claims
from ._family import Truth
from ._probes import ProbeResult
from ._runners import Measured
from ._subjects import Subject
from ._verdict import Assessment, Mismatch

__all__ = ["Output", "Record", "Where", "add_probes", "as_record", "declined", "header",
           "record"]


@dataclass(frozen=True)
class Where:
    """The row's problem: its config's name, sizes and regime."""

    config: str
    dims: Dims
    regime: str


@dataclass
class Output:
    """One output's (or gradient's) figures and verdict in a record (``glaref._audit._verdict.Assessment``
    as the report keeps it): the normwise ``rel_err`` and ``max_abs_err`` against the oracle; the
    calibrated tier (``reference_rel_err`` of the reference kernels, ``reference_ratio``: x_best,
    ``envelope_ratio`` over the field's correct designs); the proven tier (``budget_ulps`` within
    ``budget_bound``);
    ``nonfinite`` values and the first one's index; ``failed_tier`` (None: passed) and
    ``outcome`` ("ok", "less_accurate", "fail"); the verdict's sentence ``reason``; and for a
    failing output its ``mismatch`` (elements beyond the bound) and for every output its error
    profile ``where`` (``glaref._audit._where``)."""

    rel_err: float | None
    max_abs_err: float | None
    reference_rel_err: float | None
    reference_ratio: float | None
    envelope_ratio: float | None
    budget_ulps: float | None
    budget_bound: float | None
    nonfinite: int = 0
    nonfinite_first_index: list[int] | None = None
    failed_tier: str | None = None
    outcome: str = "ok"
    reason: str = ""
    mismatch: Mismatch | None = None
    where: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.failed_tier is None

    @classmethod
    def of(cls, a: Assessment, **more: Any) -> Output:
        """The record's view of an Assessment (``more``: mismatch, where)."""
        return cls(a.rel_err, a.max_abs_err, a.baseline_rel_err, a.ratio, a.envelope_ratio,
                   a.budget_ulps, a.bound, nonfinite=a.nonfinite,
                   nonfinite_first_index=a.first_nonfinite if a.nonfinite else None,
                   failed_tier=a.failed_tier, outcome=a.outcome, reason=a.reason, **more)


# the record's keys of the row (the seed's) and of its parameters, in the order they are written
HEAD = ("impl", "mode", "config", "batch", "groups", "heads", "seq", "dk", "dv")
PARAMS = ("dtype", "compute_dtype", "precision", "layout", "regime", "seed", "scale",
          "final_state", "chunk_size", "accumulate_dtype", "operand_dtype", "dlog_alpha_form",
          "framework", "forward_only", "gate", "cu_seqlens")
# the keys a record derives from its typed fields (never read back: recomputed)
_DERIVED = ("ok", "failures", "failed_tier", "outcome", "verdict", "rel_err", "outcomes",
            "x_best")
_OUTPUT_KEYS = ("rel_err_out", "rel_err_grads", "max_abs_err", "reference_rel_err",
                "reference_ratio", "allowed_ratio", "budget_ulps", "budget_bound",
                "budget_ulps_direct", "nonfinite", "nonfinite_first_index", "mismatched",
                "envelope_ratio", "where", "diagnosis", "probes", "notes", "oracle_ms", "error",
                "traceback", "skipped")


def _worst(values: list[float | None]) -> float:
    if any(v is None or math.isnan(v) for v in values):
        return math.nan
    return max(values) if values else math.nan


@dataclass
class Record:
    """One audited row: what ran (``head``: the seed's keys impl .. dv; ``params``: the row's
    parameters), the runner's measured ``figures`` (timing, XLA memory), and either the verdict
    per output (``outputs``, in the family's order; ``forward_names`` and ``grad_names`` the
    family's names, ``grad_names`` None for a forward row) or why nothing was judged (``error``,
    with the kernel's ``traceback``; ``skipped``). ``notes``: where the verdict is looser than a
    declaration would make it; ``probes``: the probes' results (None: none ran); ``diagnosis``:
    the pattern of a failing row's errors; ``oracle_ms``: the oracle's own times; ``located``:
    the record carries its where/diagnosis/probes keys (every row but one declined before it
    ran)."""

    head: dict[str, Any]
    params: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Output] = field(default_factory=dict)
    forward_names: tuple[str, ...] = ()
    grad_names: tuple[str, ...] | None = None
    allowed_ratio: float | None = None
    budget_ulps_direct: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    traceback: str | None = None
    skipped: str | None = None
    probes: list[ProbeResult] | None = None
    diagnosis: str | None = None
    oracle_ms: dict[str, float] | None = None
    located: bool = True

    # ---- what ran
    impl = property(lambda self: self.head.get("impl"))
    mode = property(lambda self: self.head.get("mode"))
    config = property(lambda self: self.head.get("config"))
    seq = property(lambda self: self.head.get("seq"))
    regime = property(lambda self: self.params.get("regime"))
    layout = property(lambda self: self.params.get("layout", "bhtd"))
    gate = property(lambda self: self.params.get("gate"))
    cu_seqlens = property(lambda self: self.params.get("cu_seqlens"))

    # ---- the verdict, derived
    @property
    def measured(self) -> bool:
        """The row has figures: neither a failure before any nor a row glaref declined."""
        return self.error is None and self.skipped is None

    @property
    def failing(self) -> list[str]:
        """The outputs that failed their verdict, in order."""
        return [n for n, o in self.outputs.items() if not o.ok]

    @property
    def failed_probes(self) -> list[ProbeResult]:
        return [p for p in self.probes or [] if p.passed is False]

    @property
    def less_accurate(self) -> list[str]:
        """The outputs less accurate than the most accurate designs that still pass."""
        return [n for n, o in self.outputs.items() if o.outcome == "less_accurate" and o.ok]

    @property
    def ok(self) -> bool | None:
        """True within the verdict, False failed, None declined by glaref."""
        if self.skipped is not None:
            return None
        return self.error is None and not self.failing and not self.failed_probes

    @property
    def failures(self) -> list[str]:
        """Why the row failed: the kernel's error, or each failing output's reason and each
        failing probe."""
        if self.error is not None:
            return [self.error]
        return ([self.outputs[n].reason for n in self.failing]
                + [f"probe {p.probe}: {p.detail}" for p in self.failed_probes])

    @property
    def outcome(self) -> str:
        """The row's worst outcome: "fail" (a failing output, a failing probe or the kernel's
        error), else "less_accurate" or "ok"."""
        if self.failing or self.failed_probes or self.error is not None:
            return "fail"
        return "less_accurate" if self.less_accurate else "ok"

    # ---- the JSON form
    def to_json(self) -> dict[str, Any]:
        """The record in the seed report's format plus ``RECORD_ADDITIONS``, as ``glaref.audit``
        returns it and the JSON report keeps it."""
        d = dict(self.head)
        if not self.measured:
            if self.skipped is not None:
                d.update({"skipped": self.skipped, **self.figures, **self.params, "ok": None})
            else:
                d.update({"error": self.error, **self.figures, **self.params, "ok": False,
                          "failures": [self.error]})
                if self.traceback:
                    d["traceback"] = self.traceback
            if self.located:
                d.update({"where": {}, "diagnosis": None, "probes": None})
            return d
        out = self.outputs
        d.update(self.figures)
        d["rel_err"] = _worst([o.rel_err for o in out.values()])
        if self.grad_names is not None:
            d["rel_err_grads"] = {n: out[n].rel_err for n in self.grad_names if n in out}
        d["rel_err_out"] = {n: out[n].rel_err for n in self.forward_names if n in out}
        d["max_abs_err"] = {n: o.max_abs_err for n, o in out.items()}
        d["reference_rel_err"] = {n: o.reference_rel_err for n, o in out.items()}
        d["reference_ratio"] = {n: o.reference_ratio for n, o in out.items()}
        d["allowed_ratio"] = self.allowed_ratio
        d["budget_ulps"] = {n: o.budget_ulps for n, o in out.items()}
        d["budget_bound"] = {n: o.budget_bound for n, o in out.items()}
        d["budget_ulps_direct"] = dict(self.budget_ulps_direct)
        d["nonfinite"] = {n: o.nonfinite for n, o in out.items()}
        d["nonfinite_first_index"] = {n: o.nonfinite_first_index for n, o in out.items()
                                      if o.nonfinite}
        d["mismatched"] = {n: o.mismatch.summary() for n, o in out.items()
                           if o.mismatch is not None}
        d.update(self.params)
        d["ok"] = self.ok
        d["failed_tier"] = {**{n: out[n].failed_tier for n in self.failing},
                            **{f"probe {p.probe}": "probe" for p in self.failed_probes}}
        d["failures"] = self.failures
        # the less accurate outputs' reasons (their x_best, the design that explains them, the
        # declaration that sharpens the verdict) join the notes
        d["notes"] = self.notes + [out[n].reason for n in self.less_accurate]
        d["outcomes"] = {n: o.outcome for n, o in out.items()}
        d["x_best"] = {n: o.reference_ratio for n, o in out.items()}   # over the best designs
        d["envelope_ratio"] = {n: o.envelope_ratio for n, o in out.items()}
        d["outcome"] = self.outcome
        d["verdict"] = _messages.verdict(self)
        d["where"] = {n: o.where for n, o in out.items() if o.where is not None}
        d["diagnosis"] = self.diagnosis
        d["probes"] = None if self.probes is None else [p.summary() for p in self.probes]
        d["oracle_ms"] = self.oracle_ms
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Record:
        """The record of its JSON form (:meth:`to_json`'s, a report file's; keys it lacks are
        absent figures). The figures per output are read back by their output's name; the
        verdict's sentences by position (``failures`` lists the failing outputs' reasons in
        order, ``notes`` ends with the less accurate outputs' reasons)."""
        def g(key: str) -> dict:
            return d.get(key) or {}

        fwd, grads = g("rel_err_out"), d.get("rel_err_grads")
        measured = "error" not in d and "skipped" not in d
        names = list(dict.fromkeys([*g("max_abs_err"), *fwd, *(grads or {}), *g("budget_ulps"),
                                    *g("reference_ratio"), *g("failed_tier")])) if measured else []
        tiers = {n: t for n, t in g("failed_tier").items() if t != "probe"}
        reasons = dict(zip(tiers, d.get("failures") or [])) if measured else {}
        outcomes = g("outcomes")
        less = [n for n in names if outcomes.get(n) == "less_accurate" and n not in tiers]
        notes = list(d.get("notes") or [])
        reasons.update(zip(less, notes[len(notes) - len(less):]))
        rel, mm = {**fwd, **(grads or {})}, g("mismatched")
        outputs = {n: Output(
            rel.get(n), g("max_abs_err").get(n), g("reference_rel_err").get(n),
            g("reference_ratio").get(n), g("envelope_ratio").get(n), g("budget_ulps").get(n),
            g("budget_bound").get(n), nonfinite=g("nonfinite").get(n) or 0,
            nonfinite_first_index=g("nonfinite_first_index").get(n), failed_tier=tiers.get(n),
            outcome=outcomes.get(n, "fail" if n in tiers else "ok"), reason=reasons.get(n, ""),
            mismatch=_mismatch(mm.get(n), d.get("layout", "bhtd")), where=g("where").get(n))
            for n in names}
        known = set(HEAD) | set(PARAMS) | set(_DERIVED) | set(_OUTPUT_KEYS)
        probes = d.get("probes")
        return cls(
            head={k: d[k] for k in HEAD if k in d}, params={k: d[k] for k in PARAMS if k in d},
            figures={k: v for k, v in d.items() if k not in known}, outputs=outputs,
            forward_names=tuple(fwd) or tuple(n for n in names if n not in (grads or {})),
            grad_names=None if grads is None else tuple(grads),
            allowed_ratio=d.get("allowed_ratio"),
            budget_ulps_direct=dict(g("budget_ulps_direct")), notes=notes[:len(notes) - len(less)],
            error=d.get("error"), traceback=d.get("traceback"), skipped=d.get("skipped"),
            probes=None if probes is None else [ProbeResult(**p) for p in probes],
            diagnosis=d.get("diagnosis"), oracle_ms=d.get("oracle_ms"), located="where" in d)


def _mismatch(mm: Mapping[str, Any] | None, layout: str) -> Mismatch | None:
    """A record's ``mismatched`` entry of one output as the Mismatch it was written from."""
    if mm is None:
        return None
    at = None if mm["worst_index"] is None else tuple(mm["worst_index"])
    return Mismatch(mm["count"], mm["size"], mm["bound"], mm["worst"], at, layout)


def as_record(r: Record | Mapping[str, Any]) -> Record:
    """``r`` itself when it is a Record, else the Record of its JSON form."""
    return r if isinstance(r, Record) else Record.from_json(r)


def _head(subject: Subject, mode: str, where: Where) -> dict[str, Any]:
    d = where.dims
    return {"impl": subject.name, "mode": mode, "config": where.config, "batch": d.B,
            "groups": d.G, "heads": d.H, "seq": d.T, "dk": d.dk, "dv": d.dv}


def _params(c: Claims, where: Where, rows: Rows, final: bool | None, runner: dict[str, Any],
            cu_seqlens) -> dict[str, Any]:
    """The row's parameters: what the kernel was judged as (its claims), where it ran, and the
    runner's own keys (precision; framework, operand_dtype and forward_only for torch and NumPy;
    operand_dtype for a JAX kernel that claims one)."""
    out = {"dtype": c.dtype, "compute_dtype": c.compute_dtype, "precision": runner["precision"],
           "layout": c.layout, "regime": where.regime, "seed": rows.seed, "scale": rows.scale,
           "final_state": final, "chunk_size": c.chunk_size, "accumulate_dtype": c.accumulate_dtype}
    if "operand_dtype" in runner or c.operand_dtype is not None:
        out["operand_dtype"] = c.operand_dtype
    out["dlog_alpha_form"] = c.dlog_alpha_form
    out.update({k: runner[k] for k in ("framework", "forward_only") if k in runner})
    out["gate"] = c.gate
    out["cu_seqlens"] = None if cu_seqlens is None else [int(x) for x in cu_seqlens]
    out.update(rows.family.header)         # the recurrence, for families other than the default
    return out


def declined(subject: Subject, mode: str, where: Where, rows: Rows, reason: str,
             runner: dict[str, Any]) -> Record:
    """A row glaref does not run (the oracle's memory guard): skipped, with the reason."""
    return Record(_head(subject, mode, where),
                  _params(subject.claims, where, rows, None, runner, None), skipped=reason,
                  located=False)


def record(subject: Subject, where: Where, rows: Rows, truth: Truth,
           m: Measured) -> Record:
    """The record of one measured row (module docstring)."""
    head = _head(subject, m.mode, where)
    params = _params(subject.claims, where, rows, m.final, m.params, truth.p.cu_seqlens)
    if m.failure is not None:
        return Record(head, params, dict(m.fields), error=None if m.declined else m.failure,
                      skipped=m.failure if m.declined else None,
                      traceback=None if m.declined else m.traceback)
    truth = m.truth or truth
    final, layout, grads = bool(m.final), subject.claims.layout, m.mode == "fwd_bwd"
    judge = rows.family.judge               # the recurrence family's verdict (_family.Judge)
    per = judge.assess_outputs(truth, m.values, m.dtypes, final=final, grads=grads,
                               claims=subject.claims)
    judge.locate_nonfinite(per, m.values, layout)   # the first bad index in the caller's layout
    direct = {}
    if judge.direct_log_alpha and "log_alpha" in per:   # the direct form's beside the identity's
        direct["log_alpha"] = _metrics.budget_ulps(
            "log_alpha", m.values["log_alpha"], truth.reference("log_alpha", final),
            truth.scales(final, True)["log_alpha"], subject.claims.compute_dtype,
            truth.budget_view()[0])[0]
    # numpy.testing's "mismatched elements: n / N" per failing output, indices in the caller's layout
    mismatched = judge.mismatches(truth, per, m.values, final=final, grads=grads,
                                  claims=subject.claims, layout=layout)
    # where the error is (glaref._audit._where): every output's profile, the failing ones' in full
    profiles = {} if judge.row_profiles is None else judge.row_profiles(
        truth, m.values, m.dtypes, final=final, grads=grads, claims=subject.claims)
    failing = [n for n, a in per.items() if not a.ok]
    outputs = {n: Output.of(a, mismatch=mismatched.get(n),
                            where=profiles[n].summary(full=n in failing) if n in profiles else None)
               for n, a in per.items()}
    # the oracle's own time on these inputs (never part of the kernel's figures)
    wanted = ["forward", "scales", "reference_scan", "reference_chunked"] if m.mode == "fwd" else \
        ["forward", "vjp_dh_T" if final else "vjp", "scales_vjp", "reference_scan_vjp",
         "reference_chunked_vjp"]
    return Record(head, params, dict(m.fields), outputs, tuple(rows.family.outputs),
                  tuple(rows.family.grads) if grads else None, tol("calibrated_ratio"), direct,
                  notes=[note for a in per.values() for note in a.notes],
                  diagnosis=_where.diagnose(profiles, failing)[0] if profiles else None,
                  oracle_ms={k: truth.ms[k] for k in wanted if k in truth.ms})


def add_probes(rec: Record, results: list[ProbeResult]) -> Record:
    """The probes' results (``glaref._audit._probes.ProbeResult``) into a measured row's record; a failing
    one fails the row."""
    rec.probes = list(results)
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
