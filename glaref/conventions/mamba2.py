"""Mamba2's SSD convention (mamba_ssm's ``mamba_chunk_scan_combined``, ``ssd_minimal_discrete``,
``selective_state_update``), both ways.

Mamba2 names (``[batch, seqlen, ...]`` arrays; P = headdim, N = dstate, G = ngroups, head h reads
group h // (nheads / ngroups))::

    x [b, t, h, P]   dt [b, t, h]   A [h] (negative)   B, C [b, t, G, N]   D [h] or [h, P]
    z [b, t, h, P] (optional)   dt_bias [h]   dt_softplus   initial_states [b, h, P, N]

    dt'  = softplus(dt + dt_bias) if dt_softplus else dt + dt_bias      (dt_bias absent: 0)
    S_t  = exp(A dt'_t) S_{t-1} + dt'_t x_t^T B_t                        S: [P, N] (headdim, dstate)
    y_t  = S_t C_t^T + D x_t,   then  y_t * silu(z_t)  when z is given
    final_states = S_T

This is glaref's recurrence with the state transposed (glaref's is (dk, dv) = (N, P)) and scale 1:

    glaref   q   k   v          log_alpha   h0                    scale   o
    Mamba2   C   B   dt' x      A dt'       initial_states^T      1       y before D and z

so y = (o + D x) * silu(z) and final_states = h_T^T. Every gradient follows from glaref's vjp
by the chain rule, with do = dy * silu(z) (docs/math.md, "Conventions", derives each)::

    dx   = dt' dv + D do                   dB = dk      dC = dq      dinitial_states = dh0^T
    ddt' = sum_P x dv + A dlog_alpha       ddt = ddt' * sigmoid(dt + dt_bias) (softplus) or ddt'
    dA   = sum_{b,t} dt' dlog_alpha        ddt_bias = sum_{b,t} ddt
    dD   = sum_{b,t,P} do x  ([h])  or  sum_{b,t} do x  ([h, P])
    dz   = dy (o + D x) silu'(z),  silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z)))

All of it is evaluated in float64 from the inputs as the kernel received them (dt' x and A dt'
are float64 products: within 1 u64 of exact). Not handled: ``dt_limit`` (a clamp of dt'),
``seq_idx`` / ``cu_seqlens`` (variable-length batches) and the per-channel ``dt`` [b, t, h, P] of
``ssd_selective_scan``. softplus here is the exact log(1 + exp(x)); torch's F.softplus returns x
itself above x = 20, 2e-9 away, far below float32's rounding at that size.

Results are compared under Mamba2's own names (``ssd_reference``, ``ssd_scales``): dx, ddt and
dA mix several of glaref's gradients, so a kernel's results cannot be mapped back to glaref's
names one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np
from scipy.special import expit

from .. import regimes
from .._audit._frameworks import dtype_name, to_host_float64
from .._errors import ShapeError
from .._inputs import Dims, canonicalize, from_canonical
from ..gla import _budget, _oracle
from . import GLAREF_NAMES
from .fla import _as_framework

__all__ = ["INPUT_NAMES", "Cotangents", "SSDCase", "ssd_case", "ssd_from_glaref", "ssd_inputs",
           "ssd_outputs", "ssd_reference", "ssd_scales"]

# mamba_chunk_scan_combined's array arguments, in its order, and the cotangents of (y, final_states)
INPUT_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
COTANGENT_NAMES = ("dy", "dfinal_states")
# the results, under Mamba2's names: outputs, then one gradient per input
RESULT_NAMES = ("y", "final_states", "dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias",
                "dinitial_states")


class Cotangents(NamedTuple):
    """The cotangents of an SSD call's results, under Mamba2's names: ``dy`` of y [b, t, h, P]
    and ``dfinal_states`` of final_states [b, h, P, N]; None: zero (both None, or no
    cotangents at all: no gradients). A plain pair ``(dy, dfinal_states)`` reads the same."""

    dy: Any = None
    dfinal_states: Any = None


@dataclass(frozen=True)
class SSDCase:
    """Which of ``mamba_chunk_scan_combined``'s optional arguments :func:`ssd_case` draws: ``D``
    "head" ([h]), "channel" ([h, P]) or None; ``z`` and ``dt_bias`` drawn or None;
    ``dt_softplus`` the flag passed."""

    D: str | None = "head"
    z: bool = True
    dt_bias: bool = True
    dt_softplus: bool = True


def _silu(z: np.ndarray) -> np.ndarray:
    return z * expit(z)


def _dsilu(z: np.ndarray, absolute: bool = False) -> np.ndarray:
    """silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))); ``absolute``: the sum of its terms'
    absolute values, sigmoid(z) (1 + |z| (1 - sigmoid(z))) (the value cancels near z = -1.28)."""
    s = expit(z)
    return s * (1.0 + (np.abs(z) if absolute else z) * (1.0 - s))


def _read(x, name: str, shape: tuple[int, ...] | None, spelled: str) -> np.ndarray | None:
    if x is None:
        return None
    a = to_host_float64(x, name)
    if shape is not None and a.shape != shape:
        raise ShapeError(f"{name}: got shape {a.shape}, expected {shape} {spelled}")
    return a


def _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states, dy, dfinal_states):
    """Every argument as float64 (Mamba2's layout), checked, plus the derived dt', v, log_alpha."""
    xa = to_host_float64(x, "x")
    if xa.ndim != 4:
        raise ShapeError(f"x: got shape {xa.shape} ({xa.ndim} dims), expected 4 dims "
                         "[batch, seqlen, nheads, headdim]")
    b, t, h, P = xa.shape
    Ba = to_host_float64(B, "B")
    if Ba.ndim != 4 or Ba.shape[:2] != (b, t):
        raise ShapeError(f"B: got shape {Ba.shape}, expected ({b}, {t}, ngroups, dstate) "
                         "[batch, seqlen, ngroups, dstate]")
    G, N = Ba.shape[2], Ba.shape[3]
    if G == 0 or h % G:
        raise ShapeError(f"B: got ngroups={G}, expected a divisor of x's nheads={h}")
    s = {"x": xa, "B": Ba,
         "C": _read(C, "C", (b, t, G, N), "like B [batch, seqlen, ngroups, dstate]"),
         "dt": _read(dt, "dt", (b, t, h), "[batch, seqlen, nheads]"),
         "A": _read(A, "A", (h,), "[nheads]"),
         "z": _read(z, "z", (b, t, h, P), "like x [batch, seqlen, nheads, headdim]"),
         "dt_bias": _read(dt_bias, "dt_bias", (h,), "[nheads]"),
         "initial_states": _read(initial_states, "initial_states", (b, h, P, N),
                                 "[batch, nheads, headdim, dstate]"),
         "dy": _read(dy, "dy", (b, t, h, P), "like y [batch, seqlen, nheads, headdim]"),
         "dfinal_states": _read(dfinal_states, "dfinal_states", (b, h, P, N),
                                "like final_states [batch, nheads, headdim, dstate]"),
         "dt_softplus": bool(dt_softplus)}
    Da = _read(D, "D", None, "")
    if Da is not None and Da.shape not in ((h,), (h, P)):
        raise ShapeError(f"D: got shape {Da.shape}, expected {(h,)} [nheads] or {(h, P)} "
                         "[nheads, headdim]")
    s["D"] = Da
    dt_in = s["dt"] if s["dt_bias"] is None else s["dt"] + s["dt_bias"]
    s["dt_in"] = dt_in
    s["dt_eff"] = np.logaddexp(0.0, dt_in) if s["dt_softplus"] else dt_in
    s["v"] = s["dt_eff"][..., None] * xa
    s["log_alpha"] = s["A"] * s["dt_eff"]
    s["gate"] = None if s["z"] is None else _silu(s["z"])
    return s


def _T(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _D_full(s) -> np.ndarray | None:
    """D broadcast against [b, t, h, P]."""
    D = s["D"]
    if D is None:
        return None
    return D[:, None] if D.ndim == 1 else D


def _problem(s):
    do = s["dy"]
    if do is None and s["dfinal_states"] is not None:
        do = np.zeros_like(s["x"])
    if do is not None and s["gate"] is not None:
        do = do * s["gate"]
    return canonicalize(s["C"], s["B"], s["v"], s["log_alpha"], _T(s["initial_states"]), do,
                        _T(s["dfinal_states"]), layout="bthd")


def ssd_inputs(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
               initial_states=None, cotangents: Cotangents | tuple | None = None) -> dict[str, Any]:
    """glaref's problem for an SSD call (``mamba_chunk_scan_combined``'s arguments, and the
    ``cotangents`` (dy, dfinal_states) of its results, :class:`Cotangents`): a dict of canonical
    float64 "bhtd" arrays q (= C), k (= B), v (= dt' x), log_alpha (= A dt'), h0 (=
    initial_states^T), do (= dy * silu(z), or zeros when only dfinal_states is given), dh_T (=
    dfinal_states^T), scale (1.0), layout ("bhtd") and dtype (x's dtype name). D does not enter
    the recurrence (y = o + D x)."""
    dy, dfinal_states = cotangents or Cotangents()
    s = _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states, dy, dfinal_states)
    p = _problem(s)
    return {"q": p.q, "k": p.k, "v": p.v, "log_alpha": p.log_alpha, "h0": p.h0, "do": p.do,
            "dh_T": p.dh_T, "scale": 1.0, "layout": "bhtd", "dtype": dtype_name(x)}


def _chain(core: Mapping[str, np.ndarray], s, absolute: bool) -> dict[str, np.ndarray | None]:
    """glaref's canonical results ``core`` -> Mamba2's names, by the chain rule.

    ``absolute``: ``core`` holds error scales (sums of |terms|) and every factor taken from the
    inputs enters by its absolute value, so each result is the sum of |terms| of the same
    expression: the error scale of that result."""
    f = np.abs if absolute else (lambda a: a)
    o = core.get("o")
    o = None if o is None else from_canonical(np.asarray(o), "v", "bthd")
    Dx = None if s["D"] is None else f(_D_full(s)) * f(s["x"])
    y_pre = None if o is None else (o if Dx is None else o + Dx)
    res: dict[str, np.ndarray | None] = dict.fromkeys(RESULT_NAMES)
    if y_pre is not None:
        res["y"] = y_pre if s["gate"] is None else y_pre * f(s["gate"])
    if core.get("h_T") is not None:
        res["final_states"] = _T(np.asarray(core["h_T"]))
    if core.get("v") is None:
        return res
    dv = from_canonical(np.asarray(core["v"]), "v", "bthd")
    dla = from_canonical(np.asarray(core["log_alpha"]), "gate", "bthd")
    dy = s["dy"] if s["dy"] is not None else np.zeros_like(s["x"])
    do = f(dy) if s["gate"] is None else f(dy) * f(s["gate"])
    dt_eff = f(s["dt_eff"])
    dx = dt_eff[..., None] * dv
    if s["D"] is not None:
        dx = dx + f(_D_full(s)) * do
    ddt_eff = (f(s["x"]) * dv).sum(axis=-1) + f(s["A"]) * dla
    ddt = ddt_eff * expit(s["dt_in"]) if s["dt_softplus"] else ddt_eff
    res.update(dx=dx, ddt=ddt, dA=(dt_eff * dla).sum(axis=(0, 1)),
               dB=from_canonical(np.asarray(core["k"]), "qk", "bthd"),
               dC=from_canonical(np.asarray(core["q"]), "qk", "bthd"),
               dinitial_states=_T(np.asarray(core["h0"])))
    if s["D"] is not None:
        dox = do * f(s["x"])
        res["dD"] = dox.sum(axis=(0, 1, 3)) if s["D"].ndim == 1 else dox.sum(axis=(0, 1))
    if s["z"] is not None:
        res["dz"] = f(dy) * y_pre * _dsilu(s["z"], absolute)
    if s["dt_bias"] is not None:
        res["ddt_bias"] = ddt.sum(axis=(0, 1))
    return res


def ssd_from_glaref(results: Mapping[str, Any], x, dt, A, D=None, z=None, dt_bias=None,
                    dt_softplus: bool = False, dy=None) -> dict[str, np.ndarray | None]:
    """glaref's canonical results for the problem of :func:`ssd_inputs` (keys o, h_T, q, k, v,
    log_alpha, h0; the gradients may be missing) under Mamba2's names, float64: y, final_states
    and, with the gradients, dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states (None where
    the call had no such input). ``dy`` is the cotangent of y (None: zero)."""
    xa = to_host_float64(x, "x")
    b, t, h, P = xa.shape
    # B and C are not needed by the chain rule; placeholders of the right shape pass the checks
    G = 1 if results.get("q") is None else np.asarray(results["q"]).shape[1]
    N = 1 if results.get("q") is None else np.asarray(results["q"]).shape[3]
    ph = np.zeros((b, t, G, N))
    s = _prepare(xa, dt, A, ph, ph, D, z, dt_bias, dt_softplus, None, dy, None)
    return _chain(results, s, absolute=False)


def _reference(scales: bool, s, impl: str) -> dict[str, np.ndarray | None]:
    """The oracle's results (``scales``: their error scales) for the prepared call ``s``."""
    p = _problem(s)
    args = (p.q, p.k, p.v, p.log_alpha, p.h0)
    if scales:
        sc = _budget.scales(*args, p.do, p.dh_T, impl=impl)
        core = {n: getattr(sc, n) for n in GLAREF_NAMES}
    else:
        o, h_T = _oracle.forward(*args, impl=impl)
        core = {"o": o, "h_T": h_T}
        if p.do is not None:
            g = _oracle.vjp(*args, p.do, p.dh_T, impl=impl)
            core.update(q=g.q, k=g.k, v=g.v, log_alpha=g.log_alpha, h0=g.h0)
    return _chain(core, s, absolute=scales)


