"""Probes: what no tolerance sees, each a pass/fail line of its own.

A tolerance compares one run of a kernel with the oracle. These probes compare runs of the kernel
with each other, on inputs built to expose one class of bug each:

    determinism      two runs on the same inputs give bit-identical outputs and gradients
    causality        inputs changed at t >= P leave o and dq at t < P bit-identical (o_t and
                     dq_t depend on steps s <= t only), and inputs changed at t < P (h0 too)
                     leave dk, dv at t >= P bit-identical (they depend on steps s >= t only)
    packed           with cu_seqlens: changing one sequence (its inputs, h0, cotangents) leaves
                     every other sequence's outputs and gradients bit-identical; NaN written into
                     padding past the last offset leaves everything before it bit-identical to
                     zeros there (run only when the kernel accepts offsets ending before T)
    cotangents       the gradients under structured cotangents (do zero but at one step and
                     dh_T = 0; dh_T alone; do alone) pass the verdict, as the random one does
    chunk_sweep      T = C - 1, C, C + 1, 2C - 1, 2C + 1 pass the verdict (C declared, or 64)

Bit-identical means equal bits of the returned values (compared after exact widening to float64,
so a -0 differs from a +0, and NaN equals NaN in the same place): a correct kernel adds exact
zeros for the masked terms, and the order of its sums does not depend on the values.

The probes run a kernel through a :class:`Runner` (a problem in, the kernel's outputs and
gradients out, as canonical float64 arrays), so a JAX, torch or NumPy kernel is probed the same
way (:func:`kernel_runner`, or :func:`function_runner` for a forward and a vjp given apart). The
recurrence is a parameter (:class:`Family`: which arrays have a time axis, which are per
sequence, how a problem is made), so that another family probes through the same code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from . import _judge
from ._frameworks import accepts, detect_framework, run_kernel
from ._inputs import _KIND, ARRAYS, Dims, Problem, from_canonical, kernel_returns, to_canonical
from ._problems import make_problem, round_to_dtype
from .regimes import random_cu_seqlens

PROBES = ("determinism", "causality", "packed", "cotangents", "chunk_sweep")
DEFAULT_CHUNK = 64            # the chunk sweep's C for a kernel that declares none
PACKED_SEQUENCES = 3          # sequences packed by the isolation probe
PADDING = 5                   # steps of NaN padding past the last offset


# ---------------------------------------------------------------- the family and the runner

@dataclass(frozen=True)
class Family:
    """What the probes need to know of a recurrence.

    inputs: the kernel's array arguments, in call order; cotangents: the cotangent arrays of the
    problem; timed: the arrays (inputs, cotangents, outputs, gradients ``d<input>``) whose axis 2
    is time; per_state: those whose axis 0 is the sequence (with packed sequences), not the
    batch; causal_outputs: outputs and gradients whose step t depends on steps s <= t only;
    anticausal_outputs: those whose step t depends on steps s >= t only (and not on the
    states before); make: (regime, dims, seed, dtype, cu_seqlens) -> Problem, rounded to dtype.
    """

    name: str
    inputs: tuple[str, ...]
    cotangents: tuple[str, ...]
    timed: frozenset
    per_state: frozenset
    causal_outputs: tuple[str, ...]
    anticausal_outputs: tuple[str, ...]
    make: Callable[..., Problem]


def _make_scalar(regime: str, dims: Dims, seed: int, dtype: str, cu_seqlens=None) -> Problem:
    return make_problem(regime, dims, seed, dtype, cu_seqlens=cu_seqlens)


GATED = Family(
    name="gated linear attention (scalar gates)",
    inputs=("q", "k", "v", "log_alpha", "h0"),
    cotangents=("do", "dh_T"),
    timed=frozenset({"q", "k", "v", "log_alpha", "do", "o", "dq", "dk", "dv", "dlog_alpha"}),
    per_state=frozenset({"h0", "dh_T", "h_T", "dh0"}),
    causal_outputs=("o", "dq"),
    anticausal_outputs=("dk", "dv"),
    make=_make_scalar,
)


class KernelFailed(Exception):
    """The kernel raised or returned something that cannot be read, on a probe's input."""


