"""flash-linear-attention's ``simple_gla`` convention, both ways.

flash-linear-attention (fla-core 0.6.0: ``chunk_simple_gla``, ``fused_recurrent_simple_gla``,
``parallel_simple_gla`` and the ``naive_recurrent_simple_gla`` reference they are tested against)
computes, per batch element and head, with ``[B, T, H, *]`` arrays::

    S_0 = initial_state                                  [K, V]   ([V, K] with state_v_first)
    S_t = exp(g_t + g_gamma) S_{t-1} + k_t^T v_t         g: [B, T, H], g_gamma: [H]
    o_t = scale * q_t S_t                                scale=None means K ** -0.5
    final_state = S_T                                    (when output_final_state)

g and g_gamma are log decays; FLA's docstring asks for one of them, and its kernels apply both
when both are given (each multiplies the state by its own exp), so their sum is the step's log
decay: glaref's ``log_alpha = g + g_gamma`` (either may be absent, both absent means no decay).
The mapping to glaref is then a change of layout ("bthd" -> "bhtd") and, with
``state_v_first``, a transpose of the states:

    glaref   q  k  v  log_alpha       h0             do   dh_T  scale
    FLA      q  k  v  g + g_gamma     initial_state  do   dht   scale or K ** -0.5

and back: o, ht (= h_T), dq, dk, dv, dg (= dlog_alpha), dg_gamma (= dlog_alpha summed over b and
t, per head) and dh0. FLA's chunked backward returns no gradient for g_gamma; a kernel that does
(a plain autograd one) is compared through the key ``LOG_ALPHA_BT_SUM``.

Heads: fla-core 0.6.0's simple_gla takes q, k and v with the same H. q and k with fewer heads G
(G dividing v's H, head h reading q/k head h // (H/G): grouped value heads, glaref's grouping)
are accepted too. q with *more* heads than v (several query heads reading one state) is not this
recurrence's grouping and is refused. Variable-length batches (``cu_seqlens``) are not handled:
split them into a batch first.

gla (``chunk_gla``, ``fused_recurrent_gla``, ``naive_recurrent_gla``) has per-key-dimension
(vector) gates ``g`` (``gk`` in the recurrent ones) [B, T, H, K]: S_t = diag(exp(g_t)) S_{t-1} +
k_t^T v_t, otherwise as simple_gla. That is glaref's vector gate (``log_alpha`` (B, H, T, dk),
docs/math.md section 9): the ``gla_*`` functions below map it the same way, dg (= dlog_alpha)
of shape [B, T, H, K]. ``gv`` (gates on the value dimension) has no glaref counterpart.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import regimes
from .._audit._frameworks import _numpy_dtype, dtype_name, to_host_float64
from .._errors import ShapeError
from .._inputs import Dims, canonicalize, from_canonical, to_canonical
from ..gla import _budget, _oracle
from . import GLAREF_NAMES, LOG_ALPHA_BT_SUM

__all__ = ["gla_case", "gla_inputs", "gla_outputs", "simple_gla_case", "simple_gla_from_glaref",
           "simple_gla_inputs", "simple_gla_outputs", "simple_gla_reference", "simple_gla_scales"]


def _ndim(a: np.ndarray, name: str, ndim: int, spelled: str) -> None:
    if a.ndim != ndim:
        raise ShapeError(f"{name}: got shape {a.shape} ({a.ndim} dims), expected {spelled}")


def _qkv(q: Any, k: Any, v: Any, gqa: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FLA's q, k ([B, T, HQ, K]) and v ([B, T, H, V]) as float64 host arrays, their shapes
    checked; ``gqa`` says why more query heads than value heads is refused."""
    qa, ka, va = to_host_float64(q, "q"), to_host_float64(k, "k"), to_host_float64(v, "v")
    _ndim(qa, "q", 4, "4 dims [B, T, HQ, K]")
    _ndim(ka, "k", 4, "4 dims [B, T, HQ, K]")
    _ndim(va, "v", 4, "4 dims [B, T, H, V]")
    HQ, H = qa.shape[2], va.shape[2]
    if HQ > H:
        raise ShapeError(f"q: got {HQ} heads for v's {H}, expected at most {H}: {gqa}")
    return qa, ka, va


def _result(results: Mapping[str, Any], name: str, kind: str | None = None) -> np.ndarray | None:
    """``results[name]`` as a float64 array (None when missing or None); with ``kind`` ("qk",
    "v", "gate") taken from glaref's "bhtd" layout to FLA's [B, T, H, ...]."""
    x = results.get(name)
    if x is None:
        return None
    x = np.asarray(x, dtype=np.float64)
    return x if kind is None else from_canonical(x, kind, "bthd")


