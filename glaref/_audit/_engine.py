"""The audit engine: plan rows -> problem -> truth -> one runner per framework -> verdict -> record.

For every regime, config, sequence length (and the sizes the regime derives from them: the plan
of ``glaref.gla._problems``) the float64 inputs are generated once, rounded once to the audited dtype
(so the oracle sees exactly what the kernel sees and only the kernel's arithmetic is measured),
and the oracle runs once (``glaref.gla._judge.Truth``: forward, vjp, the error scales and the
reference kernels, each timed on its own and never counted as the kernel's), all of them the
recurrence family's (``_family.Family``: ``Rows.family``). Then for every mode
and kernel a runner (``glaref._audit._runners``: JAX, or torch and NumPy) runs the kernel, the
verdict (``glaref.gla._judge.assess_outputs`` -> ``glaref._audit._verdict.assess``) judges what it gave,
and one record (``glaref._audit._records``) goes to the caller, the JSON file (rewritten
atomically after every row) and the caller's callback.

A kernel that raises (even SystemExit), returns the wrong structure or a non-float dtype, has a
non-finite output, or an output beyond either tier of the verdict, makes a failed row and the
audit goes on. Only rows glaref itself declines are skipped (``ok`` null, the reason in
``skipped``): the kernel's XLA buffers or the oracle's own float64 arrays would not fit in the
memory available (``JaxRunner``'s guard, ``oracle_bytes``).

:func:`audit` is the face for JAX kernels (the CLI's and ``glaref.audit``); :func:`audit_kernel`
the face for torch and NumPy kernels (``glaref.testing.check_kernel``). Both parse the kernel's
claims once (``glaref._audit._claims.Claims``) and the rows once (``_args.rows``), then run
:func:`run_rows`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .._errors import AuditUsageError, NonFiniteError
from .._inputs import Dims
from . import _args, _device, _probes, _records, _report, _verdict
from ._claims import Claims
from ._family import Family
from ._runners import FrameworkRunner, JaxRunner
from ._subjects import Subject, framework_subject, resolve

__all__ = ["JaxOptions", "audit", "audit_jax", "audit_kernel", "oracle_bytes", "run_rows"]


def oracle_bytes(dims: Dims, modes: Iterable[str], family: Family | None = None) -> int:
    """About the most host memory the engine's float64 arrays of one problem of ``family`` take
    at once (``Family.oracle_bytes``); None: the scalar gate's (``_args.family("scalar_gate")``)."""
    if family is None:
        family = _args.family("scalar_gate")
    return family.oracle_bytes(dims, modes)


def _oracle_memory(dims: Dims, modes: Iterable[str], host: int | None,
                   family: Family) -> str | None:
    """Why glaref declines a problem: its oracle side (``oracle_bytes``) would not fit in the
    ``host`` bytes available (None: unknown, or the guard is off), else None."""
    need = oracle_bytes(dims, modes, family)
    if host is None or need <= host:
        return None
    return (f"the oracle needs about {need / 2**30:.3g} GiB of host memory for this problem "
            f"(float64 inputs, results and error scales), {host / 2**30:.3g} GiB available")


# ---------------------------------------------------------------- the one loop

class _Sink:
    """Where each row goes as it is made: the returned records, the JSON report (rewritten
    atomically) and the caller's callback (both the record's JSON form); and the progress line
    announcing it."""

    def __init__(self, total: int, writer, on_record, progress):
        self.records: list[_records.Record] = []
        self.total, self.writer, self.on_record, self.progress = total, writer, on_record, progress

    def announce(self, text: str) -> None:
        if self.progress:
            self.progress(f"[{len(self.records) + 1}/{self.total}] {text}")

    def add(self, rec: _records.Record) -> None:
        self.records.append(rec)
        if self.writer or self.on_record:
            as_json = rec.to_json()
            if self.writer:
                self.writer.add(as_json)
            if self.on_record:
                self.on_record(as_json)


@dataclass(frozen=True)
class _Audit:
    """Everything fixed for one audit: the runner, the kernels (with their claims), the rows,
    the claims shared by every kernel and the host memory the oracle may use (None: unguarded)."""

    runner: Any
    subjects: list[Subject]
    rows: _args.Rows
    claims: Claims
    host: int | None
    probes: tuple[str, ...] = ()     # glaref._audit._probes.PROBES to run on every fwd_bwd row
    # the probes' runner of each JAX kernel (by id of its Subject), kept for the whole audit so
    # that its compiled programs serve every row
    probe_runners: dict = field(default_factory=dict, compare=False)