# A runner: (problem, grads) -> {"o", "h_T" (when returned), and with grads "d<input>"}, float64
# canonical arrays of what the kernel returned on the problem's (already rounded) arrays.
Runner = Callable[[Problem, bool], dict[str, np.ndarray]]


def kernel_runner(kernel: Callable, dtype: str, *, layout: str = "bhtd", scale: float = 1.0,
                  framework: str | None = None, device: str | None = None) -> Runner:
    """A Runner for ``kernel`` (JAX, torch or NumPy, as ``glaref._frameworks.run_kernel`` runs
    it: ``(q, k, v, log_alpha, h0) -> o | (o, h_T)`` in ``layout``, differentiated by its
    framework); packed problems pass their offsets as ``cu_seqlens=``."""
    fw = framework or detect_framework(kernel)

    def run(p: Problem, grads: bool) -> dict[str, np.ndarray]:
        fn = kernel if p.cu_seqlens is None else functools.partial(kernel, cu_seqlens=p.cu_seqlens)
        r = run_kernel(fn, p, dtype, layout=layout, scale=scale, framework=fw, grads=grads,
                       device=device)
        if r.error is not None:
            raise KernelFailed(f"{r.error['type']}: {(r.error['message'].splitlines() or [''])[0]}")
        out = dict(r.outputs)
        if grads:
            if r.grads is None:
                raise KernelFailed(f"no gradients: {r.no_grads}")
            out.update({f"d{n}": g for n, g in r.grads.items()})
        return out
    return run


def jax_runner(kernel: Callable, dtype: str, *, layout: str = "bhtd",
               scale: float | None = 1.0) -> Runner:
    """A Runner for a JAX kernel, compiled once per shape (``jax.jit`` of its forward and
    ``jax.vjp`` backward, as the audit runs it): much faster than :func:`kernel_runner`'s
    op-by-op calls when the probes run the same shapes again. ``scale`` reaches a kernel whose
    signature takes it (None: never passed, the kernel has it bound already)."""
    import jax
    import jax.numpy as jnp

    jd = jnp.dtype(dtype)
    kw = {"scale": float(scale)} if scale is not None and accepts(kernel, "scale") else {}
    programs: dict = {}

    def program(cu):
        key = None if cu is None else tuple(int(c) for c in cu)
        if key not in programs:
            fn = functools.partial(kernel, **kw) if cu is None else \
                functools.partial(kernel, cu_seqlens=np.asarray(cu), **kw)

            def f(q, k, v, la, h0, do, dh_T):
                out, pull = jax.vjp(fn, q, k, v, la, h0)
                if isinstance(out, (tuple, list)):
                    cts = type(out)([do.astype(out[0].dtype), dh_T.astype(out[1].dtype)])
                else:
                    cts = do.astype(out.dtype)
                return out, pull(cts)
            programs[key] = jax.jit(f)
        return programs[key]

    def run(p: Problem, grads: bool) -> dict[str, np.ndarray]:
        arrays = {}
        for n in ARRAYS:
            x = getattr(p, n)
            if x is None:       # dh_T None: zero
                x = np.zeros_like(p.h0)
            arrays[n] = jnp.asarray(np.asarray(from_canonical(x, _KIND[n], layout)).astype(jd))
        try:
            out, g = program(p.cu_seqlens)(*(arrays[n] for n in ARRAYS))
            out = jax.block_until_ready(out)
        except Exception as exc:            # the kernel's own error, reported as the probe's
            raise KernelFailed(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}") from exc
        got, final, problem = kernel_returns(out, p.dims, layout, p.n_states)
        if problem is not None:
            raise KernelFailed(problem)
        res = {n: to_canonical(np.asarray(x).astype(np.float64), _KIND[n], layout)
               for n, x in zip(("o", "h_T"), got)}
        if grads:
            res.update({f"d{n}": to_canonical(np.asarray(x).astype(np.float64), _KIND[n], layout)
                        for n, x in zip(("q", "k", "v", "log_alpha", "h0"), g)})
        return res
    return run