def _state_in(x: Any, name: str, shape: tuple[int, ...], v_first: bool) -> np.ndarray | None:
    """An FLA state ([B, H, K, V], or [B, H, V, K] when v_first) as glaref's (B, H, K, V)."""
    if x is None:
        return None
    a = to_host_float64(x, name)
    B, H, K, V = shape
    want = (B, H, V, K) if v_first else (B, H, K, V)
    if a.shape != want:
        spelled = "[B, H, V, K] (state_v_first)" if v_first else "[B, H, K, V]"
        raise ShapeError(f"{name}: got shape {a.shape}, expected {want} {spelled}")
    return np.ascontiguousarray(np.swapaxes(a, -1, -2)) if v_first else a


def _state_out(a: np.ndarray | None, v_first: bool) -> np.ndarray | None:
    if a is None:
        return None
    return np.ascontiguousarray(np.swapaxes(a, -1, -2)) if v_first else a


def simple_gla_inputs(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, do=None,
                      dht=None, state_v_first: bool = False) -> dict[str, Any]:
    """glaref's problem for a simple_gla call: a dict of canonical float64 "bhtd" arrays.

    Keys: q, k, v, log_alpha (= g + g_gamma), h0 (zeros when initial_state is None), do, dh_T
    (None when not given), scale (a float: K ** -0.5 when None, as FLA), layout ("bhtd"), and
    dtype (the dtype name of q as the kernel received it). The keys other than dtype are
    ``glaref.vjp``'s arguments. Arrays of any framework and device are read (torch tensors are
    detached and copied to the host); every value is widened exactly. g + g_gamma is one float64
    addition (exact for float32 and 16-bit gates of comparable size, within 1 u64 otherwise).
    """
    qa, ka, va = _qkv(q, k, v, "several query heads reading one state (GQA) is not "
                      "simple_gla's recurrence")
    B, T, G, K = qa.shape
    H, V = va.shape[2], va.shape[3]
    log_alpha = np.zeros((B, T, H))
    if g is not None:
        ga = to_host_float64(g, "g")
        if ga.shape != (B, T, H):
            raise ShapeError(f"g: got shape {ga.shape}, expected {(B, T, H)} [B, T, H]")
        log_alpha = log_alpha + ga
    if g_gamma is not None:
        gg = to_host_float64(g_gamma, "g_gamma")
        if gg.shape != (H,):
            raise ShapeError(f"g_gamma: got shape {gg.shape}, expected {(H,)} [H]")
        log_alpha = log_alpha + gg
    h0 = _state_in(initial_state, "initial_state", (B, H, K, V), state_v_first)
    dh_T = _state_in(dht, "dht", (B, H, K, V), state_v_first)
    p = canonicalize(qa, ka, va, log_alpha, h0, None if do is None else to_host_float64(do, "do"),
                     dh_T, layout="bthd")
    return {"q": p.q, "k": p.k, "v": p.v, "log_alpha": p.log_alpha, "h0": p.h0, "do": p.do,
            "dh_T": p.dh_T, "scale": float(K ** -0.5 if scale is None else scale),
            "layout": "bhtd", "dtype": dtype_name(q)}


def simple_gla_outputs(o=None, ht=None, dq=None, dk=None, dv=None, dg=None, dh0=None,
                       dg_gamma=None, *, state_v_first: bool = False) -> dict[str, Any]:
    """A simple_gla kernel's results under glaref's names, canonical float64 "bhtd".

    Keys: o, h_T, q, k, v, log_alpha (the gradients dq, dk, dv, dg), h0 (dh0), LOG_ALPHA_BT_SUM
    (dg_gamma, shape (H,)) and ``dtypes`` (the dtype name of each result given). A result not
    given (None: not computed) is None, to be skipped, not failed. Arrays of any framework and
    device are read (torch tensors detached and copied to the host) and widened exactly.
    """
    out: dict[str, Any] = {}
    dtypes: dict[str, str] = {}

    def take(x, fla_name: str, name: str, kind: str, ndim: int, spelled: str):
        if x is None:
            out[name] = None
            return
        a = to_host_float64(x, fla_name)
        _ndim(a, fla_name, ndim, spelled)
        dtypes[name] = dtype_name(x)
        if kind == "state":
            out[name] = _state_out(a, state_v_first)      # the transpose is its own inverse
        elif kind == "head":
            out[name] = a
        else:
            out[name] = to_canonical(a, kind, "bthd")

    take(o, "o", "o", "v", 4, "4 dims [B, T, H, V]")
    take(ht, "ht", "h_T", "state", 4, "4 dims [B, H, K, V]")
    take(dq, "dq", "q", "qk", 4, "4 dims [B, T, H, K]")
    take(dk, "dk", "k", "qk", 4, "4 dims [B, T, H, K]")
    take(dv, "dv", "v", "v", 4, "4 dims [B, T, H, V]")
    take(dg, "dg", "log_alpha", "gate", 3, "3 dims [B, T, H]")
    take(dh0, "dh0", "h0", "state", 4, "4 dims [B, H, K, V]")
    take(dg_gamma, "dg_gamma", LOG_ALPHA_BT_SUM, "head", 1, "1 dim [H]")
    out["dtypes"] = dtypes
    return out


