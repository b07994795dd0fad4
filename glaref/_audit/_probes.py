"""Probes: what no tolerance sees, each a pass/fail line of its own.

A tolerance compares one run of a kernel with the oracle. These probes compare runs of the kernel
with each other, on inputs built to expose one class of bug each:

    determinism      two runs on the same inputs give bit-identical outputs and gradients
    causality        inputs changed at t >= P leave o and dq at t < P bit-identical (o_t and
                     dq_t depend on steps s <= t only), and inputs changed at t < P (h0 too)
                     leave dk, dv at t >= P bit-identical (they depend on steps s >= t only)
    packed           with cu_seqlens (three sequences at [0, P // 2, P, end]): changing the
                     middle one (its inputs, h0, cotangents) leaves the others' outputs and
                     gradients bit-identical; NaN written into padding past the last offset
                     leaves everything before it bit-identical to zeros there (run only when the
                     kernel accepts offsets ending before T); causality reuses the same packing
                     to see the states before P whole (h_T of the sequences ending by P)
    cotangents       the gradients under structured cotangents (do zero but at one step and
                     dh_T = 0; dh_T alone; do alone) pass the verdict, as the random one does
    chunk_sweep      T = C - 1, C, C + 1, 2C - 1, 2C + 1 pass the verdict (C declared, or 64)

Bit-identical means equal bits of the returned values (compared after exact widening to float64,
so a -0 differs from a +0, and NaN equals NaN in the same place): a correct kernel adds exact
zeros for the masked terms, and the order of its sums does not depend on the values.

The probes run a kernel through a :class:`Runner` (a problem in, the kernel's outputs and
gradients out, as canonical float64 arrays), so a JAX, torch or NumPy kernel is probed the same
way (:func:`kernel_runner`, or :func:`function_runner` for a forward and a vjp given apart). The
recurrence is the audit's family value (``glaref._audit._family.Family``), a parameter of every
probe: its array names and layout kinds (which arrays have a time axis, which are per sequence),
its problem maker and oracle, the outputs it declares causal or anticausal and how its inputs
are perturbed. Nothing here names one family's arrays, so a second family probes through the
same code.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from .._inputs import Dims, Problem, from_canonical, kernel_returns, to_canonical
from .._rounding import round_to_dtype
from ._frameworks import Call, accepts, detect_framework, run_kernel

if TYPE_CHECKING:
    from ._family import Family

PROBES = ("determinism", "causality", "packed", "cotangents", "chunk_sweep")
DEFAULT_CHUNK = 64            # the chunk sweep's C for a kernel that declares none
PADDING = 5                   # steps of NaN padding past the last offset
SWEEP_HEADS = 2               # heads of the chunk sweep's problems (B = 1, one group)


# ---------------------------------------------------------------- the family and the runner

@dataclass(frozen=True)
class _View:
    """What the probes read of a recurrence family (``glaref._audit._family.Family``), in the
    runners' spelling (a gradient as ``d<input>``).

    inputs: the kernel's array arguments, in call order; cotangents: the problem's other arrays,
    in the order of the outputs they belong to; outputs, grads: the runners' keys; kinds: the
    layout kind of each array, output and gradient; timed: those whose axis 2 is time (every
    kind but "state"); per_state: those whose axis 0 is the sequence with packed sequences (kind
    "state"); causal, anticausal: outputs and gradients whose step t depends on steps s <= t
    only, or s >= t only (the family's ``causal``, ``anticausal``); make: (regime, dims, seed,
    dtype, cu_seqlens=) -> problem; perturb: (name, values, rng) -> new values of the same
    magnitudes; truth: the family's oracle side of a problem."""

    inputs: tuple[str, ...]
    cotangents: tuple[str, ...]
    outputs: tuple[str, ...]
    grads: tuple[str, ...]
    kinds: dict
    timed: frozenset
    per_state: frozenset
    causal: tuple[str, ...]
    anticausal: tuple[str, ...]
    make: Callable[..., Problem]
    perturb: Callable[[str, np.ndarray, np.random.Generator], np.ndarray]
    truth: Callable[..., Any]


