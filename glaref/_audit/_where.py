"""Where the error is: an error profile per output, and the pattern it shows.

For one output of a kernel (canonical "bhtd" float64 ``x``), the oracle's value ``ref`` and the
oracle's per-element scale ``scale`` (the sum of the absolute values of the terms each element
adds up: ``glaref.gla._budget`` for the scalar gate), the error of every element is measured in
its own budget unit, ``w = u * scale + floor`` (``_metrics.budget_ulps``: u the unit roundoff of
the compute dtype, floor the underflow allowance). The profile aggregates it along one axis at a
time, as a ratio of norms, so that one step with large elements and one with small ones are each
judged against their own scale:

    over time        E_t = ||x_t - ref_t||_2 / ||w_t||_2      (per step t, over b, h, d)
    over heads       E_h, the same per head (per group for dq, dk, whose axis 1 is the group)
    over columns     E_d, per feature column (the last axis; dk for dq, dk, dv for o, dv)
    in the chunk     E_j over the steps t = j (mod C), when the chunk size C is known or inferred

plus the worst element's full canonical index (b, h, t, d) and its error in budget units. When
the same-precision reference kernels' values are given (``baseline``), each profile carries its
band: ``ratio`` times their profile, the error a correct kernel may make at that step, head or
column (the verdict's calibrated tier, ``calibrated_ratio``, applied per step instead of per
output).

:func:`pattern` names the pattern a failing output's profile shows, from the small set
:data:`PATTERNS` (docs/where.md), each with the class of bug it points to; :func:`diagnose`
words the sentence of a failing row from its outputs' profiles. A pattern is named only when the
profile supports it by the criteria written next to each test below; otherwise the sentence
says the error is spread and gives the profile's figures. A family feeds its rows' outputs to
:func:`profile` through its ``Judge.row_profiles`` hook (``glaref.gla._where.row_profiles`` for
the scalar gate).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .._inputs import Dims
from ..tolerances import UNIT_ROUNDOFF, lookup
from ._claims import Claims
from ._metrics import underflow_floor

# ---------------------------------------------------------------- the patterns

# key: (what the profile shows, the class of bug it points to)
PATTERNS: dict[str, tuple[str, str]] = {
    "nonfinite": ("{count} non-finite values, the first at {first_at}",
                  "an overflow: exp of an unbounded argument (split exponentials), a division by a "
                  "vanishing decay, or uninitialised memory"),
    "zero": ("the output is missing (x = {factor:.2g} ref)",
             "an output never written (a missing store, a truncated tile)"),
    "group_sum": ("only the gradients q and k, summed over the heads of each group, are wrong",
                  "the head-to-group mapping of that sum"),
    "scale": ("the error is proportional to the true value (x = {factor:.6g} ref)",
              "a scale or a wrong constant"),
    "columns": ("the error is confined to feature columns {which} of {n}{zero}",
                "a truncated or misaligned dk/dv tile"),
    "heads": ("the error is confined to heads {which} of {n}",
              "the head-to-group mapping (which q/k group each head reads)"),
    "last_chunk": ("the error is confined to the last chunk (t >= {start}, C = {C})",
                   "the last chunk: the ragged tail's mask, or the final state's term"),
    "first_chunk": ("the error starts in the first chunk and dies away (max {first:.3g} at "
                    "t < {C}, {late:.3g} in the last half)",
                    "the initial state h0: its decay or its gradient"),
    "chunk_jumps": ("the error jumps at multiples of C = {C} ({score:.3g}x larger steps at chunk "
                    "boundaries than inside chunks)",
                    "the state passed between chunks"),
    "grows": ("the error grows steadily with t (at most {late:.3g} in the last eighth of the steps, "
              "{early:.3g} in the first)",
              "precision: an accumulation, a cumulative sum or a 16-bit state"),
    "uniform": ("the error is spread evenly over t, heads and columns ({median:.3g} budget "
                "units per step, at most {max:.3g})",
                "precision of the arithmetic (operands or accumulator narrower than declared)"),
}
SPREAD = "spread"

# ---- the criteria (each figure a ratio of profile values; measured on tests/mutants.py, see
# docs/where.md for the table of mutants and the margins)
PROPORTIONAL_RESIDUAL = 0.1   # scale: ||d - c ref|| <= this fraction of ||d||
ZERO_FACTOR = 0.01            # zero: proportional with |1 + c| at most this
CLEAN_FRACTION = 0.5          # columns/heads: at most this fraction of them in error ...
CLEAN_SEPARATION = 10.0       # ... and those at least this many times the clean ones' largest
LATE_FRACTION = 0.1           # first_chunk: last half's largest <= this fraction of the first chunk's
JUMP_SCORE = 4.0              # chunk_jumps: mean |log-step| at boundaries / inside chunks
GROWTH = 4.0                  # grows: last quarter's median / first quarter's median
GROWTH_MONOTONE = 0.7         # grows: Spearman correlation of E_t with t
UNIFORM_SPREAD = 10.0         # uniform: largest step (head, column) / median step (head, column)
PRECISION_LIMIT = 2.0**-7     # uniform: median step error, relative to the scale (E * u), at most
                              # two roundings of a 16-bit format: a larger even error is no
                              # precision defect
SIGNIFICANT = 1e-2            # a step is in error above its band and this fraction of the largest
MIN_SHARE = 1 / 3             # a row's pattern: shown by at least this share of its failing outputs
GROWTH_BLOCKS = 8             # grows: judged on the maxima of this many blocks of steps
PROFILED = ("o", "h_T", "q", "k", "v", "log_alpha", "h0")   # every output of a fwd_bwd row
CANDIDATE_CHUNKS = (8, 16, 32, 64, 128, 256)
MAX_PROFILE_STEPS = 1024      # longer time profiles are stored as maxima over bins of steps


class Profile(NamedTuple):
    """The error profile of one output (module docstring); every field JSON-able or None."""

    output: str
    worst: float                       # largest element error, budget units
    worst_index: list[int] | None      # its canonical index (b, h, t, d) / (b, h, i, j)
    total: float                       # ||x - ref|| / ||w||, the whole output
    time: list[float] | None           # E_t (maxima over bins of time_bin steps when T is long)
    time_band: list[float] | None
    time_bin: int
    heads: list[float]
    heads_band: list[float] | None
    columns: list[float] | None
    columns_band: list[float] | None
    chunk: int | None                  # C used for chunk_position (declared or inferred)
    chunk_inferred: bool
    chunk_position: list[float] | None
    factor: float | None               # c + 1 of the best fit x - ref = c ref
    proportional_residual: float | None
    nonfinite: int
    first_nonfinite: list[int] | None
    zero_columns: list[int]            # feature columns (last axis) all zero where ref is not
    unit_roundoff: float

    def summary(self, full: bool = True) -> dict[str, Any]:
        """The profile as JSON-able data; ``full=False`` leaves out the per-step lists (time,
        time_band), which only a failing output's plot needs."""
        d = self._asdict()
        if not full:
            d["time"] = d["time_band"] = None
        return d