def run_rows(a: _Audit, sink: _Sink) -> list[_records.Record]:
    """Every row of the audit ``a``, problem by problem, into ``sink``; its records."""
    a.rows.family.warm(a.rows.oracle, a.claims.gate, a.rows.packing is not None)
    for regime, cname, dims in a.rows.plan():
        _problem_rows(a, sink, regime, cname, dims)
    return sink.records


def _problem_rows(a: _Audit, sink: _Sink, regime: str, cname: str, dims: Dims) -> None:
    """Every row (mode x kernel) of one problem: declined when the oracle's side would not fit
    in the host's memory, else the problem made, its oracle run once and each row measured."""
    where = _records.Where(cname, dims, regime)
    reason = _oracle_memory(dims, a.rows.modes, a.host, a.rows.family)
    if reason is not None:
        for mode in a.rows.modes:
            for subject in a.subjects:
                sink.announce(f"{subject.name} {mode} {cname} T={dims.T} ({regime}): skipped")
                sink.add(_records.declined(subject, mode, where, a.rows, reason,
                                            a.runner.params))
        return
    family = a.rows.family
    problem = family.make_problem(regime, dims, a.rows.seed, a.claims.dtype, gate=a.claims.gate,
                                  cu_seqlens=a.rows.offsets(dims.T))
    truth = family.truth(problem, a.rows.scale, a.rows.oracle)
    kind = "" if a.claims.gate == "scalar" else f", {a.claims.gate} gates"
    kind += "" if a.rows.packing is None else f", {truth.p.n_states} packed sequences"
    try:
        truth.forward()
        prepared = a.runner.prepare(problem)
        truths: dict = {}                   # the probes' oracle sides, shared by the kernels
        for mode in a.rows.modes:
            for subject in a.subjects:
                sink.announce(f"{subject.name} {mode} {cname} T={dims.T} ({regime}{kind})")
                m = a.runner.measure(subject, mode, truth, prepared)
                rec = _records.record(subject, where, a.rows, truth, m)
                if a.probes and m.mode == "fwd_bwd" and m.failure is None:
                    rec = _records.add_probes(rec, _probe(a, subject, where, m, problem,
                                                          truths))
                sink.add(rec)
    except NonFiniteError as exc:
        # the oracle's own results overflow (the regimes' inputs are moderate: an extreme scale):
        # nothing can be judged against them
        raise AuditUsageError(str(exc), exc.argument) from None


def _probe(a: _Audit, subject: Subject, where: _records.Where, m, problem,
           truths: dict) -> list:
    """The probes ``a.probes`` on one row's kernel and problem (glaref._audit._probes), run through a
    runner of the kernel's framework (for JAX, one per kernel for the whole audit, given the
    row's compiled program for the row's shape: ``problem``) and judged with its claims, the
    oracle's side of each probe problem kept in ``truths`` for the problem's other kernels."""
    r = a.runner
    if isinstance(r, JaxRunner):
        run = a.probe_runners.get(id(subject))
        if run is None:
            run = a.probe_runners[id(subject)] = _probes.jax_runner(
                subject.fn, r.dtype, a.rows.family, layout=r.layout, scale=None)
        if m.program is not None:          # the row's compiled program serves its own shape
            run.use_row(problem, *m.program)
    else:
        run = _probes.kernel_runner(subject.fn, r.dtype, layout=r.layout, scale=r.scale,
                                    framework=r.framework, device=r.device,
                                    family=a.rows.family)
    judge = _probes.verdict_judge(a.rows.family, scale=a.rows.scale, oracle=a.rows.oracle,
                                  claims=subject.claims, dtypes=m.dtypes, truths=truths)
    ctx = r.precision_ctx() if isinstance(r, JaxRunner) else contextlib.nullcontext()
    with ctx:
        row = _probes.RowProblem(where.regime, where.dims, a.rows.seed, a.claims.dtype)
        return _probes.run_probes(run, row, judge, family=a.rows.family,
                                  chunk_size=subject.claims.chunk_size, which=a.probes)


# ---------------------------------------------------------------- the faces

# audit's keywords beyond its named parameters: the kernels' claims (glaref._audit._claims.Claims), and
# how the rows are run, with their defaults
CLAIMS = ("dtype", "layout", "chunk_size", "accumulate_dtype", "operand_dtype",
          "dlog_alpha_form", "decay_form", "gate", "strict", "recurrence")
