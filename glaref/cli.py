"""``glaref`` command line (``python -m glaref`` is the same). A thin face over the engine.

    glaref audit                              # the quick preset: built-in kernels, small grid
    glaref audit --preset seed --json r.json  # the seed report's whole grid
    glaref audit --impl mykernels.py:gla --layout bthd --config 2,1,4,64,64 --seq 1000
    glaref audit --gate vector --regime standard,mixed_dims   # GLA's per-dimension gates
    glaref audit --cu-seqlens 0,5,5,40                        # packed sequences (T = 40)
    glaref audit --cu-seqlens random:4 --seq 1000             # 4 random lengths per T
    glaref oracles verify                     # the golden vectors (oracles/) against this glaref

Exit codes: 0 every row within the error bound, 1 a row failed (a bound exceeded, a non-finite
output, a kernel that raised) or nothing was audited, 2 usage error, 3 environment error (jax
missing, backend or matplotlib unavailable, rows glaref skipped for lack of memory), 130
interrupted (the JSON file keeps the rows measured so far). Each non-zero exit prints a one-line
reason; --exit-zero turns 1 into 0 for exploration. Arguments, output paths and matplotlib are
checked before any work. Progress goes to stderr, one line per row (--no-progress: none).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import _golden_cli
from ._audit import _merge, _report
from ._audit._args import check_preset, family
from ._audit._args import split as _split
from ._audit._claims import Claims
from ._audit._engine import audit
from ._audit._presets import CONFIGS, PRESETS, parse_config, regime_names
from ._errors import AuditEnvironmentError, AuditUsageError, GlarefError

__all__ = ["PROG", "main"]

PROG = "glaref"

# the engine's argument names, as the command line spells them (for its error messages)
_FLAGS = {"impl": "--impl", "config": "--config", "seq": "--seq", "mode": "--mode",
          "dtype": "--dtype", "precision": "--precision", "backend": "--backend",
          "repeats": "--repeats", "chunk_size": "--chunk-size",
          "accumulate_dtype": "--accumulate-dtype", "operand_dtype": "--operand-dtype",
          "dlog_alpha_form": "--dlog-alpha-form", "seed": "--seed", "regime": "--regime",
          "preset": "--preset", "oracle_impl": "--oracle", "json_path": "--json",
          "layout": "--layout", "scale": "--scale", "gate": "--gate",
          "cu_seqlens": "--cu-seqlens", "shard": "--shard", "decay_form": "--decay-form",
          "strict": "--strict", "recurrence": "--recurrence", "probes": "--probes"}


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so that main() returns its code."""

    def error(self, message):
        raise _UsageExit(self, message)