def function_runner(forward: Callable, vjp: Callable | None = None) -> Runner:
    """A Runner from two functions on canonical NumPy arrays (already rounded; the caller casts):
    ``forward(q, k, v, log_alpha, h0[, cu_seqlens=]) -> (o, h_T)`` and
    ``vjp(q, k, v, log_alpha, h0, do, dh_T[, cu_seqlens=]) -> (dq, dk, dv, dlog_alpha, dh0)``."""
    def run(p: Problem, grads: bool) -> dict[str, np.ndarray]:
        kw = {} if p.cu_seqlens is None else {"cu_seqlens": p.cu_seqlens}
        args = (p.q, p.k, p.v, p.log_alpha, p.h0)
        try:
            o, h_T = forward(*args, **kw)
            out = {"o": np.asarray(o, dtype=np.float64), "h_T": np.asarray(h_T, dtype=np.float64)}
            if grads:
                if vjp is None:
                    raise KernelFailed("no gradients: no vjp function given")
                dh_T = p.dh_T if p.dh_T is not None else np.zeros_like(out["h_T"])
                gs = vjp(*args, p.do, dh_T, **kw)
                out.update({f"d{n}": np.asarray(g, dtype=np.float64)
                            for n, g in zip(("q", "k", "v", "log_alpha", "h0"), gs)})
        except KernelFailed:
            raise
        except Exception as exc:          # the kernel's own error, reported as the probe's
            raise KernelFailed(f"{type(exc).__name__}: {exc}") from exc
        return out
    return run


# A judge: (problem, outputs) -> {output: reason} for every output that fails the verdict.
Judge = Callable[[Problem, dict[str, np.ndarray]], dict[str, str]]


def verdict_judge(*, scale: float = 1.0, oracle: str = "numba", claims=None,
                  dtypes: dict[str, str] | None = None, **declared) -> Judge:
    """The audit's verdict (``glaref._judge.assess_outputs``) as a Judge: the kernel's ``claims``
    (``glaref._claims.Claims``, resolved) or the claim keywords (compute_dtype, chunk_size, ...);
    ``dtypes``: the dtype name each output was returned in (default float32)."""
    def judge(p: Problem, out: dict[str, np.ndarray]) -> dict[str, str]:
        truth = _judge.Truth(p, scale, oracle)
        canon = {(n if n in ("o", "h_T") else n[1:]): x for n, x in out.items()}
        dts = {n: (dtypes or {}).get(n, "float32") for n in canon}
        grads = any(n.startswith("d") for n in out)
        per = _judge.assess_outputs(truth, canon, dts, final="h_T" in out, grads=grads,
                                    claims=claims, **declared)
        return {n: a.reason for n, a in per.items() if not a.ok}
    return judge


# ---------------------------------------------------------------- results

class ProbeResult(NamedTuple):
    """One probe's line: passed (True/False, None when it could not run), and what it found."""

    probe: str
    passed: bool | None
    detail: str

    def line(self) -> str:
        mark = {True: "pass", False: "FAIL", None: "n/a"}[self.passed]
        return f"probe {self.probe:<12} {mark:<4}  {self.detail}"

    def summary(self) -> dict[str, Any]:
        return self._asdict()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    nan = np.isnan(a) & np.isnan(b)
    return bool(np.array_equal(np.where(nan, 0.0, a).view(np.uint64),
                               np.where(nan, 0.0, b).view(np.uint64)))


def _first_diff(a: np.ndarray, b: np.ndarray) -> tuple[int, ...] | None:
    diff = ~((a == b) | (np.isnan(a) & np.isnan(b))) | (np.signbit(a) != np.signbit(b))
    idx = np.argwhere(diff)
    return tuple(int(i) for i in idx[0]) if idx.size else None


def _differences(x: dict[str, np.ndarray], y: dict[str, np.ndarray], where=None) -> list[str]:
    """The outputs whose selected parts differ in a bit, each with its first differing index;
    ``where``: {name: index expression} of the parts compared (all of every output when None)."""
    bad = []
    names = x if where is None else where
    for n in names:
        if n not in x or n not in y:
            continue
        sel = (slice(None),) if where is None else where[n]
        a, b = np.asarray(x[n])[sel], np.asarray(y[n])[sel]
        if a.size and not _same(a, b):
            i = _first_diff(np.asarray(a, np.float64), np.asarray(b, np.float64))
            bad.append(f"{n} at {i}")
    return bad