RUN_DEFAULTS = {"precision": "default", "backend": None, "repeats": None, "scale": 1.0,
                "oracle_impl": None, "cu_seqlens": None, "memory_guard": True, "shard": None,
                "probes": None}


def audit(impls=None, configs=None, seqs=None, modes=None, *, preset: str = "quick",
          regimes="standard", seed: int = 0, json_path=None,
          on_record: Callable[[dict], None] | None = None,
          progress: Callable[[str], None] | None = None, **options: Any) -> list[dict[str, Any]]:
    """Audit JAX kernels against the float64 oracle; returns one record per row.

    Keywords beyond the named parameters (``options``): the kernels' claims (``CLAIMS``: dtype,
    layout, chunk_size, accumulate_dtype, operand_dtype, dlog_alpha_form, gate) and how the rows run
    (``RUN_DEFAULTS``: precision, backend, repeats, scale, oracle_impl, cu_seqlens, memory_guard,
    shard, probes); any other keyword is a TypeError naming it.

    recurrence (a claim): the recurrence the kernels compute (``glaref._audit._claims.RECURRENCES``,
        its family ``_claims.FAMILIES``): "scalar_gate" (the default), gated
        linear attention; "delta", the gated delta rule of ``glaref.delta``, whose kernels are
        ``(q, k, v, beta, log_alpha, h0) -> o | (o, h_T)`` (beta (B, H, T)), its built-in
        kernels, presets and regimes (``glaref.delta._family``) and verdict (calibrated tier
        only: its proven tier has no finite bound yet).
    impls: built-in names ("chunked", "scan"), "package.module:function",
        "path/to/file.py:function" or callables ``(q, k, v, log_alpha, h0) -> o | (o, h_T)``.
    configs: preset names, "B,G,H,dk,dv" strings or {name: (B, G, H, dk, dv)}.
    seqs, modes ("fwd", "fwd_bwd"), repeats: default to the preset's ("quick" or "seed");
        ``repeats=0`` measures accuracy only: no timing loop, null inner/median_ms/q1_ms/q3_ms.
    dtype: the kernel's input dtype; precision: jax matmul precision; backend: "cpu", "gpu" or
    None (jax's default). regimes: names from ``glaref.regimes.REGIMES``. json_path: the report,
    rewritten after every row. Records carry the seed report's fields plus the additions listed
    in ``glaref._audit._report.RECORD_ADDITIONS``.

    Verdict per output (``glaref._audit._verdict.assess``, two tiers): no non-finite value; a normwise
    error within ``calibrated_ratio`` times that of glaref's same-precision reference kernels on
    the same inputs (calibrated); budget_ulps within the bound of any correct kernel (proven),
    all measured against the oracle on the dtype-rounded inputs, in the compute dtype ("tf32"
    for float32 matmuls at default precision on an NVIDIA GPU). What the verdict assumes of a
    user kernel (its claims, ``glaref._audit._claims.Claims``): ``chunk_size`` (its chunk length, 1 for
    a step-by-step scan: the reference kernels and the bound follow it; None: unknown, see
    ``glaref.gla._judge.baseline_error``) and ``accumulate_dtype`` (the dtype a 16-bit kernel
    accumulates and carries its states in; None: float32, what production kernels do; pass the
    input dtype itself, e.g. "bfloat16", for a kernel that rounds everything to it, whose bound
    is then usually infinite, so only non-finite values fail). Built-in kernels carry their own
    (chunked: 64, scan: 1, both accumulating in float32). ``operand_dtype``: the format a user
    kernel rounds its matmul operands to beyond its dtype (e.g. "bfloat16" for a float32 kernel
    that casts both sides of each dot, or a bfloat16 one that casts its float32 intermediates back
    before the next dot); the reference kernels then round theirs to it too, and budget_ulps is
    in its units. ``dlog_alpha_form``: how a user kernel
    computes dlog_alpha, "identity" (the reverse-cumsum identity of flash-linear-attention's
    chunk kernels) or "direct" (the genuine terms of alpha_t <S_{t-1}, G_t>: a scan, autodiff of
    segment sums); None: unknown, held to the direct form's references (the most accurate), the
    identity's a field design of the envelope: an identity kernel reads less accurate, never FAIL.

    gate: "scalar" (log_alpha (B, H, T)) or "vector" (GLA's per-key-dimension gates, log_alpha
    (B, H, T, dk), drawn by every regime per dimension; ``mixed_dims`` mixes near-one, standard
    and strongly decayed dimensions). Any kernel takes them through its log_alpha argument.
    cu_seqlens: packed sequences. Offsets "0,5,5,40" (or a list of ints: 0 = c_0 <= ... <= c_N =
    T, empty sequences allowed) fix T = c_N, so ``seqs`` may only repeat it and regimes that set
    their own T (ragged, long) are refused; "random:N" packs N sequences of random lengths
    (``regimes.random_cu_seqlens(T, N, seed)``, empty ones included) into every T. Either way
    each config's batch becomes 1 (the sequences are the batch), h0 and h_T are (N, H, dk, dv),
    and every kernel receives the offsets as a keyword, ``cu_seqlens=`` (a concrete int64 NumPy
    array): a user kernel must take that keyword (else a usage error). Records carry ``gate`` and
    ``cu_seqlens`` (the offsets of the row, or null).

    Every measured record also says where the error is (``glaref._audit._where``): ``where``, the
    error profile of each output, and ``diagnosis``, a sentence naming the pattern of a failing
    row (null when it passes). probes: None (none run), True or "all" (every one), or names
    from ``glaref._audit._probes.PROBES`` (a list or "determinism,causality"): run on every fwd_bwd
    row, their results under the record's ``probes`` (null when none ran); a failing probe
    fails the row.

    shard: "I/N" runs the problems I, I + N, ... of the plan only (0 <= I < N), for schedulers
    that split an audit across machines or cores; ``glaref report merge`` (``_merge.merge``)
    joins the shards' JSON reports into the unsharded one.
    """
    unknown = sorted(set(options) - set(CLAIMS) - set(RUN_DEFAULTS))
    if unknown:
        raise TypeError(f"audit() got unexpected keyword argument(s) {unknown}, expected claims "
                        f"{CLAIMS} or options {tuple(RUN_DEFAULTS)}")
    run = {**RUN_DEFAULTS, **{k: v for k, v in options.items() if k in RUN_DEFAULTS}}
    claims = Claims(**{k: v for k, v in options.items() if k in CLAIMS})
    fam = _args.family(claims.recurrence)
    pre = _args.check_preset(preset, fam)
    impl_list = _args.split(impls) if impls is not None else list(pre.impls)
    made = _args.problems(seed, run["scale"], run["cu_seqlens"], run["oracle_impl"])
    rows = _args.rows(pre, made, configs=configs, seqs=seqs, modes=modes, regimes=regimes,
                      shard=run["shard"], fam=fam)
    reps = pre.repeats if run["repeats"] is None else _args.integer("repeats", run["repeats"], 0)
    if json_path is not None:
        json_path = _report.check_output(json_path, "json_path")
    how = JaxOptions(preset, run["precision"], run["backend"], reps, json_path, on_record,
                     progress, run["memory_guard"], check_probes(run["probes"]))
    return [r.to_json() for r in audit_jax(impl_list, rows, claims, how)]