def _time_axis(name: str) -> int | None:
    return None if name in ("h_T", "h0") else 2


def _norms(a2: np.ndarray, axis: int) -> np.ndarray:
    """sqrt of the sums of the squares ``a2`` over every axis but ``axis``."""
    other = tuple(i for i in range(a2.ndim) if i != axis)
    return np.sqrt(np.sum(a2, axis=other))


def _ratio_profile(d2: np.ndarray, w2: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _norms(d2, axis) / _norms(w2, axis)


def _finite_list(a: np.ndarray | None) -> list[float] | None:
    if a is None:
        return None
    return [float(x) if math.isfinite(x) else math.inf for x in np.asarray(a, dtype=np.float64)]


def _binned(a: np.ndarray, k: int) -> np.ndarray:
    if k == 1:
        return a
    n = -(-a.size // k)
    pad = np.full(n * k - a.size, -np.inf)
    return np.max(np.concatenate([a, pad]).reshape(n, k), axis=1)


def _squares(x: np.ndarray, ref: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):
        d = x - ref
    d2 = np.where(np.isfinite(d), d * d, np.inf)
    return d2, w * w


def budget_unit(name: str, scale: np.ndarray, compute_dtype: str, dims: Dims) -> np.ndarray:
    """``u * scale + floor`` per element: the unit of ``_metrics.budget_ulps``."""
    u = lookup(UNIT_ROUNDOFF, compute_dtype, "compute_dtype")
    return u * np.asarray(scale, dtype=np.float64) + underflow_floor(name, compute_dtype, dims)


def infer_chunk(E: np.ndarray, candidates=CANDIDATE_CHUNKS) -> tuple[int | None, float]:
    """The chunk size whose boundaries the time profile ``E`` jumps at, and the score
    (:func:`jump_score`); (None, 0) when no candidate leaves two boundaries in ``E``. Multiples of
    the true C score about as well as C itself, so the smallest within a factor 1.5 of the best
    is taken."""
    scores = {C: jump_score(E, C) for C in candidates if E.size > 2 * C}
    scores = {C: s for C, s in scores.items() if math.isfinite(s)}
    if not scores:
        return None, 0.0
    best = max(scores.values())
    C = min(c for c, s in scores.items() if s >= best / 1.5)
    return C, scores[C]


def jump_score(E: np.ndarray, C: int) -> float:
    """Mean |log E_t - log E_{t-1}| over the chunk boundaries t = nC, over the same mean inside
    chunks (E floored at a millionth of its largest value, so that exact zeros stay finite)."""
    E = np.asarray(E, dtype=np.float64)
    if E.size <= C + 1 or not np.all(np.isfinite(E)) or np.max(E) <= 0:
        return math.nan
    logE = np.log(np.maximum(E, 1e-6 * np.max(E)))
    step = np.abs(np.diff(logE))             # step[t - 1] = |log E_t - log E_{t-1}|
    t = np.arange(1, E.size)
    at = step[t % C == 0]
    inside = step[t % C != 0]
    if at.size == 0 or inside.size == 0:
        return math.nan
    return float(np.mean(at) / max(float(np.mean(inside)), 1e-12))


def profile(name: str, x, ref, scale, *, claims: Claims, dims: Dims, baseline=None,
            ratio: float | None = None) -> Profile:
    """The error profile of output ``name`` (o, h_T, q, k, v, log_alpha, h0): ``x`` the kernel's
    value, ``ref`` the oracle's and ``scale`` the oracle's per-element scale, all canonical arrays
    of one shape; ``baseline`` the same-precision reference kernels' values (a list of arrays, or
    one), whose largest profile times ``ratio`` is the band. ``claims``: what is known of the
    kernel, as the verdict reads it: ``compute_dtype`` the unit of budget_ulps (set), and
    ``chunk_size`` its chunk length when known (1 for a scan: no chunk profile; None: inferred
    from the jumps of the time profile when they are clear, :func:`infer_chunk`)."""
    compute_dtype, chunk_size = claims.compute_dtype, claims.chunk_size
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    w = budget_unit(name, scale, compute_dtype, dims)
    if x.shape != ref.shape or ref.shape != w.shape:
        raise ValueError(f"x: got shape {x.shape}, expected ref's {ref.shape} and scale's {w.shape}")
    d2, w2 = _squares(x, ref, w)
    bases = [] if baseline is None else [baseline] if isinstance(baseline, np.ndarray) else list(baseline)
    bsq = [_squares(np.asarray(b, dtype=np.float64), ref, w)[0] for b in bases]
    r = 1.0 if ratio is None else float(ratio)

    def band(axis):
        if not bsq:
            return None
        return r * np.max([_ratio_profile(b2, w2, axis) for b2 in bsq], axis=0)

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        el = np.sqrt(d2) / w
        total = float(np.sqrt(np.sum(d2)) / np.sqrt(np.sum(w2))) if x.size else 0.0
    worst, worst_index = 0.0, None
    if x.size:
        i = int(np.argmax(el))
        worst, worst_index = float(el.flat[i]), [int(j) for j in np.unravel_index(i, el.shape)]

    heads = _ratio_profile(d2, w2, 1)
    columns = columns_band = None
    if x.ndim == 4 and x.shape[3] > 1:
        columns, columns_band = _ratio_profile(d2, w2, 3), band(3)

    time = time_band = chunk_position = None
    chunk, inferred, time_bin = None, False, 1
    ta = _time_axis(name)
    if ta is not None and x.ndim > ta and x.shape[ta] > 0:
        E = _ratio_profile(d2, w2, ta)
        Eb = band(ta)
        if chunk_size is not None and chunk_size > 1:
            chunk = int(chunk_size)
        elif chunk_size is None:
            C, score = infer_chunk(E)
            if C is not None and score >= JUMP_SCORE:
                chunk, inferred = C, True
        if chunk is not None:
            T = E.size
            d2c = np.moveaxis(d2, ta, -1)
            w2c = np.moveaxis(w2, ta, -1)
            pos = np.arange(T) % chunk
            with np.errstate(invalid="ignore", divide="ignore"):
                chunk_position = [float(np.sqrt(np.sum(d2c[..., pos == j]))
                                        / np.sqrt(np.sum(w2c[..., pos == j])))
                                  if np.any(pos == j) else 0.0 for j in range(chunk)]
        time_bin = max(1, -(-E.size // MAX_PROFILE_STEPS))
        time = _binned(E, time_bin)
        time_band = None if Eb is None else _binned(Eb, time_bin)

    factor = resid = None
    dd = x - ref
    nref = float(np.linalg.norm(ref.ravel()))
    nd = float(np.linalg.norm(dd.ravel())) if np.all(np.isfinite(dd)) else math.inf
    if nref > 0 and 0 < nd < math.inf:
        c = float(np.dot(dd.ravel(), ref.ravel()) / nref**2)
        factor = 1.0 + c
        resid = float(np.linalg.norm((dd - c * ref).ravel()) / nd)

    zero_columns = []
    if x.ndim == 4 and x.shape[3] > 1:
        other = (0, 1, 2)
        zero_columns = [int(j) for j in np.flatnonzero(np.all(x == 0, axis=other)
                                                         & np.any(ref != 0, axis=other))]
    bad = ~np.isfinite(x)
    n_bad = int(bad.sum())
    first = [int(i) for i in np.argwhere(bad)[0]] if n_bad else None
    return Profile(name, worst, worst_index, total, _finite_list(time), _finite_list(time_band),
                   time_bin, _finite_list(heads), _finite_list(band(1)), _finite_list(columns),
                   _finite_list(columns_band), chunk, inferred, chunk_position, factor, resid,
                   n_bad, first, zero_columns, float(lookup(UNIT_ROUNDOFF, compute_dtype,
                                                            "compute_dtype")))


# ---------------------------------------------------------------- the pattern of one output

class Finding(NamedTuple):
    """The pattern one output's profile shows: its key in PATTERNS (or SPREAD) and the figures
    its sentence quotes."""

    output: str
    pattern: str
    figures: dict[str, Any]

    def words(self) -> str:
        if self.pattern == SPREAD:
            return _spread_words(self.figures)
        return PATTERNS[self.pattern][0].format(**self.figures)


def _arr(v) -> np.ndarray | None:
    return None if v is None else np.asarray(v, dtype=np.float64)


def _confined(values, band) -> tuple[list[int], int] | None:
    """Indices in error when only some are: at most CLEAN_FRACTION of them above their band (or,
    without a band, above 1/CLEAN_SEPARATION of the largest), each at least CLEAN_SEPARATION
    times the largest of the others; else None."""
    E = _arr(values)
    if E is None or E.size < 2 or not np.all(np.isfinite(E)):
        return None
    top = float(np.max(E))
    if top <= 0:
        return None
    limit = _arr(band) if band is not None else np.full(E.size, top / CLEAN_SEPARATION)
    bad = E > limit
    n_bad = int(bad.sum())
    if n_bad == 0 or n_bad > CLEAN_FRACTION * E.size:
        return None
    clean_max = float(np.max(E[~bad]))
    if float(np.min(E[bad])) < CLEAN_SEPARATION * clean_max:
        return None
    return [int(i) for i in np.flatnonzero(bad)], E.size


def _spearman(E: np.ndarray) -> float:
    if E.size < 3 or np.all(E == E[0]):
        return 0.0
    rank = np.argsort(np.argsort(E, kind="stable"), kind="stable").astype(np.float64)
    t = np.arange(E.size, dtype=np.float64)
    return float(np.corrcoef(rank, t)[0, 1])


def pattern(p: Profile) -> Finding:
    """The pattern output profile ``p`` shows (tests in the order of PATTERNS, the first that holds
    wins; docs/where.md gives each criterion), or SPREAD with the profile's figures."""
    if p.nonfinite:
        return Finding(p.output, "nonfinite", {"count": p.nonfinite,
                                               "first": tuple(p.first_nonfinite or ()),
                                               "first_at": _lettered(p.output, p.first_nonfinite)})
    n_cols = len(p.columns) if p.columns is not None else 0
    if p.zero_columns and len(p.zero_columns) <= CLEAN_FRACTION * n_cols:
        return Finding(p.output, "columns", {"which": p.zero_columns, "n": n_cols,
                                             "zero": ", which are zero"})
    if p.proportional_residual is not None and p.proportional_residual <= PROPORTIONAL_RESIDUAL:
        if abs(p.factor) <= ZERO_FACTOR:
            return Finding(p.output, "zero", {"factor": p.factor})
        return Finding(p.output, "scale", {"factor": p.factor})
    cols = _confined(p.columns, p.columns_band)
    if cols is not None:
        return Finding(p.output, "columns", {"which": cols[0], "n": cols[1], "zero": ""})
    heads = _confined(p.heads, p.heads_band)
    if heads is not None:
        return Finding(p.output, "heads", {"which": heads[0], "n": heads[1]})
    E = _arr(p.time)
    if E is None or E.size < 4 or not np.all(np.isfinite(E)) or np.max(E) <= 0:
        return Finding(p.output, SPREAD, _spread_figures(p))
    T, k = E.size, p.time_bin
    band = _arr(p.time_band)
    limit = np.maximum(band if band is not None else 0.0, SIGNIFICANT * np.max(E))
    bad = np.flatnonzero(E > limit)
    C = p.chunk
    if C is not None and bad.size and T * k > C:
        start = (T * k - 1) // C * C
        if bad[0] * k >= start:
            return Finding(p.output, "last_chunk", {"start": start, "C": C})
    first = C if C is not None else max(1, T * k // 8)
    n_first = max(1, first // k)
    # the error peaks in the first chunk and dies away after it
    if bad.size and bad[0] < n_first and T > 2 * n_first and int(np.argmax(E)) < n_first:
        top_first = float(np.max(E[:n_first]))
        late = float(np.max(E[T // 2:]))
        if late <= LATE_FRACTION * top_first:
            return Finding(p.output, "first_chunk", {"first": top_first, "late": late, "C": first})
    if C is not None and k == 1:
        score = jump_score(E, C)
        if math.isfinite(score) and score >= JUMP_SCORE:
            return Finding(p.output, "chunk_jumps", {"C": C, "score": score})
    if T >= 2 * GROWTH_BLOCKS:
        blocks = np.array([np.max(b) for b in np.array_split(E, GROWTH_BLOCKS)])
        early, late = float(blocks[0]), float(blocks[-1])
        if late >= GROWTH * max(early, 1e-300) and _spearman(blocks) >= GROWTH_MONOTONE:
            return Finding(p.output, "grows", {"early": early, "late": late})
    med = float(np.median(E))
    if med > 0 and med * p.unit_roundoff <= PRECISION_LIMIT and _even(E) and _even(p.heads) \
            and _even(p.columns) and (band is None or np.mean(E > band) >= 0.5):
        return Finding(p.output, "uniform", {"median": med, "max": float(np.max(E))})
    return Finding(p.output, SPREAD, _spread_figures(p))


def _even(values) -> bool:
    """No value beyond UNIFORM_SPREAD times the median (True for None: nothing to compare)."""
    E = _arr(values)
    if E is None or E.size == 0:
        return True
    med = float(np.median(E))
    return med > 0 and float(np.max(E)) <= UNIFORM_SPREAD * med


def _spread_figures(p: Profile) -> dict[str, Any]:
    fig: dict[str, Any] = {"worst": p.worst, "worst_index": p.worst_index, "total": p.total,
                           "worst_at": _lettered(p.output, p.worst_index)}
    E = _arr(p.time)
    if E is not None and E.size and np.all(np.isfinite(E)):
        fig.update(t_max=int(np.argmax(E)) * p.time_bin, E_max=float(np.max(E)),
                   E_median=float(np.median(E)))
    H = _arr(p.heads)
    if H is not None and H.size and np.all(np.isfinite(H)):
        fig.update(head_max=int(np.argmax(H)), head_min_over_max=float(np.min(H) / np.max(H))
                   if np.max(H) > 0 else 1.0)
    return fig


def _lettered(name: str, index) -> str:
    """A canonical index with its axes named, "(b, h, t, d) = (0, 1, 5, 0)", so that a reader
    of another layout cannot mistake it (the profile keeps glaref's canonical index)."""
    at = tuple(int(i) for i in (index or ()))
    letters = AXES.get(name, "")[:len(at)]
    return f"({', '.join(letters)}) = {at}" if at and len(letters) == len(at) else str(at)


def _spread_words(f: dict[str, Any]) -> str:
    parts = [f"the error is spread (worst {f['worst']:.3g} budget units at {f['worst_at']}"]
    if "t_max" in f:
        parts.append(f"per step at most {f['E_max']:.3g} (t = {f['t_max']}), median {f['E_median']:.3g}")
    if "head_max" in f:
        parts.append(f"least/most affected head {f['head_min_over_max']:.2g}")
    return ", ".join(parts) + ")"


# ---------------------------------------------------------------- the sentence of a row

def findings(profiles: dict[str, Profile], failing) -> dict[str, Finding]:
    """The pattern of each failing output that has a profile."""
    return {n: pattern(profiles[n]) for n in failing if n in profiles}


def diagnose(profiles: dict[str, Profile], failing) -> tuple[str | None, str | None]:
    """(sentence, pattern key) for a row whose outputs ``failing`` failed; (None, None) when none
    did. The pattern is the one most failing outputs show (ties: the order of PATTERNS); outputs
    without a time axis (h_T, h0) count only for scale, columns and heads. SPREAD when no failing
    output shows a pattern."""
    failing = list(failing)
    if not failing:
        return None, None
    found = findings(profiles, failing)
    nonfinite = {n: f for n, f in found.items() if f.pattern == "nonfinite"}
    if nonfinite:      # outranks everything: nothing else can be read from a NaN
        outs = list(nonfinite)
        return (f"{', '.join(outs)}: {nonfinite[outs[0]].words()}; points to "
                f"{PATTERNS['nonfinite'][1]}.", "nonfinite")
    if set(failing) == {"q", "k"} and groups_shared(profiles):
        return f"q, k: {PATTERNS['group_sum'][0]}; points to {PATTERNS['group_sum'][1]}.", \
            "group_sum"
    if not found:
        return None, None
    named = {n: f for n, f in found.items() if f.pattern != SPREAD}
    if not named:
        n, f = max(found.items(), key=lambda kv: kv[1].figures.get("worst", 0.0))
        return f"{n}: {f.words()}.", SPREAD
    counts: dict[str, list[str]] = {}
    for n, f in named.items():
        counts.setdefault(f.pattern, []).append(n)
    # h0's terms show in o first: a failing o without the first-chunk pattern rules it out
    if "first_chunk" in counts and "o" in found and found["o"].pattern != "first_chunk":
        del counts["first_chunk"]
    if not counts:
        n, f = max(found.items(), key=lambda kv: kv[1].figures.get("worst", 0.0))
        f = f if f.pattern == SPREAD else Finding(n, SPREAD, _spread_figures(profiles[n]))
        return f"{n}: {f.words()}.", SPREAD
    order = list(PATTERNS)
    key = max(counts, key=lambda k: (len(counts[k]), -order.index(k)))
    outs = counts[key]
    if len(outs) < MIN_SHARE * len(found):
        n, f = max(found.items(), key=lambda kv: kv[1].figures.get("worst", 0.0)
                   if kv[1].pattern == SPREAD else 0.0)
        f = f if f.pattern == SPREAD else Finding(n, SPREAD, _spread_figures(profiles[n]))
        return f"{n}: {f.words()}.", SPREAD
    f = named[outs[0]]
    return (f"{', '.join(outs)}: {f.words()}; points to "
            f"{PATTERNS[key][1]}.", key)


def groups_shared(profiles: dict[str, Profile]) -> bool:
    """Whether the heads share groups of q and k (fewer groups than heads), read from the
    profiles' head axes (dq's is the group axis)."""
    g = profiles.get("q")
    h = profiles.get("o") or profiles.get("v")
    return g is not None and h is not None and len(g.heads) < len(h.heads)


# the canonical axes of each output, as the worst index is given
AXES = {"o": "bhtd", "v": "bhtd", "q": "bgtd", "k": "bgtd", "log_alpha": "bhtd", "h_T": "bhij",
         "h0": "bhij"}