def ssd_reference(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                  initial_states=None, cotangents: Cotangents | tuple | None = None,
                  impl: str = "numba"):
    """The float64 oracle's results for an SSD call under Mamba2's names (see the module
    docstring): y and final_states always; with a cotangent (``cotangents``: (dy,
    dfinal_states), :class:`Cotangents`) every gradient (dD, dz and ddt_bias when the call has D,
    z and dt_bias; dinitial_states always, at zeros when initial_states is None). Arguments as
    ``mamba_chunk_scan_combined``'s, plus the cotangents."""
    s = _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states,
                 *(cotangents or Cotangents()))
    return _reference(False, s, impl)


def ssd_scales(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
               initial_states=None, cotangents: Cotangents | tuple | None = None,
               impl: str = "numba"):
    """Per-element error scales of every result of :func:`ssd_reference`: the chain rule applied
    to glaref's scales (``glaref.scales``) with every factor from the inputs by its absolute
    value, i.e. each result's sum of |terms|. What a correct kernel's error is measured in."""
    s = _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states,
                 *(cotangents or Cotangents()))
    return _reference(True, s, impl)


def ssd_outputs(y=None, final_states=None, dx=None, ddt=None, dA=None, dB=None, dC=None, dD=None,
                dz=None, ddt_bias=None, dinitial_states=None) -> dict[str, Any]:
    """A Mamba2 kernel's results as float64 host arrays under Mamba2's names (the layout of
    :func:`ssd_reference`), plus ``dtypes``; None (not computed) stays None."""
    given = dict(y=y, final_states=final_states, dx=dx, ddt=ddt, dA=dA, dB=dB, dC=dC, dD=dD, dz=dz,
                 ddt_bias=ddt_bias, dinitial_states=dinitial_states)
    out: dict[str, Any] = {n: (None if a is None else to_host_float64(a, n)) for n, a in given.items()}
    out["dtypes"] = {n: dtype_name(a) for n, a in given.items() if a is not None}
    return out