@dataclass(frozen=True)
class JaxOptions:
    """How JAX kernels are run and where their rows go (``audit``'s arguments, checked)."""

    preset: str = "quick"
    precision: str = "default"
    backend: str | None = None
    repeats: int = 0
    json_path: str | None = None
    on_record: Callable[[dict], None] | None = None
    progress: Callable[[str], None] | None = None
    memory_guard: bool = True
    probes: tuple[str, ...] = ()

    def __post_init__(self):
        _args.choices("precision", self.precision, _verdict.PRECISIONS)
        if self.backend is not None and not isinstance(self.backend, str):
            raise AuditUsageError(f"backend: got {self.backend!r}, expected a platform name such "
                                  "as 'cpu' or 'gpu', or None", argument="backend")


def check_probes(probes) -> tuple[str, ...]:
    """``probes`` as the audit takes it (None/False, True/"all", or names), checked."""
    if probes is None or probes is False:
        return ()
    if probes is True or probes == "all":
        return _probes.PROBES
    return tuple(_args.choices("probes", probes, _probes.PROBES))


def audit_jax(impls: list, rows: _args.Rows | list[_args.Rows], claims: Claims,
              how: JaxOptions) -> list[_records.Record]:
    """The records of JAX kernels ``impls`` (checked arguments: the faces :func:`audit` and
    ``glaref.testing.check_kernel`` parse them); ``how.on_record`` receives each one's JSON
    form. ``rows`` may be several row sets of one family and scale (the same rows at several
    seeds, say), run one after the other by one runner: each kernel is traced and compiled once
    per shape for all of them (the JSON report's header is the first set's)."""
    if not impls:
        raise AuditUsageError("impl: got no kernel", argument="impl")
    row_sets = [rows] if isinstance(rows, _args.Rows) else list(rows)
    rows = row_sets[0]
    if any((r.family, r.scale, r.packing is None) != (rows.family, rows.scale,
                                                       rows.packing is None) for r in row_sets):
        raise AuditUsageError("rows: got row sets of different families, scales or packing, "
                              "expected one of each", argument="rows")
    _args.check_user_claims(impls, claims)
    jax = _device.import_jax()
    device = _device.select_device(how.backend)
    cdtype = _verdict.compute_dtype(claims.dtype, how.precision, device.platform)
    x64 = _device.x64_scope() if claims.dtype == "float64" else contextlib.nullcontext()
    with x64, jax.default_device(device):
        subjects = [resolve(i, claims=claims, compute_dtype=cdtype, precision=how.precision,
                            scale=rows.scale, packed=rows.packing is not None,
                            family=rows.family) for i in impls]
        runner = JaxRunner(device=device, dtype=claims.dtype, precision=how.precision,
                           layout=claims.layout, repeats=how.repeats,
                           memory_guard=how.memory_guard, family=rows.family)
        header = {"device": _device.device_info(device, how.precision),
                  "config": _records.header(device.platform, preset=how.preset, rows=rows,
                                            impls=[s.name for s in subjects], repeats=how.repeats,
                                            claims=claims, precision=how.precision)}
        writer = _report.JsonWriter(how.json_path, header) if how.json_path else None
        if writer:
            writer.write()
        sink = _Sink(sum(len(r.plan()) * len(r.modes) for r in row_sets) * len(subjects), writer,
                     how.on_record, how.progress)
        host = _device.host_available_bytes() if how.memory_guard else None
        for r in row_sets:
            run_rows(_Audit(runner, subjects, r, claims, host, how.probes), sink)
        return sink.records