def _guard(probe: str, body: Callable[[], ProbeResult]) -> ProbeResult:
    try:
        return body()
    except KernelFailed as exc:
        return ProbeResult(probe, False, f"the kernel failed on the probe's input: {exc}")


# ---------------------------------------------------------------- the probes

def determinism(run: Runner, p: Problem, family: Family = GATED) -> ProbeResult:
    """Two runs on the same inputs: outputs and gradients bit-identical."""
    def body():
        a, b = run(p, True), run(p, True)
        bad = _differences(a, b)
        if bad:
            return ProbeResult("determinism", False, "two runs on the same inputs differ: "
                               + ", ".join(bad))
        return ProbeResult("determinism", True, f"two runs bit-identical ({len(a)} arrays)")
    return _guard("determinism", body)


def _resample(p: Problem, family: Family, rng: np.random.Generator, steps: slice,
              states=None, dtype: str = "float64", state_names=None) -> Problem:
    """``p`` with every timed input and cotangent replaced by fresh values on ``steps`` (the same
    magnitudes: each element times a random factor in [0.5, 1.5), log_alpha kept negative by the
    same factors), and the per-state arrays (those of ``state_names``, all by default) on
    ``states`` likewise."""
    new = {}
    for n in family.inputs + family.cotangents:
        if states is not None and n in family.per_state and state_names is not None \
                and n not in state_names:
            continue
        x = getattr(p, n)
        if x is None:
            continue
        y = np.array(x, copy=True)
        sel = (slice(None), slice(None), steps) if n in family.timed else \
            states if states is not None and n in family.per_state else None
        if sel is None:
            continue
        part = y[sel]
        # log_alpha keeps its sign (only scaled); the others also get a shift
        shift = 0.0 if n == "log_alpha" else 0.1 * rng.standard_normal(part.shape)
        y[sel] = part * rng.uniform(0.5, 1.5, part.shape) + shift
        new[n] = round_to_dtype(y, dtype)
    return p._replace(**new)


