"""Every message about an audited row, worded from its typed record (``_records.Record``).

One builder for every face: the CLI's table (:func:`verdict`, :func:`extra_lines`) and its
summary and notes (:func:`place`), ``glaref.testing``'s AssertionErrors (:func:`describe` for
``check_kernel``; :func:`output_table` and :func:`failing_lines` for
``assert_close_to_oracle``, from the same per-output ``Output``) and its less-accurate warning
(:func:`less_accurate_lines`). Each reads the record's fields (outcomes,
ratios, tiers, mismatches, profiles, probes), never another message. The sentences an output's
verdict carries (``Output.reason``, ``Record.notes``) are the verdict's own
(``glaref._audit._verdict.assess``), quoted as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._inputs import _KIND
from ._verdict import Mismatch
from ._where import AXES

if TYPE_CHECKING:      # the records import this module to word their verdict
    from ._records import Output, Record

__all__ = ["describe", "extra_lines", "failing_lines", "figure", "label", "less_accurate_lines",
           "mismatch_line", "output_table", "place", "verdict", "where_lines"]


def figure(x) -> str:
    """A figure in messages: 4 significant digits, '-' for None."""
    return "-" if x is None else f"{x:.4g}"


def label(rec: Record, name: str) -> str:
    """An output as messages name it: a gradient with "(gradient)" after its input's name."""
    return name if name in rec.forward_names else f"{name} (gradient)"


def mismatch_line(mm: Mismatch) -> str:
    """An output's mismatched elements in words (``glaref._audit._verdict.Mismatch.line``)."""
    return mm.line()


def verdict(rec: Record) -> str:
    """A measured row's compact verdict: "ok"; "less accurate" and each such output with its ratio
    to the most accurate designs' error (x_best); or "FAIL" and each failing output with the tier
    that failed it: its ratio to the reference kernels (calibrated), "proven" (beyond the
    worst-case bound), "nan" (non-finite), "undecided" (no verdict could be reached), and each
    failing probe ("probe determinism")."""
    if rec.ok:
        if rec.outcome != "less_accurate":
            return "ok"
        less = [n for n, o in rec.outputs.items() if o.outcome == "less_accurate"]
        return "less accurate " + ",".join(f"{n}:{rec.outputs[n].reference_ratio:.3g}x"
                                           for n in less)
    parts = []
    for n in rec.failing:
        o = rec.outputs[n]
        t = o.failed_tier
        parts.append(f"{n}:{o.reference_ratio:.3g}x" if t == "calibrated" else
                     f"{n}:nan" if t == "nonfinite" else f"{n}:{t}" if t else n)
    parts += [f"probe {p.probe}" for p in rec.failed_probes]
    return "FAIL " + ",".join(parts)


def place(rec: Record) -> str:
    """Where a row ran, in one phrase: kernel, mode, config, T and regime (gate kind and packed
    offsets when not the default)."""
    where = [rec.regime] if rec.regime else []
    if rec.gate not in (None, "scalar"):
        where.append(f"{rec.gate} gates")
    if rec.cu_seqlens is not None:
        where.append(f"packed {rec.cu_seqlens}")
    reg = f" ({', '.join(where)})" if where else ""
    return f"{rec.impl} {rec.mode} {rec.config} T={rec.seq}{reg}"


def _output_lines(rec: Record, name: str, o: Output) -> list[str]:
    """A failing output's figures: its non-finite values, or its tier, ratio to the reference
    kernels, rel_err of both, budget_ulps and the proven bound, max_abs_err; then its
    mismatched elements."""
    lab = label(rec, name)
    if o.nonfinite:                 # no ratio or budget describes a non-finite output
        return [f"  {lab}: {o.nonfinite} non-finite value(s), first at "
                f"{tuple(o.nonfinite_first_index or ())}"]
    lines = [f"  {lab}: {o.failed_tier} tier: {figure(o.reference_ratio)}x the reference kernels' "
             f"error (allowed {figure(rec.allowed_ratio)}x; rel_err {figure(o.rel_err)} vs "
             f"{figure(o.reference_rel_err)}), budget_ulps {figure(o.budget_ulps)} (proven bound "
             f"{figure(o.budget_bound)}), max_abs_err {figure(o.max_abs_err)}"]
    if o.mismatch is not None:
        lines.append(f"  {lab}: {mismatch_line(o.mismatch)}")
    return lines