def ssd_case(batch: int, seqlen: int, nheads: int, headdim: int, ngroups: int, dstate: int,
             dtype: Any = "float32", seed: int = 0, regime: str = "standard",
             framework: str = "torch", device: str = "cpu",
             drawn: SSDCase = SSDCase()) -> dict[str, Any]:
    """Random SSD inputs and cotangents under Mamba2's names (a dict with INPUT_NAMES, dy,
    dfinal_states and dt_softplus), rounded to ``dtype``; ``drawn``: which optional arguments
    (:class:`SSDCase`, by default all of them, with dt_softplus).

    x, B, C, initial_states and the cotangents are the regime's v, k, q, h0^T, do and dh_T
    (``glaref.regimes.make_inputs`` with G = ngroups, dk = dstate, dv = headdim), so the regimes
    of the audit carry over; A = -exp(U(0, 1)) per head (Mamba2's initialisation) and dt is
    chosen so that A dt' is the regime's log_alpha (dt' = log_alpha / A, then through softplus's
    inverse and dt_bias ~ softplus^-1(logU(1e-3, 1e-1)) when dt_softplus). Regimes whose
    log_alpha is not strictly negative (zero_gate, positive) have no such dt and are refused.
    framework "torch": leaves with requires_grad (dy, dfinal_states without); "numpy": arrays.
    """
    D, z, dt_bias, dt_softplus = drawn.D, drawn.z, drawn.dt_bias, drawn.dt_softplus
    dims = Dims(batch, ngroups, nheads, seqlen, dstate, headdim)
    p = regimes.make_inputs(regime, dims, seed)
    if p.log_alpha.size and not (p.log_alpha < 0).all():
        raise ValueError(f"regime: got {regime!r}, whose log_alpha is not strictly negative: no "
                         "positive dt gives A dt = log_alpha with A < 0")
    rng = np.random.default_rng([int(seed), batch, seqlen, nheads, headdim, ngroups, dstate, 2])
    A = -np.exp(rng.uniform(0.0, 1.0, nheads))
    dt_eff = from_canonical(p.log_alpha, "gate", "bthd") / A
    # dt' = dt_eff; the raw dt is what gives it after the bias and the softplus
    raw = np.log(np.expm1(dt_eff)) if dt_softplus else dt_eff          # softplus^-1
    bias = None
    if dt_bias:
        dt_init = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), nheads))
        bias = np.log(np.expm1(dt_init)) if dt_softplus else dt_init
        raw = raw - bias
    Dv = {"head": rng.standard_normal(nheads), "channel": rng.standard_normal((nheads, headdim)),
          None: None}
    if D not in Dv:
        raise ValueError(f"D: got {D!r}, expected 'head', 'channel' or None")
    arrays = {"x": from_canonical(p.v, "v", "bthd"), "dt": raw, "A": A,
              "B": from_canonical(p.k, "qk", "bthd"), "C": from_canonical(p.q, "qk", "bthd"),
              "D": Dv[D], "z": rng.standard_normal((batch, seqlen, nheads, headdim)) if z else None,
              "dt_bias": bias, "initial_states": _T(p.h0),
              "dy": from_canonical(p.do, "v", "bthd"), "dfinal_states": _T(p.dh_T)}
    names = INPUT_NAMES + COTANGENT_NAMES
    vals = _as_framework([arrays[n] for n in names], dtype, framework, device,
                         grads=[n in INPUT_NAMES for n in names])
    out = dict(zip(names, vals))
    out["dt_softplus"] = dt_softplus
    return out
