"""flash-linear-attention's gated delta rule conventions, both ways: ``chunk_gated_delta_rule`` /
``fused_recurrent_gated_delta_rule`` (Gated DeltaNet, scalar gates) and ``chunk_kda`` /
``fused_recurrent_kda`` (Kimi Delta Attention, vector gates), fla-core 0.6.0.

FLA computes, per batch element and value head, with ``[B, T, H, *]`` arrays (q, k [B, T, HQ, K]
with HQ dividing H: head h reads q/k head h // (H / HQ), glaref's grouping)::

    q^ = q / sqrt(|q|^2 + eps), k^ likewise      when use_qk_l2norm_in_kernel (eps = 1e-6)
    b  = beta, or sigmoid(beta) (x 2 with allow_neg_eigval) when use_beta_sigmoid_in_kernel
    S_t = diag-or-scalar(exp(g_t)) S_{t-1};  S_t += k^_t (b_t (v_t - S_t^T k^_t))^T
    o_t = scale * S_t^T q^_t                     scale=None means K ** -0.5

which is glaref.delta's recurrence with

    glaref.delta   q   k   v   beta   log_alpha   h0              do   dh_T   scale
    FLA            q^  k^  v   b      g           initial_state   do   dht    scale or K**-0.5

g [B, T, H] (GDN) or [B, T, H, K] (KDA). The way back: o, ht, dv, dg, dh0 are glaref's; dq and dk
go through the L2 normalisation by the chain rule in float64 (dx = r (dy - y (y . dy)) with
r = 1 / sqrt(|x|^2 + eps), y = x r), dbeta through the sigmoid (db_raw = dbeta * c s (1 - s),
c = 2 with allow_neg_eigval). ``state_v_first`` states are [B, H, V, K]. Packed sequences
(``cu_seqlens``, B = 1) are passed on to glaref.delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._audit._frameworks import dtype_name, to_host_float64
from .._errors import ShapeError
from ..delta import _oracle as gd
from ..delta._oracle import canonicalize
from .fla import _qkv, _result, _state_in, _state_out

__all__ = ["FLA_NAMES", "L2NORM_EPS", "DeltaOptions", "delta_from_glaref", "delta_inputs",
           "delta_outputs", "delta_reference", "delta_scales"]

L2NORM_EPS = 1e-6       # fla.modules.norm.l2norm.l2norm_fwd's default eps
# FLA's names of the results, in glaref.delta's order (o, h_T, then the six gradients)
FLA_NAMES = ("o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0")
_GLAREF = ("o", "h_T", "q", "k", "v", "beta", "log_alpha", "h0")


def _l2norm(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)
    return x * r, r


def _l2norm_vjp(y: np.ndarray, r: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return r * (dy - y * np.sum(y * dy, axis=-1, keepdims=True))


@dataclass(frozen=True)
class DeltaOptions:
    """The options of an FLA gated-delta-rule / KDA call beyond its arrays, under FLA's names:
    ``use_qk_l2norm_in_kernel`` (q and k L2-normalised inside the kernel),
    ``use_beta_sigmoid_in_kernel`` (beta given raw, through a sigmoid inside the kernel),
    ``allow_neg_eigval`` (that sigmoid times 2: beta in (0, 2)), and ``state_v_first``
    (initial_state, ht, dht and dh0 as [B, H, V, K] instead of [B, H, K, V])."""

    use_qk_l2norm_in_kernel: bool = False
    use_beta_sigmoid_in_kernel: bool = False
    allow_neg_eigval: bool = False
    state_v_first: bool = False


def delta_inputs(q, k, v, g=None, beta=None, scale=None, initial_state=None, do=None, dht=None,
                 *, options: DeltaOptions = DeltaOptions(), cu_seqlens=None) -> dict[str, Any]:
    """glaref.delta's problem for an FLA gated-delta-rule or KDA call: canonical float64 "bhtd"
    arrays under glaref.delta's argument names (q, k after the in-kernel normalisation, beta after
    the in-kernel sigmoid), scale as a float, layout "bhtd", cu_seqlens, and what the way back
    needs (``_l2``: the normalised q, k and their factors; ``_beta_raw``; ``_beta_scale``).

    g None means no decay (DeltaNet); beta None means beta = 1. g of shape [B, T, H] is a scalar
    gate (GDN), [B, T, H, K] a vector gate (KDA). ``options``: the call's FLA options
    (:class:`DeltaOptions`).
    """
    use_beta_sigmoid_in_kernel = options.use_beta_sigmoid_in_kernel
    state_v_first = options.state_v_first
    qa, ka, va = _qkv(q, k, v, "q and k heads are shared by groups of value heads")
    B, T, HQ, K = qa.shape
    H, V = va.shape[2], va.shape[3]
    la = np.zeros((B, T, H)) if g is None else to_host_float64(g, "g")
    if la.shape not in ((B, T, H), (B, T, H, K)):
        raise ShapeError(f"g: got shape {la.shape}, expected {(B, T, H)} [B, T, H] (GDN) or "
                         f"{(B, T, H, K)} [B, T, H, K] (KDA)")
    braw = np.ones((B, T, H)) if beta is None else to_host_float64(beta, "beta")
    if braw.shape != (B, T, H):
        raise ShapeError(f"beta: got shape {braw.shape}, expected {(B, T, H)} [B, T, H]")
    bscale = 2.0 if options.allow_neg_eigval else 1.0
    b = bscale / (1.0 + np.exp(-braw)) if use_beta_sigmoid_in_kernel else braw
    l2 = None
    if options.use_qk_l2norm_in_kernel:
        (qa, rq), (ka, rk) = _l2norm(qa), _l2norm(ka)
        l2 = (qa, rq, ka, rk)
    NS = B if cu_seqlens is None else len(np.asarray(cu_seqlens)) - 1
    h0 = _state_in(initial_state, "initial_state", (NS, H, K, V), state_v_first)
    dh_T = _state_in(dht, "dht", (NS, H, K, V), state_v_first)
    dp = canonicalize(qa, ka, va, b, la, h0, None if do is None else to_host_float64(do, "do"),
                      dh_T, layout="bthd", cu_seqlens=cu_seqlens)
    p = dp.p
    return {"q": p.q, "k": p.k, "v": p.v, "beta": dp.beta, "log_alpha": p.log_alpha, "h0": p.h0,
            "do": p.do, "dh_T": p.dh_T, "scale": float(K ** -0.5 if scale is None else scale),
            "layout": "bhtd", "cu_seqlens": p.cu_seqlens, "dtype": dtype_name(q),
            "_l2": l2, "_beta_raw": braw if use_beta_sigmoid_in_kernel else None,
            "_beta_scale": bscale}


def delta_from_glaref(results: dict[str, Any], *, state_v_first: bool = False,
                      inputs: dict[str, Any] | None = None) -> dict[str, np.ndarray | None]:
    """glaref.delta's canonical results (keys o, h_T, q, k, v, beta, log_alpha, h0) under FLA's
    names and layout (``FLA_NAMES``). With ``inputs`` (``delta_inputs``'s dict) dq and dk are
    taken back through the in-kernel L2 normalisation and dbeta through the in-kernel sigmoid."""
    def get(name):
        return _result(results, name)

    def bthd(name, kind):
        return _result(results, name, kind)

    dq, dk, db = bthd("q", "qk"), bthd("k", "qk"), bthd("beta", "gate")
    if inputs is not None and inputs.get("_l2") is not None:
        qn, rq, kn, rk = inputs["_l2"]
        dq = None if dq is None else _l2norm_vjp(qn, rq, dq)
        dk = None if dk is None else _l2norm_vjp(kn, rk, dk)
    if inputs is not None and inputs.get("_beta_raw") is not None and db is not None:
        s = 1.0 / (1.0 + np.exp(-inputs["_beta_raw"]))
        db = db * inputs["_beta_scale"] * s * (1.0 - s)
    return {"o": bthd("o", "v"), "ht": _state_out(get("h_T"), state_v_first), "dq": dq,
            "dk": dk, "dv": bthd("v", "v"), "dbeta": db, "dg": bthd("log_alpha", "gate"),
            "dh0": _state_out(get("h0"), state_v_first)}


def _run(fn_scales: bool, m: dict[str, Any], impl: str,
         options: DeltaOptions) -> dict[str, np.ndarray | None]:
    """The oracle's results (``fn_scales``: the scales) for ``delta_inputs``'s problem ``m``."""
    args = (m["q"], m["k"], m["v"], m["beta"], m["log_alpha"], m["h0"])
    opts = dict(scale=m["scale"], impl=impl, cu_seqlens=m["cu_seqlens"])
    if fn_scales:
        s = gd.scales(*args, m["do"], m["dh_T"], **opts)
        res = dict(zip(_GLAREF, s))
    else:
        o, h_T = gd.forward(*args, **opts)
        res = {"o": o, "h_T": h_T}
        if m["do"] is not None:
            res.update(zip(_GLAREF[2:], gd.vjp(*args, m["do"], m["dh_T"], **opts)))
    return delta_from_glaref(res, state_v_first=options.state_v_first,
                             inputs=None if fn_scales else m)


def delta_reference(q, k, v, g=None, beta=None, scale=None, initial_state=None, do=None,
                    dht=None, *, options: DeltaOptions = DeltaOptions(), cu_seqlens=None,
                    impl: str = "numba") -> dict[str, np.ndarray | None]:
    """The float64 oracle's results for an FLA gated-delta-rule / KDA call under FLA's names
    (``FLA_NAMES``): o and ht always, every gradient with ``do`` (dht None: no cotangent on the
    final state), dq and dk through the in-kernel L2 normalisation, dbeta through the in-kernel
    sigmoid. ``options`` and ``cu_seqlens`` as ``delta_inputs``'s."""
    m = delta_inputs(q, k, v, g, beta, scale, initial_state, do, dht, options=options,
                     cu_seqlens=cu_seqlens)
    return _run(False, m, impl, options)


def delta_scales(q, k, v, g=None, beta=None, scale=None, initial_state=None, do=None, dht=None,
                 *, options: DeltaOptions = DeltaOptions(), cu_seqlens=None,
                 impl: str = "numba") -> dict[str, np.ndarray | None]:
    """Per-element error scales (``glaref.delta.scales``) of the results of ``delta_reference``
    under FLA's names, for the recurrence's own inputs (after the in-kernel normalisation and
    sigmoid; the chain rule's elementwise products are not included)."""
    m = delta_inputs(q, k, v, g, beta, scale, initial_state, do, dht, options=options,
                     cu_seqlens=cu_seqlens)
    return _run(True, m, impl, options)


def delta_outputs(o=None, ht=None, dq=None, dk=None, dv=None, dbeta=None, dg=None, dh0=None, *,
                  state_v_first: bool = False) -> dict[str, Any]:
    """An FLA kernel's results under FLA's names (``FLA_NAMES``), as float64 arrays in FLA's
    layout, with ``dtypes`` (each result's dtype name): the form ``delta_reference`` returns, to
    compare key by key. A result not given is None."""
    out: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    for name, x in zip(FLA_NAMES, (o, ht, dq, dk, dv, dbeta, dg, dh0)):
        if x is None:
            out[name] = None
            continue
        a = to_host_float64(x, name)
        dtypes[name] = dtype_name(x)
        out[name] = _state_out(a, state_v_first) if name in ("ht", "dh0") else a
    out["dtypes"] = dtypes
    return out