def where_lines(rec: Record) -> list[str]:
    """Where a failing row's errors are, from its outputs' profiles (``glaref._audit._where``) and its
    diagnosis (numpy.testing's "Mismatched elements: n / N ... first at index" in spirit): per
    failing output with a profile, the steps above the allowed band, the first and the worst,
    and the worst element's index in the row's layout; then the diagnosis."""
    lines = []
    for name in rec.failing:
        p = rec.outputs[name].where
        if not p:
            continue
        at, letters = tuple(p["worst_index"] or ()), AXES.get(name, "")[:len(p["worst_index"] or ())]
        if rec.layout == "bthd" and _KIND.get(name) != "state" and len(at) > 2:
            # the caller's layout: time before heads (the profile keeps the canonical index)
            at = (at[0], at[2], at[1]) + at[3:]
            letters = letters[0] + letters[2] + letters[1] + letters[3:]
        axes = "(" + ", ".join(letters) + ") = " if at else ""
        text = f"{name}: worst element {p['worst']:.3g} budget units at {axes}{at}"
        E, band, k = p.get("time"), p.get("time_band"), p.get("time_bin") or 1
        if E is not None and band is not None:
            above = [i for i, (e, b) in enumerate(zip(E, band)) if e > b]
            if above:
                worst = max(range(len(E)), key=lambda i: E[i])
                unit = "steps" if k == 1 else f"bins of {k} steps"
                text += (f"; {unit} above the allowed band: {len(above)} / {len(E)}, first at "
                         f"t = {above[0] * k}, worst at t = {worst * k}")
        lines.append(text)
    if rec.diagnosis:
        lines.append(f"diagnosis: {rec.diagnosis}")
    return lines


def describe(rec: Record) -> str:
    """A failing row in full: where it ran, then each failing output's figures (or why nothing
    could be measured), where its errors are and its failing probes. The one wording of
    ``glaref.testing``'s AssertionError."""
    h = rec.head
    where = (f"{rec.impl} {rec.mode} config {rec.config} "
             f"(B={h.get('batch')} G={h.get('groups')} H={h.get('heads')} dk={h.get('dk')} "
             f"dv={h.get('dv')}) T={rec.seq} regime {rec.regime}"
             + (f" gate {rec.gate}" if rec.gate not in (None, "scalar") else ""))
    if rec.error is not None:
        return f"{where}: kernel not measured: {rec.error}"
    if rec.skipped is not None:
        return f"{where}: skipped by glaref: {rec.skipped}"
    only = rec.params.get("forward_only")
    lines = [f"{where}: {verdict(rec)}" + (f" (forward only: {only})" if only else "")]
    for name in rec.failing:
        lines += _output_lines(rec, name, rec.outputs[name])
    lines += [f"  {line}" for line in where_lines(rec)]
    lines += [f"  probe {p.probe}: {p.detail}" for p in rec.failed_probes]
    return "\n".join(lines)


def extra_lines(rec: Record) -> list[str]:
    """The lines under a row of the CLI's table: its failing outputs' mismatched elements, its
    diagnosis (glaref._audit._where) and its probes' results, indented."""
    lines = [f"  {n}: {mismatch_line(o.mismatch)}" for n, o in rec.outputs.items()
             if o.mismatch is not None]
    lines += [f"  where: {rec.diagnosis}"] if rec.diagnosis else []
    lines += ["  " + p.line() for p in rec.probes or []]
    return lines


def less_accurate_lines(rec: Record) -> list[str]:
    """One line per less accurate output of a passing row: where it ran and the verdict's reason
    (its x_best, the design that explains it, the declaration that would sharpen it)."""
    return [f"  {rec.impl} {rec.mode} T={rec.seq} ({rec.regime}): {rec.outputs[n].reason}"
            for n in rec.less_accurate]


def output_table(outputs: dict[str, Output], allowed_ratio: float, worst: dict,
                 skipped: list[str], unjudged: list[str]) -> list[str]:
    """The per-output table of ``glaref.testing.assert_close_to_oracle``'s message: each judged
    output's verdict, ratio to the reference kernels, rel_err of both, budget_ulps and the proven
    bound, max_abs_err and ``worst``'s index of it, non-finite values; then the outputs not
    computed and those not judged."""
    head = ("output", "verdict", "x_ref", "allowed", "rel_err", "ref_rel_err", "budget_ulps",
            "proven_bound", "max_abs_err", "at", "non-finite")
    rows = [head]
    for name, o in outputs.items():
        nonfinite = "-" if not o.nonfinite else \
            f"{o.nonfinite}, first at {tuple(o.nonfinite_first_index)}"
        at = worst.get(name)
        rows.append((name, "ok" if o.ok else f"FAIL {o.failed_tier}", figure(o.reference_ratio),
                     figure(allowed_ratio), figure(o.rel_err), figure(o.reference_rel_err),
                     figure(o.budget_ulps), figure(o.budget_bound), figure(o.max_abs_err),
                     "-" if at is None else str(at), nonfinite))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if skipped:
        lines.append(f"  not computed (skipped): {', '.join(skipped)}")
    if unjudged:
        lines.append(f"  not judged: {', '.join(unjudged)} (dlog_alpha summed over batch and time, "
                     "e.g. FLA's dg_gamma: the verdict judges dlog_alpha itself)")
    return lines


def failing_lines(outputs: dict[str, Output]) -> list[str]:
    """The failing outputs' reasons (the verdict's sentences), then their mismatched elements."""
    failing = {n: o for n, o in outputs.items() if not o.ok}
    return ([f"  {o.reason}" for o in failing.values()]
            + [f"  {n}: {mismatch_line(o.mismatch)}" for n, o in failing.items()
               if o.mismatch is not None])