class _UsageExit(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser


# the claims a user kernel may make about itself (glaref._audit._claims.Claims), one flag each
CLAIM_FLAGS = (
    ("--chunk-size", dict(type=int, help="user kernels: their chunk length, 1 for a step-by-step "
                          "scan (default unknown: held to 64-step chunks, widened towards a scan "
                          "and 256-step chunks)")),
    ("--accumulate-dtype", dict(choices=("float64", "float32", "float16", "bfloat16"),
                                help="user kernels with 16-bit inputs: what they accumulate and "
                                "carry states in (default float32)")),
    ("--operand-dtype", dict(choices=("float32", "tf32", "float16", "bfloat16"), help="user "
                             "kernels: the format they round matmul operands to beyond their "
                             "dtype (default none; TF32 on NVIDIA GPUs at default precision)")),
    ("--dlog-alpha-form", dict(choices=("identity", "direct"), help="user kernels: identity (the "
                               "reverse cumsum of q.dq - k.dk) or direct; default unknown: held "
                               "to the direct form, an identity kernel reading less accurate")),
    ("--decay-form", dict(choices=("segment_sums", "chunk_cumsum"), help="user kernels: how they "
                          "form decays; with --chunk-size it holds the kernel to its own design")),
)


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="Float64 ground truth and kernel audit for gated linear "
                "attention (scalar or vector gates) and the gated delta rule (--recurrence delta).")
    sub = p.add_subparsers(dest="command", metavar="command", parser_class=_Parser)
    a = sub.add_parser(
        "audit", help="audit JAX kernels against the float64 oracle",
        description="Per-output and per-gradient accuracy (vs the float64 oracle), time and XLA "
        "memory of JAX kernels, in the seed report's format. Verdict per output: no non-finite "
        "value; a normwise error within the allowed ratio (x_ref) of the error glaref's "
        "same-precision reference kernels make on the same inputs (calibrated tier); and "
        "budget_ulps (error in units of the compute dtype's rounding, relative to the sum of "
        "|terms|) within the worst case of any correct kernel (proven tier). Exit 0 every row "
        "within the verdict, 1 a row failed, 2 usage error, 3 environment error.")
    a.add_argument("--recurrence", default="scalar_gate", help="the recurrence audited: "
                   "scalar_gate (default: gated linear attention, kernel(q, k, v, log_alpha, "
                   "h0) -> o | (o, h_T)) or delta "
                   "(the gated delta rule of glaref.delta, kernel(q, k, v, beta, log_alpha, h0) "
                   "-> o | (o, h_T), beta (B, H, T); built-in kernels glaref.delta.kernels' "
                   "chunked and scan; regimes from glaref.delta.regimes, quick: standard, "
                   "strong_decay, converged, beta_two; calibrated tier only, its proven tier has "
                   "no finite bound yet; no --cu-seqlens or --probes)")
    a.add_argument("--impl", help="comma-separated kernels: chunked, scan, package.module:function "
                   "or path/to/file.py:function (default: the preset's, chunked,scan)")
    a.add_argument("--layout", default="bhtd", help="layout the kernels take: bhtd or bthd "
                   "(default bhtd)")
    a.add_argument("--scale", type=float, default=1.0, help="scale the oracle applies to o; passed "
                   "to kernels that take a scale argument, others must apply it themselves")
    a.add_argument("--config", action="append", help="config name(s), comma-separated, or "
                   f"B,G,H,dk,dv; repeatable. Names: {', '.join(CONFIGS)}")
    a.add_argument("--seq", help="comma-separated sequence lengths (default: the preset's)")
    a.add_argument("--mode", help="fwd, fwd_bwd or both comma-separated (default both)")
    a.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 or "
                   "float64 (enables jax x64)")
    a.add_argument("--precision", default="default", help="jax matmul precision: default, high or "
                   "highest (on NVIDIA GPUs default float32 matmuls run as TF32)")
    a.add_argument("--backend", help="cpu or gpu (default: jax's default backend)")
    a.add_argument("--repeats", type=int, help="timed repeats per row (default: the preset's, 3; "
                   "0: accuracy only, no timing)")
    for flag, spec in CLAIM_FLAGS:
        a.add_argument(flag, **spec)
    a.add_argument("--strict", action="store_true", help="a correct design less accurate than "
                   "the most accurate one (a 'less accurate' row) fails")
    a.add_argument("--gate", default="scalar", choices=("scalar", "vector"), help="gate kind: "
                   "scalar, log_alpha (B, H, T) (default), or vector, GLA's per-key-dimension "
                   "log_alpha (B, H, T, dk), drawn per dimension by every regime (mixed_dims "
                   "mixes near-one, standard and strongly decayed dimensions)")
    a.add_argument("--cu-seqlens", metavar="OFFSETS|random:N", help="packed sequences: offsets "
                   "0,c_1,...,T (empty sequences allowed; they fix T) or random:N (N sequences of "
                   "random lengths in every T). Configs run with batch 1; h0 and h_T are "
                   "(N, H, dk, dv); kernels get the offsets as the keyword cu_seqlens= (a user "
                   "kernel must take it)")
    a.add_argument("--seed", type=int, default=0, help="input seed, a non-negative integer "
                   "(default 0)")
    a.add_argument("--regime", help="comma-separated input regimes from glaref.regimes, or all "
                   "(every one but the slow 'long'); default: the preset's (quick: standard, "
                   "strong_decay, near_one; seed: standard)")
    a.add_argument("--preset", default="quick", choices=sorted(PRESETS), help="quick (default: "
                   "small grid, under 2 minutes on 2 cores) or seed (the seed report's grid)")
    a.add_argument("--oracle", choices=("numba", "numpy"), help="oracle implementation (default "
                   "numba when installed)")
    a.add_argument("--json", metavar="FILE", help="write the report (seed schema) here, updated "
                   "after every row; a missing directory is created")
    a.add_argument("--plot", metavar="FILE.png", help="error vs seq per gradient and time vs seq, "
                   "as .png, .pdf or .svg (needs matplotlib); a missing directory is created")
    a.add_argument("--probes", nargs="?", const="all", metavar="NAMES",
                   help="also run the probes on every fwd_bwd row: all, or comma-separated from "
                   "determinism, causality, packed, cotangents, chunk_sweep (each a pass/fail "
                   "line under the row; a failing probe fails it)")
    a.add_argument("--exit-zero", action="store_true", help="exit 0 even when an error bound is "
                   "exceeded (usage and environment errors still exit 2 and 3)")
    a.add_argument("--no-progress", "--quiet", dest="progress", action="store_false",
                   help="no progress lines on stderr (default: one line per row)")
    a.add_argument("--shard", metavar="I/N", help="run only shard I of N (0 <= I < N): the "
                   "problems I, I+N, ... of the plan, for a scheduler to split an audit across "
                   "machines or cores; join the shards' --json reports with glaref report merge")
    r = sub.add_parser("report", help="audit reports: merge the shards of an audit",
                       description="Work on the JSON reports of glaref audit.")
    acts = r.add_subparsers(dest="report_action", metavar="action", parser_class=_Parser)
    m = acts.add_parser("merge", help="join the --json reports of an audit's shards",
                        description="Join the JSON reports of glaref audit --shard 0/N .. N-1/N "
                        "into one report, in the unsharded audit's row order: equal to the "
                        "unsharded report but for the timings.")
    m.add_argument("reports", nargs="+", metavar="SHARD.json")
    m.add_argument("-o", "--output", required=True, metavar="ALL.json",
                   help="the joined report to write")
    _golden_cli.add_parser(sub)
    return p