def audit_kernel(kernel: Callable, rows: _args.Rows, claims: Claims, *, framework: str,
                 detected: bool = False, device: str | None = None,
                 memory_guard: bool = True, probes=None) -> list[_records.Record]:
    """Accuracy rows of one torch or NumPy kernel (``framework``), one record per row.

    The rows (``_args.rows``), problems, oracle, verdict and record format are :func:`audit`'s;
    the kernel is run by ``glaref._audit._frameworks.run_kernel`` (gradients through torch.autograd)
    instead of being compiled by JAX, so the timing and XLA memory fields are null. ``claims``:
    the kernel's, as ``glaref._audit._claims.Claims`` gave them (compute_dtype None: the inputs' dtype;
    "tf32" for float32 inputs multiplied as TF32). Packed sequences (``rows``' cu_seqlens) reach
    the kernel as the keyword ``cu_seqlens=``, which it must take. device: where a torch kernel's
    inputs go ("cpu" by default, "cuda"). detected: the framework was guessed from the kernel's
    code, so a kernel returning another framework's arrays fails with a message saying which
    ``framework=`` to pass.

    Records carry two keys of their own: ``framework``, and ``forward_only`` (the reason) on rows
    asked for fwd_bwd whose kernel is not differentiable (a NumPy kernel, a torch kernel whose
    outputs do not require grad): those are measured forward only and recorded as mode "fwd".
    A kernel that raises, or returns the wrong structure, is a failed row. Rows whose oracle side
    would not fit in the host's memory are skipped (``ok`` null) unless ``memory_guard`` is False.
    """
    if framework == "numpy":     # forward only: one "fwd" row where fwd_bwd was asked for
        rows = rows.only_forward()
    subject = framework_subject(kernel, claims, packed=rows.packing is not None)
    runner = FrameworkRunner(framework=framework, dtype=claims.dtype, layout=claims.layout,
                             scale=rows.scale, device=device, detected=detected,
                             operand_dtype=claims.operand_dtype, family=rows.family)
    host = _device.host_available_bytes() if memory_guard else None
    return run_rows(_Audit(runner, [subject], rows, claims, host,
                           check_probes(probes)),
                    _Sink(0, None, None, None))