def perturb(name: str, part: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Fresh values of the same magnitudes: each element times a random factor in [0.5, 1.5)
    plus a shift of 0.1 standard normal (a family whose inputs have a sign or a range to keep
    gives its own ``perturb``)."""
    shift = 0.1 * rng.standard_normal(part.shape)
    return part * rng.uniform(0.5, 1.5, part.shape) + shift


def view(family) -> _View:
    """The probes' reading of ``family`` (``glaref._audit._family.Family``)."""
    cts = tuple(n for n in family.arrays if n not in family.inputs)
    grads = tuple(f"d{n}" for n in family.grads)
    kinds = {**family.kinds, **{f"d{n}": family.kinds[n] for n in family.grads}}
    names = family.inputs + cts + tuple(family.outputs) + grads
    return _View(
        inputs=tuple(family.inputs), cotangents=cts, outputs=tuple(family.outputs), grads=grads,
        kinds=kinds, timed=frozenset(n for n in names if kinds[n] != "state"),
        per_state=frozenset(n for n in names if kinds[n] == "state"),
        causal=tuple(family.causal), anticausal=tuple(family.anticausal),
        make=family.make_problem, perturb=family.perturb or perturb, truth=family.truth)


class KernelFailed(Exception):
    """The kernel raised or returned something that cannot be read, on a probe's input."""


# A runner: (problem, grads) -> {"o", "h_T" (when returned), and with grads "d<input>"}, float64
# canonical arrays of what the kernel returned on the problem's (already rounded) arrays.
Runner = Callable[[Problem, bool], dict[str, np.ndarray]]


def kernel_runner(kernel: Callable, dtype: str, *, layout: str = "bhtd", scale: float = 1.0,
                  framework: str | None = None, device: str | None = None,
                  family: Family | None = None) -> Runner:
    """A Runner for ``kernel`` (JAX, torch or NumPy, as ``glaref._audit._frameworks.run_kernel`` runs
    it: ``(q, k, v, log_alpha, h0) -> o | (o, h_T)`` in ``layout``, or ``family``'s arguments,
    differentiated by its framework); packed problems pass their offsets as ``cu_seqlens=``."""
    call = Call(layout, scale, framework or detect_framework(kernel), device, family)

    def run(p: Problem, grads: bool) -> dict[str, np.ndarray]:
        fn = kernel if p.cu_seqlens is None else functools.partial(kernel, cu_seqlens=p.cu_seqlens)
        r = run_kernel(fn, p, dtype, grads=grads, call=call)
        if r.error is not None:
            raise KernelFailed(f"{r.error['type']}: {(r.error['message'].splitlines() or [''])[0]}")
        out = dict(r.outputs)
        if grads:
            if r.grads is None:
                raise KernelFailed(f"no gradients: {r.no_grads}")
            out.update({f"d{n}": g for n, g in r.grads.items()})
        return out
    return run


class JaxProbeRunner:
    """A Runner for a JAX kernel that compiles as little as it can: the forward and its
    ``jax.vjp`` backward jitted once per packing (offsets), so every run of one shape after the
    first is a call; the row's own compiled program (:meth:`use_row`) for problems of the row's
    shape, so that the probes run at that shape compile nothing; and :meth:`many`, which runs
    problems of different shapes through *one* compiled program (one XLA compilation for the
    chunk sweep's five lengths instead of five). Keep one per kernel for a whole audit: its
    programs serve every row. ``scale`` reaches a kernel whose signature takes it (None: never
    passed, the kernel has it bound already)."""

    def __init__(self, kernel: Callable, dtype: str, family: Family, *, layout: str = "bhtd",
                 scale: float | None = 1.0):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        self.kernel, self.layout, self.names = kernel, layout, view(family)
        self.jd = jnp.dtype(dtype)
        self.kw = {"scale": float(scale)} if scale is not None and accepts(kernel, "scale") else {}
        self._fns: dict = {}          # offsets -> the differentiated function (not jitted)
        self._jitted: dict = {}       # offsets -> jax.jit of it (jit caches one program per shape)
        self._many: dict = {}         # (offsets, ...) -> jax.jit of the functions side by side
        self._joint: dict = {}        # (shapes, offsets) -> (program, position, its argument sets)
        self._row = None              # (shapes, compiled program, its arguments' dtypes)
        self.compiles = 0             # programs this runner compiled (the row's not counted)

    def _fn(self, cu):
        key = None if cu is None else tuple(int(c) for c in cu)
        if key not in self._fns:
            jax = self.jax
            fn = functools.partial(self.kernel, **self.kw) if cu is None else \
                functools.partial(self.kernel, cu_seqlens=np.asarray(cu), **self.kw)

            n_in = len(self.names.inputs)

            def f(*arrays):
                # the kernel's inputs, then one cotangent per output it may return
                out, pull = jax.vjp(fn, *arrays[:n_in])
                if isinstance(out, (tuple, list)):
                    cts = type(out)([c.astype(x.dtype) for c, x in zip(arrays[n_in:], out)])
                else:
                    cts = arrays[n_in].astype(out.dtype)
                return out, pull(cts)
            self._fns[key] = f
        return key, self._fns[key]

    def use_row(self, p: Problem, compiled, dtypes: tuple) -> None:
        """Run problems shaped as ``p`` (unpacked) through ``compiled``, the audit row's own
        program ``(inputs..., cotangents...) -> (outputs, gradients)`` with its
        arguments in ``dtypes`` (``glaref._audit._runners.fwd_bwd_program``)."""
        self._row = None if p.cu_seqlens is not None else (self._shapes(p), compiled, dtypes)

    def _shapes(self, p: Problem) -> tuple:
        return tuple(np.shape(getattr(p, n)) for n in self.names.inputs)

    def _signature(self, p: Problem) -> tuple:
        cu = None if p.cu_seqlens is None else tuple(int(c) for c in p.cu_seqlens)
        return self._shapes(p), cu

    def _arrays(self, p: Problem) -> list:
        nm, out = self.names, []
        for n in nm.inputs + nm.cotangents:
            x = getattr(p, n)
            if x is None:       # a final state's cotangent not given: zero, shaped as h0
                x = np.zeros_like(next(getattr(p, i) for i in nm.inputs
                                       if nm.kinds[i] == nm.kinds[n]))
            out.append(self.jnp.asarray(np.asarray(from_canonical(x, nm.kinds[n], self.layout))
                                        .astype(self.jd)))
        return out

    def _read(self, p: Problem, out, g) -> dict[str, np.ndarray]:
        got, _, problem = kernel_returns(out, p.dims, self.layout, p.n_states)
        if problem is not None:
            raise KernelFailed(problem)
        nm = self.names
        return {n: to_canonical(np.asarray(x).astype(np.float64), nm.kinds[n], self.layout)
                for n, x in [*zip(nm.outputs, got), *zip(nm.grads, g)]}

    def _call(self, program, args):
        try:
            return self.jax.block_until_ready(program(*args))
        except Exception as exc:            # the kernel's own error, reported as the probe's
            raise KernelFailed(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}") \
                from exc

    def __call__(self, p: Problem, grads: bool) -> dict[str, np.ndarray]:
        args = self._arrays(p)
        if self._row is not None and p.cu_seqlens is None and self._shapes(p) == self._row[0]:
            _, compiled, dtypes = self._row
            out, g = self._call(compiled, [a.astype(d) for a, d in zip(args, dtypes)])
        elif self._signature(p) in self._joint:
            # a shape compiled side by side with others (``many``): the others' last inputs
            # ride along, their outputs are dropped
            program, i, sets = self._joint[self._signature(p)]
            sets[i] = args
            out, g = self._call(program, sets)[i]
        else:
            key, f = self._fn(p.cu_seqlens)
            if key not in self._jitted:
                self._jitted[key] = self.jax.jit(f)
            before = self._jitted[key]._cache_size()
            out, g = self._call(self._jitted[key], args)
            self.compiles += self._jitted[key]._cache_size() - before
        res = self._read(p, out, g)
        return res if grads else {n: x for n, x in res.items() if n in self.names.outputs}

    def many(self, problems: list[Problem]) -> list[dict[str, np.ndarray]]:
        """The outputs and gradients of every problem, from one program that runs them side by
        side (compiled once per set of shapes and offsets). Later calls on one of their shapes
        run through the same program."""
        fns = [self._fn(p.cu_seqlens) for p in problems]
        key = tuple((self._shapes(p), k) for p, (k, _) in zip(problems, fns))
        if key not in self._many:
            def side_by_side(*sets):
                return [f(*s) for (_, f), s in zip(fns, sets)]
            self._many[key] = self.jax.jit(side_by_side)
        program = self._many[key]
        sets = [self._arrays(p) for p in problems]
        before = program._cache_size()
        results = self._call(program, sets)
        self.compiles += program._cache_size() - before
        for i, p in enumerate(problems):
            self._joint.setdefault(self._signature(p), (program, i, list(sets)))
        return [self._read(p, out, g) for p, (out, g) in zip(problems, results)]


def jax_runner(kernel: Callable, dtype: str, family: Family, *, layout: str = "bhtd",
               scale: float | None = 1.0) -> JaxProbeRunner:
    """A Runner for a JAX kernel, compiled once per shape (``jax.jit`` of its forward and
    ``jax.vjp`` backward, as the audit runs it): :class:`JaxProbeRunner`."""
    return JaxProbeRunner(kernel, dtype, family, layout=layout, scale=scale)


def run_many(run: Runner, problems: list[Problem]) -> list[dict[str, np.ndarray]]:
    """Every problem through ``run`` with gradients: in one program when the runner can
    (``many``, :class:`JaxProbeRunner`), else one after the other."""
    many = getattr(run, "many", None)
    return many(problems) if many is not None else [run(p, True) for p in problems]


def function_runner(family: Family, forward: Callable, vjp: Callable | None = None) -> Runner:
    """A Runner from two functions on canonical NumPy arrays (already rounded; the caller casts),
    in the order of ``family``'s arrays: ``forward(*inputs[, cu_seqlens=]) -> outputs`` (every
    one, the final state too) and ``vjp(*inputs, *cotangents[, cu_seqlens=]) -> gradients`` (for
    the scalar gate: ``forward(q, k, v, log_alpha, h0) -> (o, h_T)``, ``vjp(q, k, v, log_alpha,
    h0, do, dh_T) -> (dq, dk, dv, dlog_alpha, dh0)``)."""
    nm = view(family)

    def run(p: Problem, grads: bool) -> dict[str, np.ndarray]:
        kw = {} if p.cu_seqlens is None else {"cu_seqlens": p.cu_seqlens}
        args = tuple(getattr(p, n) for n in nm.inputs)
        try:
            out = {n: np.asarray(x, dtype=np.float64)
                   for n, x in zip(nm.outputs, forward(*args, **kw))}
            if grads:
                if vjp is None:
                    raise KernelFailed("no gradients: no vjp function given")
                # a cotangent not given (the final state's): zero, shaped as its output
                cts = [getattr(p, c) if getattr(p, c) is not None else np.zeros_like(out[o])
                       for c, o in zip(nm.cotangents, nm.outputs)]
                out.update({n: np.asarray(g, dtype=np.float64)
                            for n, g in zip(nm.grads, vjp(*args, *cts, **kw))})
        except KernelFailed:
            raise
        except Exception as exc:          # the kernel's own error, reported as the probe's
            raise KernelFailed(f"{type(exc).__name__}: {exc}") from exc
        return out
    return run


# A judge: (problem, outputs) -> {output: reason} for every output that fails the verdict.
Judge = Callable[[Problem, dict[str, np.ndarray]], dict[str, str]]


def verdict_judge(family: Family, *, scale: float = 1.0, oracle: str = "numba", claims=None,
                  dtypes: dict[str, str] | None = None, truths: dict | None = None,
                  **declared) -> Judge:
    """The audit's verdict (``family.judge.assess_outputs``, for the scalar gate
    ``glaref.gla._judge.assess_outputs``, on ``family``'s oracle side, ``family.truth``) as a
    Judge: the kernel's ``claims`` (``glaref._audit._claims.Claims``, resolved) or the claim keywords
    (compute_dtype, chunk_size, ...); ``dtypes``: the dtype name each output was returned in
    (default float32). ``truths``: a dict in which the oracle's side of
    each problem is kept by the problem's contents (:func:`problem_key`), so that the judges of
    several kernels on the same probe problems compute it once (its reference kernels cached by
    design within it)."""
    nm = view(family)
    assess = family.judge.assess_outputs

    def judge(p: Problem, out: dict[str, np.ndarray]) -> dict[str, str]:
        if truths is None:
            truth = nm.truth(p, scale, oracle)
        else:
            key = (problem_key(p, nm), scale, oracle)
            truth = truths.get(key)
            if truth is None:
                truth = truths[key] = nm.truth(p, scale, oracle)
        canon = {(n if n in nm.outputs else n[1:]): x for n, x in out.items()}
        dts = {n: (dtypes or {}).get(n, "float32") for n in canon}
        grads = any(n in nm.grads for n in out)
        per = assess(truth, canon, dts, final=nm.outputs[-1] in out, grads=grads,
                     claims=claims, **declared)
        return {n: a.reason for n, a in per.items() if not a.ok}
    return judge


def problem_key(p: Problem, names: _View) -> tuple:
    """A problem by its contents: its dims, offsets and a digest of every array's bytes."""
    h = hashlib.blake2b(digest_size=16)
    for n in names.inputs + names.cotangents:
        x = getattr(p, n)
        h.update(n.encode() + (b"-" if x is None else
                               np.ascontiguousarray(x).view(np.uint8).tobytes()))
    cu = None if p.cu_seqlens is None else tuple(int(c) for c in p.cu_seqlens)
    return p.dims, cu, h.hexdigest()


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


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where a and b differ in a bit (after exact widening: -0 differs from +0, NaN equals NaN)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return ~((a == b) | (np.isnan(a) & np.isnan(b))) | (np.signbit(a) != np.signbit(b))


def _differences(x: dict[str, np.ndarray], y: dict[str, np.ndarray], where=None) -> list[str]:
    """The outputs whose selected parts differ in a bit, each with its first differing index
    (in the whole array); ``where``: {name: index expression} of the parts compared (all of
    every output when None)."""
    bad = []
    names = x if where is None else where
    for n in names:
        if n not in x or n not in y:
            continue
        a, b = np.asarray(x[n]), np.asarray(y[n])
        if a.shape != b.shape:
            bad.append(f"{n} (shape {b.shape}, was {a.shape})")
            continue
        mask = np.ones(a.shape, dtype=bool)
        if where is not None:
            mask[:] = False
            mask[where[n]] = True
        idx = np.argwhere(_differs(a, b) & mask)
        if idx.size:
            bad.append(f"{n} at {tuple(int(i) for i in idx[0])}")
    return bad


def _guard(probe: str, body: Callable[[], ProbeResult]) -> ProbeResult:
    try:
        return body()
    except KernelFailed as exc:
        return ProbeResult(probe, False, f"the kernel failed on the probe's input: {exc}")


# ---------------------------------------------------------------- the probes

def determinism(run: Runner, p: Problem) -> ProbeResult:
    """Two runs on the same inputs: outputs and gradients bit-identical."""
    def body():
        a, b = run(p, True), run(p, True)
        bad = _differences(a, b)
        if bad:
            return ProbeResult("determinism", False, "two runs on the same inputs differ: "
                               + ", ".join(bad))
        return ProbeResult("determinism", True, f"two runs bit-identical ({len(a)} arrays)")
    return _guard("determinism", body)


def _resample(p: Problem, family: _View, rng: np.random.Generator, steps: slice,
              states=None, dtype: str = "float64", state_names=None) -> Problem:
    """``p`` with every timed input and cotangent replaced by fresh values on ``steps`` (the same
    magnitudes: the family's ``perturb``), and the per-state arrays (those of ``state_names``,
    all by default) on ``states`` likewise."""
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
        y[sel] = family.perturb(n, y[sel], rng)
        new[n] = round_to_dtype(y, dtype)
    return p.with_fields(**new)


def _pad(p: Problem, family: _View, fill: float) -> Problem:
    """``p`` with PADDING steps of ``fill`` appended to every timed input and cotangent (its
    offsets unchanged: the padding lies past the last one)."""
    new = {}
    for n in family.inputs + family.cotangents:
        x = getattr(p, n)
        if x is not None and n in family.timed:
            shape = list(x.shape)
            shape[2] = PADDING
            new[n] = np.concatenate([x, np.full(shape, fill)], axis=2)
    d = p.dims
    return p.with_fields(dims=Dims(d.B, d.G, d.H, d.T + PADDING, d.dk, d.dv), **new)


def split_step(T: int) -> int:
    """P, the step causality splits at: the middle of T, odd (inside a chunk for chunked
    kernels, whose chunks are even)."""
    return (T // 2) | 1


class Packing:
    """The packed problem that causality and packed share, so that both run one compiled
    program: B = 1, T steps (the row's), three sequences at offsets [0, P // 2, P, end] (P =
    :func:`split_step`); end = T - PADDING with PADDING zero steps past it when the kernel
    accepts offsets that end before T, else end = T (the padding is then not probed). ``get``
    runs the kernel on it once: (problem, outputs and gradients, padded), or why it cannot run."""

    def __init__(self, run: Runner, regime: str, dims: Dims, seed: int, dtype: str,
                 family: Family):
        self.run, self.regime, self.dims, self.seed = run, regime, dims, seed
        self.dtype, self.family = dtype, view(family)
        self.split = split_step(dims.T)
        self._got: tuple | str | None = None

    def problem(self, padded: bool) -> Problem:
        d, P = self.dims, self.split
        end = d.T - PADDING if padded else d.T
        cu = np.array([0, P // 2, P, end], dtype=np.int64)
        p = self.family.make(self.regime, Dims(1, d.G, d.H, end, d.dk, d.dv), self.seed,
                             self.dtype, cu_seqlens=cu)
        return _pad(p, self.family, 0.0) if padded else p

    def options(self) -> tuple[bool, ...]:
        """The packings to try, in order: padded, then not (none when T is too short)."""
        T, P = self.dims.T, self.split
        if P // 2 < 1 or P >= T:
            return ()
        return (True, False) if T - PADDING > P else (False,)

    def get(self) -> tuple[Problem, dict[str, np.ndarray], bool] | str:
        if self._got is not None:
            return self._got
        if not self.options():
            self._got = f"T = {self.dims.T} is too short for three packed sequences"
            return self._got
        why = ""
        for padded in self.options():
            p = self.problem(padded)
            try:
                self._got = (p, self.run(p, True), padded)
                return self._got
            except KernelFailed as exc:
                why = f"cu_seqlens={p.cu_seqlens.tolist()}: {exc}"
        self._got = f"the kernel does not take packed sequences ({why})"
        return self._got


def _select(out: dict[str, np.ndarray], family: _View, steps, states) -> dict:
    """{output: index expression} of the given steps of every timed output and the given
    sequences of every per-state one."""
    where = {}
    for name in out:
        if name in family.timed:
            where[name] = (slice(None), slice(None), steps)
        elif name in family.per_state:
            where[name] = (states,)
    return where


def causality(run: Runner, p: Problem, family: Family, *, split: int | None = None,
              dtype: str = "float64", seed: int = 0, chunk_size: int | None = None,
              packing: Packing | None = None) -> ProbeResult:
    """Inputs changed at t >= P leave the causal outputs (o, dq) at t < P bit-identical; inputs
    changed at t < P (and h0) leave the anticausal ones (dk, dv) bit-identical from the first
    chunk boundary at or after P on (within P's chunk a kernel whose decays are differences of
    in-chunk prefix sums, as flash-linear-attention's, rounds them with the earlier steps' gates:
    a dependence in the last bit only; C: ``chunk_size``, or DEFAULT_CHUNK when unknown). P: the
    middle of T by default, placed inside a chunk for chunked kernels (an odd step).

    The states h_t at t < P, which a kernel returns only at the end, are seen in an unpacked run
    through o_t and dq_t (each a projection of h_t). With ``packing`` (a kernel that takes
    cu_seqlens; offsets [0, P // 2, P, ...]) they are seen whole: inputs changed at t >= P (the
    later sequence's steps, h0 and dh_T) leave every output of the sequences before P
    bit-identical, their final states h_T included, the last of which is h_P."""
    T = p.dims.T
    P = split if split is not None else split_step(T)
    if not 0 < P < T:
        return ProbeResult("causality", None, f"T = {T} has no step to split at")
    fam = view(family)
    if not fam.causal and not fam.anticausal:
        return ProbeResult("causality", None, "the family declares no causal or anticausal "
                           "outputs")
    C = chunk_size if chunk_size else DEFAULT_CHUNK
    Q = -(-P // C) * C                     # anticausal outputs compared on t >= Q

    def body():
        rng = np.random.default_rng(seed)
        base = run(p, True)
        late = run(_resample(p, fam, rng, slice(P, None), dtype=dtype), True)
        # the initial states change too, never the final state's cotangent (dk, dv depend on it)
        early = run(_resample(p, fam, rng, slice(0, P), states=slice(None), dtype=dtype,
                              state_names=fam.inputs), True)
        before = {n: (slice(None), slice(None), slice(0, P)) for n in fam.causal}
        after = {n: (slice(None), slice(None), slice(Q, None)) for n in fam.anticausal}
        bad = [f"{d} (inputs changed at t >= {P})" for d in _differences(base, late, before)]
        if Q < T:
            bad += [f"{d}, counted from t = {Q} (inputs changed at t < {P})"
                    for d in _differences(base, early, after)]
        states = (f"h at t < P seen through {' and '.join(fam.causal) or 'no output'} (the "
                  "kernel takes no cu_seqlens)")
        got = packing.get() if packing is not None and packing.split == P else None
        if isinstance(got, tuple):
            pp, pbase, _ = got
            cu = pp.cu_seqlens
            end = int(cu[-1])
            changed = run(_resample(pp, fam, rng, slice(P, end), states=slice(2, None),
                                    dtype=dtype), True)
            bad += [f"{d} (packed at offsets {cu.tolist()}: sequence 2 changed)"
                    for d in _differences(pbase, changed,
                                          _select(pbase, fam, slice(0, P), slice(0, 2)))]
            final = next((n for n in fam.outputs if n in fam.per_state), "the final state")
            states = (f"packed at offsets {cu.tolist()}: the sequences before t = {P}, their "
                      f"final states {final}[0], {final}[1] = h_{P} included, unchanged by "
                      f"t >= {P}")
        if bad:
            return ProbeResult("causality", False, "outputs depend on steps they cannot: "
                               + "; ".join(bad))
        anti = (f"; {', '.join(fam.anticausal)} at t >= {Q} unchanged by t < {P}"
                if Q < T else "")
        return ProbeResult("causality", True, f"{', '.join(fam.causal)} at t < {P} "
                           f"unchanged by t >= {P}{anti}; {states}")
    return _guard("causality", body)


def packed(run: Runner, regime: str, dims: Dims, seed: int, dtype: str,
           family: Family, *, packing: Packing | None = None) -> ProbeResult:
    """Packed sequences (:class:`Packing`: three at offsets [0, P // 2, P, end]): changing the
    middle one (its steps, h0[1], dh_T[1] and do on its steps) leaves the sequences before and
    after it bit-identical, outputs and gradients; NaN in the padding past the last offset
    leaves everything before it as zeros there do (when the kernel accepts offsets that end
    before T)."""
    packing = packing or Packing(run, regime, dims, seed, dtype, family)
    fam = view(family)

    def body():
        got = packing.get()
        if isinstance(got, str):
            return ProbeResult("packed", None, f"not run: {got}")
        p, base, padded = got
        cu = p.cu_seqlens
        rng = np.random.default_rng(seed + 1)
        changed = run(_resample(p, fam, rng, slice(int(cu[1]), int(cu[2])),
                                states=slice(1, 2), dtype=dtype), True)
        keep = np.concatenate([np.arange(cu[0], cu[1]), np.arange(cu[2], cu[3])])
        bad = _differences(base, changed, _select(base, fam, keep, np.array([0, 2])))
        if bad:
            return ProbeResult("packed", False, f"changing sequence 1 changed the others' "
                               f"outputs: {', '.join(bad)} (offsets {cu.tolist()})")
        detail = [f"offsets {cu.tolist()}", "changing sequence 1 leaves sequences 0 and 2 "
                  "bit-identical"]
        if padded:
            end = int(cu[-1])
            nans = p.with_fields(**{n: _nan_tail(getattr(p, n), end) for n in
                                 fam.inputs + fam.cotangents
                                 if n in fam.timed and getattr(p, n) is not None})
            try:
                got_nan = run(nans, True)
            except KernelFailed as exc:
                return ProbeResult("packed", False, f"NaN in the padding past offset {end} "
                                   f"made the kernel fail: {exc}")
            bad = _differences(base, got_nan, _select(base, fam, slice(0, end), slice(None)))
            if bad:
                return ProbeResult("packed", False, f"NaN in the padding past offset {end} "
                                   "reached the sequences: " + ", ".join(bad))
            detail.append(f"NaN in {PADDING} steps of padding past offset {end} reaches nothing")
        else:
            detail.append("padding not probed (the kernel refuses offsets that end before T)")
        return ProbeResult("packed", True, "; ".join(detail))
    return _guard("packed", body)


def _nan_tail(x: np.ndarray, end: int) -> np.ndarray:
    y = np.array(x, copy=True)
    y[:, :, end:] = np.nan
    return y


def _failed(what: str, fails: dict[str, str]) -> str:
    """One case's failures: the outputs, and the first one's reason."""
    first = next(iter(fails.values()))
    return f"{what}: {', '.join(fails)} fail (first: {first})"


def cotangents(run: Runner, p: Problem, judge: Judge, family: Family) -> ProbeResult:
    """The gradients under structured cotangents pass the verdict: the timed ones (do) zero but
    at one step (t = T // 3) with the final state's (dh_T) zero; dh_T alone (do = 0); do alone
    (dh_T = 0)."""
    fam = view(family)
    T = p.dims.T
    t0 = T // 3
    timed = [c for c in fam.cotangents if c in fam.timed]
    final = [c for c in fam.cotangents if c not in fam.timed and getattr(p, c) is not None]
    no_final = {c: np.zeros_like(getattr(p, c)) for c in final}
    one = {}
    for c in timed:
        one[c] = np.zeros_like(getattr(p, c))
        one[c][:, :, t0] = getattr(p, c)[:, :, t0]
    cases = {f"{' and '.join(timed)} at t = {t0} only": p.with_fields(**one, **no_final),
             f"{' and '.join(timed)} alone": p.with_fields(**no_final)}
    if final:
        cases[f"{' and '.join(final)} alone"] = p.with_fields(
            **{c: np.zeros_like(getattr(p, c)) for c in timed})

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


def sweep_dims(dims: Dims, T: int) -> Dims:
    """The chunk sweep's problem at length T: B = 1, one group of at most SWEEP_HEADS heads,
    the row's feature sizes (what the sweep probes is the time axis; small, so that its runs,
    the oracle's and the reference kernels' cost little)."""
    return Dims(1, 1, min(SWEEP_HEADS, dims.H // dims.G), T, dims.dk, dims.dv)


def sweep_lengths(chunk_size: int | None) -> list[int]:
    """T = C - 1, C, C + 1, 2C - 1, 2C + 1 for C declared (else DEFAULT_CHUNK)."""
    C = chunk_size if chunk_size and chunk_size > 1 else DEFAULT_CHUNK
    return [t for t in (C - 1, C, C + 1, 2 * C - 1, 2 * C + 1) if t >= 1]


def chunk_sweep(run: Runner, regime: str, dims: Dims, seed: int, dtype: str, judge: Judge, *,
                chunk_size: int | None, family: Family) -> ProbeResult:
    """T = C - 1, C, C + 1, 2C - 1, 2C + 1 (C declared, or DEFAULT_CHUNK) pass the verdict, on
    :func:`sweep_dims` problems run side by side (:func:`run_many`: one compiled program). A
    run of length T also judges h_T, the state after T steps, against the oracle's: the state
    in the middle of a chunk and at its edges, which an unpacked full run only shows through
    its projections o and dq."""
    C = chunk_size if chunk_size and chunk_size > 1 else DEFAULT_CHUNK
    Ts = sweep_lengths(chunk_size)

    def body():
        problems = [family.make_problem(regime, sweep_dims(dims, T), seed, dtype) for T in Ts]
        bad = []
        for T, p, out in zip(Ts, problems, run_many(run, problems)):
            fails = judge(p, out)
            if fails:
                bad.append(_failed(f"T = {T}", fails))
        if bad:
            return ProbeResult("chunk_sweep", False, " | ".join(bad))
        return ProbeResult("chunk_sweep", True, f"C = {C}: T = {', '.join(map(str, Ts))} pass")
    return _guard("chunk_sweep", body)


class RowProblem(NamedTuple):
    """The problem of an audited row, which the probes remake and vary as the audit makes it
    (``family.make_problem(regime, dims, seed, dtype)``)."""

    regime: str
    dims: Dims
    seed: int
    dtype: str


def run_probes(run: Runner, row: RowProblem, judge: Judge, *, family: Family,
               chunk_size: int | None = None, which=PROBES) -> list[ProbeResult]:
    """Every probe in ``which`` (names from ``PROBES``, as the faces checked them:
    ``glaref._audit._engine.check_probes``) on the problem ``row`` of a row; ``judge``
    the verdict for the probes that judge (cotangents, chunk_sweep). The problem is made as the
    audit makes the row's, so a runner holding the row's compiled program
    (:meth:`JaxProbeRunner.use_row`) runs determinism, causality and cotangents without
    compiling; causality and packed share one packed problem (:class:`Packing`: one program,
    which follows the row's T), and the chunk sweep runs its five lengths as one program
    (:func:`run_many`), whose shapes do not depend on the row's T or regime: a runner kept for a
    whole audit compiles it once per kernel and config."""
    regime, dims, seed, dtype = row
    p = family.make_problem(regime, dims, seed, dtype)
    packing = Packing(run, regime, dims, seed, dtype, family)
    out = []
    unstable = None       # bit-identity cannot be judged when two runs already differ
    for w in which:
        if w == "determinism":
            out.append(determinism(run, p))
            if out[-1].passed is False:
                unstable = "not judged: two runs on the same inputs already differ (determinism)"
        elif w in ("causality", "packed") and unstable:
            out.append(ProbeResult(w, None, unstable))
        elif w == "causality":
            out.append(causality(run, p, family, dtype=dtype, seed=seed, chunk_size=chunk_size,
                                 packing=packing))
        elif w == "packed":
            out.append(packed(run, regime, dims, seed, dtype, family, packing=packing))
        elif w == "cotangents":
            out.append(cotangents(run, p, judge, family))
        else:
            out.append(chunk_sweep(run, regime, dims, seed, dtype, judge, chunk_size=chunk_size,
                                   family=family))
    return out