def _err(msg: str | Exception) -> None:
    """A one-line refusal. An error about one argument (``GlarefError.argument``) names it by its
    flag."""
    if isinstance(msg, GlarefError):
        msg = msg.worded(_FLAGS)
    print(f"{PROG} audit: error: {msg}", file=sys.stderr)


def _audit(ns: argparse.Namespace) -> int:
    if ns.plot:
        try:
            _report.check_output(ns.plot, "--plot", _report.PLOT_FORMATS)
        except AuditUsageError as exc:
            _err(exc)
            return 2
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _err("--plot needs matplotlib, which is not installed (pip install 'glaref[plot]')")
            return 3
    impls = _split(ns.impl) if ns.impl else None
    configs = ns.config if ns.config else None
    preset_names = None
    table: list = []

    def on_record(rec):
        if not records[:-1]:            # the header waits for the first row, so that a usage or
            table[0].print_header()     # environment error prints only its one-line reason
        table[0].row(rec)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # The table needs column widths before the first row: resolve names cheaply here.
    try:
        fam = family(Claims(recurrence=ns.recurrence).recurrence)
        pre = check_preset(ns.preset, fam)
        ns.regime = ",".join(regime_names(ns.regime, pre.regimes, fam.all_regimes))
        names = impls if impls else list(pre.impls)
        cfg_names = []
        for c in (configs or []):
            cfg_names += list(parse_config(c))
        preset_names = cfg_names or list(pre.configs)
    except AuditUsageError as exc:
        _err(exc)
        return 2
    table.append(_report.Table(names, preset_names, sys.stdout, _split(ns.regime), gate=ns.gate,
                               packed=ns.cu_seqlens is not None,
                               columns=fam.outputs + fam.grads))

    records: list = []

    def keep(rec):
        records.append(rec)
        on_record(rec)

    try:
        audit(impls, configs, ns.seq, ns.mode, preset=ns.preset, dtype=ns.dtype,
              precision=ns.precision, backend=ns.backend, layout=ns.layout, scale=ns.scale,
              repeats=ns.repeats, seed=ns.seed, regimes=ns.regime, json_path=ns.json,
              oracle_impl=ns.oracle, chunk_size=ns.chunk_size,
              accumulate_dtype=ns.accumulate_dtype, operand_dtype=ns.operand_dtype,
              dlog_alpha_form=ns.dlog_alpha_form,
              decay_form=ns.decay_form, strict=ns.strict,
              gate=ns.gate, cu_seqlens=ns.cu_seqlens, shard=ns.shard, probes=ns.probes,
              recurrence=ns.recurrence,
              on_record=keep, progress=progress if ns.progress else None)
    except AuditUsageError as exc:
        _err(exc)
        return 2
    except AuditEnvironmentError as exc:
        _err(exc)
        return 3
    except KeyboardInterrupt:
        where = f"; {ns.json} keeps them" if ns.json else ""
        _err(f"interrupted after {len(records)} row(s){where}")
        return 130

    code, line = _report.summary(records)
    if records:
        print()
        print(_report.legend())
        print()
    for note in _report.notes(records):
        print(note)
    for tb in _report.tracebacks(records):
        print(tb)
    print(line)
    if ns.plot:
        _report.plot(records, ns.plot)
        print(f"plot written to {ns.plot}")
    if ns.json:
        print(f"report written to {ns.json}")
    if code == 1 and ns.exit_zero:
        return 0
    return code


def _report_cmd(ns: argparse.Namespace) -> int:
    if ns.report_action != "merge":
        print(f"{PROG} report: error: an action is required (merge)", file=sys.stderr)
        return 2
    try:
        print(_merge.main_merge(ns.reports, ns.output))
    except AuditUsageError as exc:
        print(f"{PROG} report merge: error: {exc}", file=sys.stderr)
        return 2
    except AuditEnvironmentError as exc:
        print(f"{PROG} report merge: error: {exc}", file=sys.stderr)
        return 3
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageExit as exc:
        # the usage of the (sub)command whose arguments were wrong
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:          # --help
        return int(exc.code or 0)
    if ns.command == "audit":
        return _audit(ns)
    if ns.command == "oracles":
        return _golden_cli.run(ns)
    if ns.command == "report":
        return _report_cmd(ns)
    parser.print_usage(sys.stderr)
    print(f"{PROG}: error: a command is required (audit, report or oracles)", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