def simple_gla_from_glaref(results: Mapping[str, Any], *, g: bool = True, g_gamma: bool = False,
                           state_v_first: bool = False) -> dict[str, np.ndarray | None]:
    """glaref's canonical results (keys o, h_T, q, k, v, log_alpha, h0; any may be missing or
    None) under FLA's names: o [B, T, H, V], ht, dq, dk, dv, dg [B, T, H] (when the call had a
    ``g``), dg_gamma [H] (dlog_alpha summed over b and t; when it had a ``g_gamma``), dh0."""
    def get(name):
        return _result(results, name)

    def bthd(name, kind):
        return _result(results, name, kind)

    dla = get("log_alpha")
    return {"o": bthd("o", "v"), "ht": _state_out(get("h_T"), state_v_first),
            "dq": bthd("q", "qk"), "dk": bthd("k", "qk"), "dv": bthd("v", "v"),
            "dg": bthd("log_alpha", "gate") if g else None,
            "dg_gamma": (dla.sum(axis=(0, 2)) if dla is not None else None) if g_gamma else None,
            "dh0": _state_out(get("h0"), state_v_first)}


def _reference(fn_scales: bool, q, k, v, g, g_gamma, scale, initial_state, do, dht,
               state_v_first, impl):
    m = simple_gla_inputs(q, k, v, g, g_gamma, scale, initial_state, do, dht, state_v_first)
    args = (m["q"], m["k"], m["v"], m["log_alpha"], m["h0"])
    if fn_scales:
        s = _budget.scales(*args, m["do"], m["dh_T"], scale=m["scale"], impl=impl)
        res = {n: getattr(s, n) for n in GLAREF_NAMES}
    else:
        o, h_T = _oracle.forward(*args, scale=m["scale"], impl=impl)
        res = {"o": o, "h_T": h_T}
        if m["do"] is not None:
            gr = _oracle.vjp(*args, m["do"], m["dh_T"], scale=m["scale"], impl=impl)
            res.update(q=gr.q, k=gr.k, v=gr.v, log_alpha=gr.log_alpha, h0=gr.h0)
    return simple_gla_from_glaref(res, g=g is not None, g_gamma=g_gamma is not None,
                                  state_v_first=state_v_first)


def simple_gla_reference(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, do=None,
                         dht=None, state_v_first: bool = False, impl: str = "numba"):
    """The float64 oracle's results for a simple_gla call, under FLA's names (see
    :func:`simple_gla_from_glaref`): o and ht always; with ``do`` every gradient (dht None means
    no cotangent on the final state). Arguments as FLA's, plus the cotangents do and dht."""
    return _reference(False, q, k, v, g, g_gamma, scale, initial_state, do, dht, state_v_first,
                      impl)


def simple_gla_scales(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, do=None,
                      dht=None, state_v_first: bool = False, impl: str = "numba"):
    """Per-element error scales (the sum of |terms| of each element, ``glaref.scales``) of every
    result of :func:`simple_gla_reference`, under FLA's names; dg_gamma's is the sum of dg's."""
    return _reference(True, q, k, v, g, g_gamma, scale, initial_state, do, dht, state_v_first,
                      impl)