def causality(run: Runner, p: Problem, family: Family = GATED, *, split: int | None = None,
              dtype: str = "float64", seed: int = 0, chunk_size: int | None = None) -> ProbeResult:
    """Inputs changed at t >= P leave the causal outputs (o, dq) at t < P bit-identical; inputs
    changed at t < P (and h0) leave the anticausal ones (dk, dv) bit-identical from the first
    chunk boundary at or after P on (within P's chunk a kernel whose decays are differences of
    in-chunk prefix sums, as flash-linear-attention's, rounds them with the earlier steps' gates:
    a dependence in the last bit only; C: ``chunk_size``, or DEFAULT_CHUNK when unknown). P: the
    middle of T by default, placed inside a chunk for chunked kernels (an odd step)."""
    T = p.dims.T
    P = split if split is not None else (T // 2) | 1
    if not 0 < P < T:
        return ProbeResult("causality", None, f"T = {T} has no step to split at")
    C = chunk_size if chunk_size else DEFAULT_CHUNK
    Q = -(-P // C) * C                     # anticausal outputs compared on t >= Q

    def body():
        rng = np.random.default_rng(seed)
        base = run(p, True)
        late = run(_resample(p, family, rng, slice(P, None), dtype=dtype), True)
        # the initial states change too, never the final state's cotangent (dk, dv depend on it)
        early = run(_resample(p, family, rng, slice(0, P), states=slice(None), dtype=dtype,
                              state_names=family.inputs), True)
        before = {n: (slice(None), slice(None), slice(0, P)) for n in family.causal_outputs}
        after = {n: (slice(None), slice(None), slice(Q, None)) for n in family.anticausal_outputs}
        bad = [f"{d} (inputs changed at t >= {P})" for d in _differences(base, late, before)]
        if Q < T:
            bad += [f"{d}, counted from t = {Q} (inputs changed at t < {P})"
                    for d in _differences(base, early, after)]
        if bad:
            return ProbeResult("causality", False, "outputs depend on steps they cannot: "
                               + "; ".join(bad))
        anti = (f"; {', '.join(family.anticausal_outputs)} at t >= {Q} unchanged by t < {P}"
                if Q < T else "")
        return ProbeResult("causality", True, f"{', '.join(family.causal_outputs)} at t < {P} "
                           f"unchanged by t >= {P}{anti}")
    return _guard("causality", body)


def packed(run: Runner, regime: str, dims: Dims, seed: int, dtype: str,
           family: Family = GATED) -> ProbeResult:
    """Packed sequences: changing sequence m (its steps, h0[m], dh_T[m] and do on its steps)
    leaves every other sequence's outputs and gradients bit-identical; NaN in padding past the
    last offset leaves everything before it as zeros there would."""
    T = dims.T
    if T < PACKED_SEQUENCES:
        return ProbeResult("packed", None, f"T = {T} is shorter than {PACKED_SEQUENCES} sequences")
    cu = np.asarray(random_cu_seqlens(T, PACKED_SEQUENCES, seed))
    lengths = np.diff(cu)
    if np.count_nonzero(lengths) < PACKED_SEQUENCES:    # every sequence non-empty
        cu = np.linspace(0, T, PACKED_SEQUENCES + 1).astype(np.int64)
        lengths = np.diff(cu)
    d1 = Dims(1, dims.G, dims.H, T, dims.dk, dims.dv)
    p = family.make(regime, d1, seed, dtype, cu)
    m = int(np.argmax(lengths))          # the longest sequence is the one changed

    def body():
        rng = np.random.default_rng(seed + 1)
        try:
            base = run(p, True)
        except KernelFailed as exc:
            return ProbeResult("packed", None, f"not run: the kernel does not take packed "
                               f"sequences (cu_seqlens={cu.tolist()}: {exc})")
        changed = run(_resample(p, family, rng, slice(int(cu[m]), int(cu[m + 1])),
                                states=slice(m, m + 1), dtype=dtype), True)
        where = {}
        others = [n for n in range(len(lengths)) if n != m]
        for name in base:
            if name in family.timed:
                keep = np.concatenate([np.arange(cu[n], cu[n + 1]) for n in others])
                where[name] = (slice(None), slice(None), keep)
            elif name in family.per_state:
                where[name] = (np.array(others),)
        bad = _differences(base, changed, where)
        detail = [f"offsets {cu.tolist()}"]
        if bad:
            return ProbeResult("packed", False, f"changing sequence {m} changed other sequences' "
                               f"outputs: {', '.join(bad)} ({detail[0]})")
        pad = _padding(run, p, family, dtype)
        if pad is not None and pad[0] is False:
            return ProbeResult("packed", False, pad[1])
        detail.append(f"changing sequence {m} leaves the others bit-identical")
        detail.append(pad[1] if pad is not None else "padding not probed (the kernel refuses "
                      "offsets that end before T)")
        return ProbeResult("packed", True, "; ".join(detail))
    return _guard("packed", body)


def _padding(run: Runner, p: Problem, family: Family, dtype: str) -> tuple[bool, str] | None:
    """(passed, detail) of NaN padding past the last offset, or None when the kernel refuses
    arrays longer than the offsets' end."""
    T = p.dims.T

    def padded(fill: float) -> Problem:
        new = {}
        for n in family.inputs + family.cotangents:
            x = getattr(p, n)
            if x is not None and n in family.timed:
                shape = list(x.shape)
                shape[2] = PADDING
                new[n] = np.concatenate([x, np.full(shape, fill)], axis=2)
        return p._replace(dims=Dims(p.dims.B, p.dims.G, p.dims.H, T + PADDING, p.dims.dk,
                                    p.dims.dv), **new)
    try:
        zeros = run(padded(0.0), True)
    except KernelFailed:
        return None
    try:
        nans = run(padded(np.nan), True)
    except KernelFailed as exc:
        return False, f"NaN in the padding past offset {T} made the kernel fail: {exc}"
    where = {n: (slice(None), slice(None), slice(0, T)) for n in zeros if n in family.timed}
    where.update({n: (slice(None),) for n in zeros if n in family.per_state})
    bad = _differences(zeros, nans, where)
    if bad:
        return False, (f"NaN in the padding past offset {T} reached the sequences: "
                       + ", ".join(bad))
    return True, f"NaN in {PADDING} steps of padding past offset {T} reaches nothing"


def _failed(what: str, fails: dict[str, str]) -> str:
    """One case's failures: the outputs, and the first one's reason."""
    first = next(iter(fails.values()))
    return f"{what}: {', '.join(fails)} fail (first: {first})"


def cotangents(run: Runner, p: Problem, judge: Judge, family: Family = GATED) -> ProbeResult:
    """The gradients under structured cotangents pass the verdict: do zero but at one step
    (t = T // 3) with dh_T = 0; dh_T alone (do = 0); do alone (dh_T = 0)."""
    T = p.dims.T
    t0 = T // 3
    one = np.zeros_like(p.do)
    one[:, :, t0] = p.do[:, :, t0]
    zero_h = np.zeros_like(p.dh_T) if p.dh_T is not None else None
    cases = {f"do at t = {t0} only": p._replace(do=one, dh_T=zero_h),
             "do alone": p._replace(dh_T=zero_h)}
    if p.dh_T is not None:
        cases["dh_T alone"] = p._replace(do=np.zeros_like(p.do))

    def body():
        bad = []
        for what, q in cases.items():
            fails = judge(q, run(q, True))
            if fails:
                bad.append(_failed(what, fails))
        if bad:
            return ProbeResult("cotangents", False, " | ".join(bad))
        return ProbeResult("cotangents", True, f"{', '.join(cases)}: every gradient passes")
    return _guard("cotangents", body)


def chunk_sweep(run: Runner, regime: str, dims: Dims, seed: int, dtype: str, judge: Judge, *,
                chunk_size: int | None, family: Family = GATED) -> ProbeResult:
    """T = C - 1, C, C + 1, 2C - 1, 2C + 1 (C declared, or DEFAULT_CHUNK) pass the verdict."""
    C = chunk_size if chunk_size and chunk_size > 1 else DEFAULT_CHUNK
    Ts = [t for t in (C - 1, C, C + 1, 2 * C - 1, 2 * C + 1) if t >= 1]

    def body():
        bad = []
        for T in Ts:
            p = family.make(regime, Dims(dims.B, dims.G, dims.H, T, dims.dk, dims.dv), seed, dtype)
            fails = judge(p, run(p, True))
            if fails:
                bad.append(_failed(f"T = {T}", fails))
        if bad:
            return ProbeResult("chunk_sweep", False, " | ".join(bad))
        return ProbeResult("chunk_sweep", True, f"C = {C}: T = {', '.join(map(str, Ts))} pass")
    return _guard("chunk_sweep", body)


def run_probes(run: Runner, regime: str, dims: Dims, seed: int, dtype: str, judge: Judge, *,
               chunk_size: int | None = None, family: Family = GATED,
               which=PROBES) -> list[ProbeResult]:
    """Every probe in ``which`` on the problem (regime, dims, seed, dtype) of a row; ``judge``
    the verdict for the probes that judge (cotangents, chunk_sweep)."""
    for w in which:
        if w not in PROBES:
            raise ValueError(f"probes: got {w!r}, expected names from {PROBES}")
    p = family.make(regime, dims, seed, dtype)
    out = []
    unstable = None       # bit-identity cannot be judged when two runs already differ
    for w in which:
        if w == "determinism":
            out.append(determinism(run, p, family))
            if out[-1].passed is False:
                unstable = "not judged: two runs on the same inputs already differ (determinism)"
        elif w in ("causality", "packed") and unstable:
            out.append(ProbeResult(w, None, unstable))
        elif w == "causality":
            out.append(causality(run, p, family, dtype=dtype, seed=seed, chunk_size=chunk_size))
        elif w == "packed":
            out.append(packed(run, regime, dims, seed, dtype, family))
        elif w == "cotangents":
            out.append(cotangents(run, p, judge, family))
        else:
            out.append(chunk_sweep(run, regime, dims, seed, dtype, judge, chunk_size=chunk_size,
                                   family=family))
    return out
