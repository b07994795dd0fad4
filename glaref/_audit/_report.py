"""Reports of an audit: the JSON file (the seed report's schema), the table, the plot, the verdict.

JSON: {"device": {...}, "config": {...}, "results": [record, ...]}, rewritten whole and atomically
(temporary file + rename) after every record, so an interrupted audit leaves a valid file with
every row it measured. Non-finite floats are written as null (JSON has no NaN).

Output paths (the JSON report, the plot) are checked before any work (``check_output``): not a
directory, a known extension for the plot, and a file can be created in its directory (or in the
nearest one that exists). Missing directories are created when the file is written, for both.

Rows: ``ok`` true (measured, within the bound), false (failed: a bound exceeded, a non-finite
output, or a kernel that raised or returned the wrong structure or dtype, the reason then under
``error``, with the kernel's ``traceback`` when it raised), null (skipped: glaref declined the
row, the reason in ``skipped``). Only a measured row has figures (``measured``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any, Iterable, TextIO

from .._errors import AuditEnvironmentError, AuditUsageError
from .._inputs import FORWARD, OUTPUTS
from ..tolerances import tol
from ._messages import extra_lines, place, verdict
from ._presets import coverage
from ._records import Record, as_record

# Record keys beyond the seed report's (tests hold the schema to exactly these).
RECORD_ADDITIONS = (
    "rel_err_out", "max_abs_err", "reference_rel_err", "reference_ratio", "allowed_ratio",
    "budget_ulps", "budget_bound", "budget_ulps_direct", "nonfinite", "nonfinite_first_index",
    "dtype", "compute_dtype", "precision", "layout", "regime", "seed", "scale", "final_state",
    "chunk_size", "accumulate_dtype", "dlog_alpha_form", "gate", "cu_seqlens", "ok", "failed_tier",
    "failures", "notes", "verdict", "oracle_ms", "where", "diagnosis", "probes", "outcome",
    "outcomes", "x_best", "envelope_ratio", "mismatched",
)

ERR_COLUMNS = OUTPUTS

# what --plot writes (matplotlib picks the format from the extension, and appends ".png" to a
# name without one: refused here so that the file written is the file named)
PLOT_FORMATS = ("png", "pdf", "svg")


def check_output(path, what: str, formats: tuple[str, ...] | None = None) -> str:
    """``path`` as a string, or AuditUsageError naming ``what`` when glaref could not write a
    file there: a directory, an extension not in ``formats``, or a directory where no file can be
    created (read-only, /proc, ...). Creates nothing: a missing parent directory is created when
    the file is written (``JsonWriter``, ``plot``)."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise AuditUsageError(f"{what}: got {path!r}, expected a file path", argument=what) from None
    if not isinstance(p, str) or not p:
        raise AuditUsageError(f"{what}: got {path!r}, expected a file path", argument=what)
    example = "audit." + (formats[0] if formats else "json")
    if os.path.isdir(p):
        raise AuditUsageError(f"{what}: got {p!r}, which is a directory; expected a file name "
                              f"(e.g. {os.path.join(p, example)})", argument=what)
    if formats is not None and os.path.splitext(p)[1].lower().lstrip(".") not in formats:
        raise AuditUsageError(f"{what}: got {p!r}, expected a file name ending in "
                              f"{', '.join('.' + f for f in formats)}", argument=what)
    if os.path.exists(p) and not os.path.isfile(p):
        raise AuditUsageError(f"{what}: got {p!r}, which is not a regular file", argument=what)
    # the nearest directory that exists (the missing ones are created when the file is written)
    directory = os.path.dirname(os.path.abspath(p))
    while not os.path.exists(directory):
        directory = os.path.dirname(directory)
    if not os.path.isdir(directory):
        raise AuditUsageError(f"{what}: cannot write {p!r}: {directory!r} is not a directory", argument=what)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".glaref-check-", dir=directory)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise AuditUsageError(f"{what}: cannot write {p!r}: no file can be created in "
                              f"{directory!r} ({exc.strerror or exc})", argument=what) from None
    return p


def jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):   # numpy scalars
        return jsonable(x.item())
    return x


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class JsonWriter:
    """Keeps the report and rewrites the whole file atomically after every record."""

    def __init__(self, path, header: dict[str, Any]):
        self.path = os.fspath(path)
        self.doc = {**header, "results": []}

    def add(self, record: dict[str, Any]) -> None:
        self.doc["results"].append(record)
        self.write()

    def write(self) -> None:
        try:
            self._write()
        except OSError as exc:      # the path was checked before the run: a full disk, say
            raise AuditEnvironmentError(f"json_path: writing {self.path!r} failed: {exc}",
                                        argument="json_path") from None

    def _write(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".glaref-audit-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(jsonable(self.doc), f, indent=1, allow_nan=False)
                f.write("\n")
            os.chmod(tmp, 0o666 & ~_umask())      # mkstemp's 0600 -> what open() would give
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


# ---------------------------------------------------------------- table

def _e(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if x == 0:
        return "0"
    return f"{x:.1e}"


def measured(r: dict[str, Any]) -> bool:
    """Whether a record has figures: neither a failure before any (``error``: the kernel raised or
    returned the wrong structure) nor a row glaref declined (``skipped``)."""
    return "error" not in r and "skipped" not in r


def failed_outputs(r: dict[str, Any]) -> list[str]:
    """The outputs a measured record failed on, in order (the keys of its ``failed_tier``)."""
    return list(r.get("failed_tier") or {})


def reference_used(r: Record) -> tuple[str | None, float | None]:
    """(output, ratio): the largest ratio of an output's error to the same-precision reference
    kernels' error (the calibrated tier; fails above ``allowed_ratio``)."""
    vals = [(n, o.reference_ratio) for n, o in r.outputs.items() if o.reference_ratio is not None]
    return max(vals, key=lambda nx: nx[1]) if vals else (None, None)


def bound_used(r: Record) -> float | None:
    """The largest budget_ulps / bound over a record's outputs: the share of a correct kernel's
    worst-case rounding error the kernel used (> 1 fails: the proven tier). None when nothing was
    measured or no output has a finite bound; nan when an output has non-finite values (no
    figure describes it)."""
    if any(o.nonfinite for o in r.outputs.values()):
        return math.nan
    vals = []
    for o in r.outputs.values():
        u, b = o.budget_ulps, o.budget_bound
        if u is None or b is None or math.isinf(b):
            continue
        vals.append(0.0 if u == 0 else math.inf if b == 0 else u / b)
    return max(vals) if vals else None


LEGEND = (
    "columns o .. h0: normwise relative error ||x - ref|| / ||ref|| of each output (o, h_T) and\n"
    "  gradient (q .. h0, each named by its input, as in the JSON report) against the float64\n"
    "  oracle run on the same (dtype-rounded) inputs.\n"
    "x_ref: the largest ratio, over the outputs, of the kernel's error to the error of glaref's\n"
    "  same-precision reference kernels on the same inputs (calibrated tier: fails above the\n"
    "  allowed ratio, {R:g}); the output it belongs to in brackets.\n"
    "proven: the largest budget_ulps / worst-case rounding bound (proven tier: above 1 no correct\n"
    "  kernel could have made the error; '-' where no finite bound exists).\n"
    "verdict: ok, or FAIL with each failing output and why (Nx: N times the reference error;\n"
    "  proven; nan: non-finite values).\n"
    "ms: median time per call; compile_s: jit compile time; temp_MB: XLA temporary buffers;\n"
    "  resid_MB: what the forward keeps for the backward (fwd_bwd rows)."
)


def legend() -> str:
    return LEGEND.format(R=tol("calibrated_ratio"))


IMPL_WIDTH = 40     # the table's impl column at most (the JSON keeps the full name)


def short_name(impl: str, width: int = IMPL_WIDTH) -> str:
    """A kernel's name as the table and the plot show it: a file-path kernel
    (``path/to/file.py:fn``) as its file's stem and function (``file:fn``); then, when still
    longer than ``width``, its last ``width - 3`` characters after "...". The JSON report and the
    messages keep the full name."""
    head, sep, fn = impl.rpartition(":")
    if sep and (head.endswith(".py") or "/" in head or os.sep in head):
        impl = f"{os.path.splitext(os.path.basename(head))[0]}:{fn}"
    return impl if len(impl) <= width else "..." + impl[-(width - 3):]


def _f(x, fmt: str) -> str:
    width = int(fmt.split(".")[0])
    return f"{'-':>{width}}" if x is None else format(x, fmt)


class Table:
    """A fixed-width table printed row by row as records arrive."""

    def __init__(self, impls: Iterable[str], configs: Iterable[str], stream: TextIO,
                 regimes: Iterable[str] | None = None, gate: str = "scalar",
                 packed: bool = False, columns: Iterable[str] = ERR_COLUMNS):
        self.columns = tuple(columns)      # the outputs of the recurrence family, in order
        self.w_impl = max([4] + [len(short_name(i)) for i in impls])
        self.w_cfg = max([6] + [len(c) for c in configs])
        regimes = list(regimes or [])
        # a regime column only when several regimes share the table
        self.w_reg = max([6] + [len(r) for r in regimes]) if len(regimes) > 1 else 0
        # the gate kind and the number of packed sequences only when not the default
        self.gate = gate != "scalar"
        self.packed = packed
        self.stream = stream
        reg = f"{'regime':<{self.w_reg}} " if self.w_reg else ""
        reg += f"{'gate':<6} " if self.gate else ""
        reg += f"{'N_seq':>5} " if self.packed else ""
        head = (f"{'impl':<{self.w_impl}} {'mode':<7} {reg}{'config':<{self.w_cfg}} {'T':>5} "
                f"{'ms':>9} {'compile_s':>9} {'temp_MB':>8} {'resid_MB':>8} "
                + " ".join(f"{c:>9}" for c in self.columns) + f" {'x_ref':>14} {'proven':>7}  verdict")
        self.header = head

    def print_header(self) -> None:
        print(self.header, file=self.stream)
        print("-" * len(self.header), file=self.stream, flush=True)

    def line(self, r: Record | dict[str, Any]) -> str:
        """A row of the table (a record, or its JSON form)."""
        r = as_record(r)
        reg = f"{r.regime or '':<{self.w_reg}} " if self.w_reg else ""
        reg += f"{r.gate or '-':<6} " if self.gate else ""
        if self.packed:
            cu = r.cu_seqlens
            reg += f"{'-' if cu is None else len(cu) - 1:>5} "
        lead = (f"{short_name(r.impl):<{self.w_impl}} {r.mode:<7} {reg}"
                f"{r.config:<{self.w_cfg}} {r.seq:>5} ")
        if r.error is not None:
            return lead + f"FAIL: {r.error}"
        if r.skipped is not None:
            return lead + f"skipped: {r.skipped}"
        cols = " ".join(f"{_e(r.outputs[c].rel_err if c in r.outputs else None):>9}"
                        for c in self.columns)
        used = bound_used(r)
        used_s = "-" if used is None else "nan" if math.isnan(used) else \
            "inf" if math.isinf(used) else f"{used:.2g}"
        name, ratio = reference_used(r)
        bad = [n for n, o in r.outputs.items() if o.nonfinite]
        if bad:                 # a row with non-finite values has no finite ratio to show
            name, ratio = bad[0], math.nan
        ref_s = "-" if ratio is None else (f"{ratio:.2g}" if math.isfinite(ratio) else
                                           "nan" if math.isnan(ratio) else "inf") \
            + f"({name})"
        f = r.figures
        return (lead + f"{_f(f.get('median_ms'), '9.2f')} {_f(f.get('compile_s'), '9.2f')} "
                f"{_f(f.get('xla_temp_mb'), '8.1f')} {_f(f.get('residual_mb'), '8.1f')} "
                f"{cols} {ref_s:>14} {used_s:>7}  {verdict(r)}")

    def row(self, r: Record | dict[str, Any]) -> None:
        r = as_record(r)
        print("\n".join([self.line(r)] + extra_lines(r)), file=self.stream, flush=True)


# ---------------------------------------------------------------- verdict

def tracebacks(records, most: int = 2) -> list[str]:
    """Where the kernels that raised raised: the tracebacks of the first ``most`` such rows
    (the kernel's frames; all are in the JSON report's ``traceback``)."""
    raised = [r for r in map(as_record, records) if r.traceback]
    out = [f"traceback of {place(r)}:\n{r.traceback.rstrip()}" for r in raised[:most]]
    if len(raised) > most:
        out.append(f"({len(raised) - most} more tracebacks in the JSON report)")
    return out


def summary(records, *, first: bool = True) -> tuple[int, str]:
    """(exit code, one-line reason ending with what ran, ``_presets.coverage``): 1 when a row
    failed (a bound exceeded, a non-finite output, a kernel that raised) or nothing was audited;
    else 3 when glaref declined rows (skipped: not enough memory), naming the first with its
    reason; else 0. ``first=False``: the headline alone (the plot's title), without the first
    failing or declined row and what ran. ``records``: Records or their JSON forms."""
    recs = [as_record(r) for r in records]
    failed = [r for r in recs if r.ok is False]
    skipped = [r for r in recs if r.ok is None]
    passed = [r for r in recs if r.ok is True]
    also = f"; {len(skipped)} skipped" if skipped else ""
    ran = f"; ran {coverage([r.to_json() for r in recs])}"
    if failed:
        r = failed[0]
        why = r.failures[0]
        more = len(r.failures) - 1
        why += f" (+{more} more output(s))" if more > 0 else ""
        head = f"FAIL: {len(failed)} of {len(recs)} rows fail the verdict{also}"
        return 1, (f"{head} (first: {place(r)}: {why}){ran}" if first else head)
    if not recs:
        return 1, "FAIL: no row was audited"
    # the proven tier is named only where it bounded something (a family whose tier is silent,
    # every bound infinite, passed by the calibrated tier alone)
    proven = any(o.budget_bound is not None and math.isfinite(o.budget_bound)
                 for r in passed for o in r.outputs.values())
    within = f"within {_ratio():g}x the reference kernels' error" + \
        (" and the proven bound" if proven else "")
    if skipped:
        r = skipped[0]
        head = (f"INCOMPLETE: {len(passed)} rows {within}, {len(skipped)} of {len(recs)} "
                "skipped by glaref")
        return 3, (f"{head} (first: {place(r)}: {r.skipped}){ran}" if first else head)
    return 0, f"OK: {len(passed)} rows {within}{ran}"


def notes(records, most: int = 6) -> list[str]:
    """The rows' notes (``_verdict.looseness``: where an undeclared chunk structure or
    dlog_alpha form left a verdict looser than a declaration would; the less accurate outputs'
    reasons), one line each with its row, at most ``most`` and a count of the rest (all are in
    the JSON report)."""
    recs = [as_record(r) for r in records]
    lines = [f"note: {place(r)}: {n}" for r in recs
             for n in r.notes + [r.outputs[o].reason for o in r.less_accurate]]
    if len(lines) > most:
        lines = lines[:most] + [f"note: {len(lines) - most} more in the records' 'notes'"]
    return lines


def _ratio() -> float:
    return tol("calibrated_ratio")


# ---------------------------------------------------------------- plot

MAX_WHERE_PANELS = 8     # panels of error against t, one per failing output (the first ones)


def _where_panel(ax, r: dict[str, Any], name: str) -> None:
    """One failing output's error against t (``glaref._audit._where``: per step, in budget units), the
    allowed band (the reference kernels' error times the allowed ratio, per step) and the chunk
    boundaries (grey verticals: the declared or inferred chunk size)."""
    p = r["where"][name]
    k = p.get("time_bin") or 1
    t = [i * k for i in range(len(p["time"]))]
    ax.plot(t, [max(e, 1e-3) for e in p["time"]], color="C3", linewidth=1.0, label="error")
    if p.get("time_band"):
        ax.plot(t, [max(b, 1e-3) for b in p["time_band"]], color="k", linestyle=":",
                linewidth=1.0, label="allowed")
    C = p.get("chunk")
    if C:
        for b in range(C, r["seq"], C):
            ax.axvline(b, color="0.75", linewidth=0.6, zorder=0)
    ax.set_yscale("log")
    ax.set_xlabel("t" + (f" (chunks of {C}{', inferred' if p.get('chunk_inferred') else ''})"
                         if C else ""))
    label = name if name in FORWARD else f"{name} (gradient)"
    regime = f" {r['regime']}" if r.get("regime") else ""
    ax.set_title(f"{short_name(r['impl'], 24)} T={r['seq']}{regime}: {label} per step (budget units)",
                 fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def _is_less_accurate(r: dict[str, Any], name: str) -> bool:
    """The output's outcome is less accurate (a pass, or a failure under strict)."""
    return (r.get("outcomes") or {}).get(name) == "less_accurate"


def _is_fail(r: dict[str, Any], name: str) -> bool:
    """The output failed its verdict and is not merely less accurate under strict."""
    return name in failed_outputs(r) and not _is_less_accurate(r, name)


# how the error panels mark a point by its output's outcome (ok points carry no mark)
OUTCOME_MARKS = {
    _is_fail: dict(marker="x", color="red", markersize=8),
    _is_less_accurate: dict(marker="D", color="darkorange", markerfacecolor="none",
                            markersize=7, markeredgewidth=1.4),
}


def plot(records: list[dict[str, Any]], path) -> None:
    """Error vs seq per output and gradient, and time vs seq, in one PNG.

    Colour: the kernel (impl); marker: the config. In the error panels a solid line is the
    kernel's normwise relative error and a dotted line of the same colour the largest error the
    calibrated verdict allows it on the same inputs (``allowed_ratio`` times the reference
    kernels' error): a solid line close under its dotted one is close to failing. In the time
    panel solid lines are fwd and dashed ones fwd_bwd. A red cross marks a point whose output
    failed its verdict (either tier), a hollow orange diamond one whose output is less accurate
    (beyond the most accurate designs' rule, within the field's correct designs: a pass, or a
    failure under strict); an ok point has no mark (``OUTCOME_MARKS``). The figure's title is
    the audit's verdict (``summary``). Then, per failing output (the first MAX_WHERE_PANELS),
    where its error is: against t, with the allowed band and the chunk boundaries
    (``_where_panel``).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [r for r in records if measured(r)]
    errs = lambda r: {**r.get("rel_err_out", {}), **(r.get("rel_err_grads") or {})}  # noqa: E731
    # every output measured, in the order of the records (a family's own outputs, beta say)
    names = list(dict.fromkeys(n for r in rows for n in errs(r)))
    panels = names + ["time"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    colour = {i: f"C{n % 10}" for n, i in enumerate(impls)}
    markers = "osD^v<>ph*"
    marker = {c: markers[n % len(markers)] for n, c in enumerate(configs)}
    has_fwd = any(r["mode"] == "fwd" for r in rows)

    # where the error is: per failing output with a per-step profile, its error against t
    located = [(r, n) for r in rows for n in failed_outputs(r)
               if ((r.get("where") or {}).get(n) or {}).get("time")][:MAX_WHERE_PANELS]
    ncol = 4
    nrow = -(-(len(panels) + len(located)) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow + 0.8), squeeze=False)
    series: dict[tuple, list] = {}
    for r in rows:
        series.setdefault((r["impl"], r["config"], r["mode"]), []).append(r)
    for ax, panel in zip(axes.ravel(), panels):
        for (impl, cfg, mode), rs in series.items():
            rs = sorted(rs, key=lambda r: r["seq"])
            style = dict(color=colour[impl], marker=marker[cfg], markersize=4)
            if panel == "time":
                pts = [(r["seq"], r.get("median_ms")) for r in rs]
                style["linestyle"] = "-" if mode == "fwd" else "--"
            else:
                # o and h_T from the fwd rows when there are any, gradients from fwd_bwd rows
                if panel in FORWARD and mode != "fwd" and has_fwd:
                    continue
                pts = [(r["seq"], errs(r).get(panel)) for r in rs]
                allowed = [(r["seq"], (r.get("reference_rel_err") or {}).get(panel)) for r in rs]
                allowed = [(x, y * r["allowed_ratio"]) for (x, y), r in zip(allowed, rs)
                           if y is not None and math.isfinite(y) and y > 0]
                if allowed:
                    ax.plot([x for x, _ in allowed], [y for _, y in allowed], color=colour[impl],
                            linestyle=":", linewidth=1.2)
                for rule, mark in OUTCOME_MARKS.items():
                    hit = [(r["seq"], errs(r).get(panel)) for r in rs if rule(r, panel)]
                    hit = [(x, max(y, 1e-17)) for x, y in hit if y is not None and math.isfinite(y)]
                    if hit:
                        ax.plot([x for x, _ in hit], [y for _, y in hit], linestyle="",
                                zorder=5, **mark)
            pts = [(x, max(y, 1e-17)) for x, y in pts if y is not None and math.isfinite(y)]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("seq")
        grad = panel not in FORWARD
        ax.set_title("median ms per call" if panel == "time" else
                     f"rel_err {panel} (gradient)" if grad else f"rel_err {panel}")
        ax.grid(True, which="both", alpha=0.3)
    for ax, (r, n) in zip(axes.ravel()[len(panels):], located):
        _where_panel(ax, r, n)
    for ax in axes.ravel()[len(panels) + len(located):]:
        ax.axis("off")
    handles = [Line2D([], [], color=colour[i], label=short_name(i)) for i in impls]
    handles += [Line2D([], [], color="k", marker=marker[c], linestyle="", label=c) for c in configs]
    handles.append(Line2D([], [], color="k", linestyle="-", label="solid: measured rel_err"))
    handles.append(Line2D([], [], color="k", linestyle=":", label=f"dotted: allowed rel_err "
                          f"({_ratio():g}x the reference kernels')"))
    if has_fwd and any(r["mode"] == "fwd_bwd" for r in rows):
        handles.append(Line2D([], [], color="k", linestyle="--", label="time: solid fwd, dashed fwd_bwd"))
    handles.append(Line2D([], [], linestyle="", label="verdict failed",
                          **OUTCOME_MARKS[_is_fail]))
    if any(_is_less_accurate(r, n) for r in rows for n in names):
        handles.append(Line2D([], [], linestyle="", label="less accurate (within the field's "
                              "designs)", **OUTCOME_MARKS[_is_less_accurate]))
    # the verdict in words above the panels (the summary's headline)
    fig.suptitle(summary(records, first=False)[1], fontsize=10)
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