def simple_gla_case(B: int, T: int, H: int, K: int, V: int, dtype: Any = "float32", seed: int = 0,
                    regime: str = "standard", framework: str = "torch", device: str = "cpu",
                    state_v_first: bool = False):
    """Random simple_gla inputs and cotangents in FLA's layout: ``(q, k, v, g, h0, do, dht)``.

    Drawn by ``glaref.regimes.make_inputs(regime, ...)`` (so the same seed and sizes give the same
    numbers, and every regime of the audit is available), then rounded to ``dtype`` (a name or a
    torch dtype). framework "torch": tensors on ``device``, q, k, v, g and h0 leaves with
    requires_grad; "numpy": arrays (bfloat16 needs ml_dtypes). h0 and dht are [B, H, K, V], or
    [B, H, V, K] with ``state_v_first``.
    """
    p = regimes.make_inputs(regime, Dims(B, H, H, T, K, V), seed)
    arrays = [from_canonical(p.q, "qk", "bthd"), from_canonical(p.k, "qk", "bthd"),
              from_canonical(p.v, "v", "bthd"), from_canonical(p.log_alpha, "gate", "bthd"),
              _state_out(p.h0, state_v_first), from_canonical(p.do, "v", "bthd"),
              _state_out(p.dh_T, state_v_first)]
    return _as_framework(arrays, dtype, framework, device, grads=(True,) * 5 + (False,) * 2)


def _as_framework(arrays, dtype, framework: str, device: str, grads):
    """numpy float64 arrays as ``framework`` arrays of ``dtype`` (torch leaves with
    requires_grad where ``grads`` says so)."""
    if framework == "torch":
        import torch

        tdtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(tdtype, torch.dtype):
            raise ValueError(f"dtype: got {dtype!r}, expected a torch dtype or its name")
        return tuple(None if a is None else
                     torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=tdtype)
                     .requires_grad_(gr) for a, gr in zip(arrays, grads))
    if framework == "numpy":
        npd = _numpy_dtype(dtype if isinstance(dtype, str) else np.dtype(dtype).name)
        return tuple(None if a is None else np.ascontiguousarray(a).astype(npd) for a in arrays)
    raise ValueError(f"framework: got {framework!r}, expected 'torch' or 'numpy'")


# ---------------------------------------------------------------- gla: vector gates

def gla_inputs(q, k, v, g, scale=None, initial_state=None, do=None, dht=None,
               state_v_first: bool = False) -> dict[str, Any]:
    """glaref's problem for a gla call (vector gates ``g`` [B, T, H, K], FLA's ``gk``), as
    :func:`simple_gla_inputs` gives it for simple_gla: log_alpha is g in the "bhtd" layout,
    (B, H, T, K)."""
    qa, va, ga = to_host_float64(q, "q"), to_host_float64(v, "v"), to_host_float64(g, "g")
    _ndim(qa, "q", 4, "4 dims [B, T, H, K]")
    _ndim(va, "v", 4, "4 dims [B, T, H, V]")
    B, T, _, K = qa.shape
    H = va.shape[2]
    if ga.shape != (B, T, H, K):
        raise ShapeError(f"g: got shape {ga.shape}, expected {(B, T, H, K)} [B, T, H, K] "
                         "(one log decay per key dimension)")
    m = simple_gla_inputs(q, k, v, None, None, scale, initial_state, do, dht, state_v_first)
    m["log_alpha"] = to_canonical(ga, "gate", "bthd")
    return m


def gla_outputs(o=None, ht=None, dq=None, dk=None, dv=None, dg=None, dh0=None, *,
                state_v_first: bool = False) -> dict[str, Any]:
    """A gla kernel's results under glaref's names, as :func:`simple_gla_outputs` (dg [B, T, H, K]
    becomes log_alpha's gradient, (B, H, T, K))."""
    out = simple_gla_outputs(o, ht, dq, dk, dv, None, dh0, state_v_first=state_v_first)
    if dg is not None:
        a = to_host_float64(dg, "dg")
        _ndim(a, "dg", 4, "4 dims [B, T, H, K]")
        out["log_alpha"] = to_canonical(a, "gate", "bthd")
        out["dtypes"]["log_alpha"] = dtype_name(dg)
    return out


def gla_case(B: int, T: int, H: int, K: int, V: int, dtype: Any = "float32", seed: int = 0,
             regime: str = "standard", framework: str = "torch", device: str = "cpu",
             state_v_first: bool = False):
    """Random gla inputs and cotangents in FLA's layout, ``(q, k, v, g, h0, do, dht)`` with g
    [B, T, H, K]: glaref's regime drawn with vector gates, otherwise as :func:`simple_gla_case`."""
    p = regimes.make_inputs(regime, Dims(B, H, H, T, K, V), seed, gate="vector")
    arrays = [from_canonical(p.q, "qk", "bthd"), from_canonical(p.k, "qk", "bthd"),
              from_canonical(p.v, "v", "bthd"), from_canonical(p.log_alpha, "gate", "bthd"),
              _state_out(p.h0, state_v_first), from_canonical(p.do, "v", "bthd"),
              _state_out(p.dh_T, state_v_first)]
    return _as_framework(arrays, dtype, framework, device, grads=(True,) * 5 + (False,) * 2)
