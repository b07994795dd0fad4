"""The scalar-gate family as the audit sees it: :data:`SCALAR_GATE`, a ``glaref._audit._family.Family``.

Gated linear attention with a scalar (or per-key-dimension) gate, the family every audit runs
unless told ``--recurrence`` / ``recurrence=``: its oracle (``glaref.gla._oracle``), its
problems (``glaref.gla._problems``), its judge (``glaref.gla._judge``: the oracle's side of a
problem and the reference kernels its claims call for), the JAX kernels of ``glaref.kernels``
and the regimes of ``glaref.regimes``.
"""

from __future__ import annotations

import inspect
from typing import Iterable

import numpy as np

from .. import regimes
from .._audit import _probes
from .._audit._claims import Claims
from .._audit._family import Family, Judge
from .._audit._presets import ALL_REGIMES, PRESETS
from .._inputs import _KIND, ARRAYS, FORWARD, GRADS, Dims, Problem
from . import _judge, _problems, _where
from ._oracle import backend

__all__ = ["SCALAR_GATE"]


def _warm_scalar_gate(impl: str, gate: str = "scalar", packed: bool = False) -> None:
    """Compile the Numba oracle (if cached, load it) outside every timing, for the gate kind
    and packing the audit runs."""
    be = backend(impl)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 3, 2))
    v = rng.standard_normal((1, 1, 3, 2))
    la = -np.ones((1, 1, 3) if gate == "scalar" else (1, 1, 3, 2))
    h0 = np.zeros((1, 1, 2, 2))
    be.forward(q, q, v, la, h0, 1.0)
    be.vjp(q, q, v, la, h0, v, h0, 1.0)
    if packed:
        cu = np.array([0, 1, 3])
        h0 = np.zeros((2, 1, 2, 2))
        be.forward(q, q, v, la, h0, 1.0, cu_seqlens=cu)
        be.vjp(q, q, v, la, h0, v, h0, 1.0, cu_seqlens=cu)


def _perturb_scalar_gate(name: str, part: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The probes' perturbation, log_alpha kept negative (scaled by a random factor only)."""
    if name == "log_alpha":
        return part * rng.uniform(0.5, 1.5, part.shape)
    return _probes.perturb(name, part, rng)


def _scalar_oracle_bytes(dims: Dims, modes: Iterable[str]) -> int:
    """About the most host memory the engine's float64 arrays of one problem take at once.

    Counted in float64 elements, with qk = B G T dk (q, k, dq, dk), v = B H T dv (v, do, o, dv),
    hk = B H T dk (per-head dq, dk), g = B H T (log_alpha and its gradient), s = B H dk dv
    (h0, dh_T, h_T, dh0): the inputs and cotangents twice (generated, then rounded to the audited
    dtype; the copy handed to the kernel is the second on a CPU), the forward, its error scales
    and the two same-precision reference kernels' outputs (``glaref.gla._baseline``), and for fwd_bwd
    the gradients, their scales (from per-head gradients), |inputs| and the references' gradients.
    Within 10 % of the peak measured on the seed's largest config (4, 2, 8, 128, 128) at T = 8192.
    """
    B, G, H, T, dk, dv = dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv
    qk, v, hk, g, s = B * G * T * dk, B * H * T * dv, B * H * T * dk, B * H * T, B * H * dk * dv
    inputs = 2 * qk + 2 * v + g + 2 * s
    grads = 2 * qk + v + g + s
    n = 2 * inputs + 2 * (v + s)                               # inputs twice, forward, its scales
    n += 2 * (v + s)                                           # the references' forward
    if "fwd_bwd" in modes:
        n += grads                                             # gradients
        n += (2 * qk + 2 * v + 2 * s)                          # |inputs| for the scales
        n += (2 * qk + v + 2 * g + s) + 2 * hk                 # gradient scales, per-head dq, dk
        n += 2 * (v + s + grads)                               # the references' fwd_bwd
    return 8 * n


def _scalar_fields(p: Problem) -> dict:
    return {n: getattr(p, n) for n in ARRAYS}


def _scalar_builtin_claims(module, name: str, claims: Claims) -> Claims:
    """glaref.kernels' ``name``: its chunk size (the ``chunk_size`` default; 1 for the scan),
    float32 accumulation, operands unrounded, segment-sum decays and its dlog_alpha form for the
    gate kind."""
    chunk = inspect.signature(getattr(module, name)).parameters.get("chunk_size")
    return claims.design(chunk_size=chunk.default if chunk is not None else 1,
                         accumulate_dtype="float32", operand_dtype=None, decay_form="segment_sums",
                         dlog_alpha_form=module.dlog_alpha_form(name, claims.gate))


SCALAR_GATE = Family(
    name="scalar_gate", inputs=GRADS, outputs=FORWARD, grads=GRADS, arrays=ARRAYS, kinds=_KIND,
    regimes=regimes.REGIMES, make_problem=_problems.make_problem, truth=_judge.Truth,
    warm=_warm_scalar_gate, fields=_scalar_fields,
    judge=Judge(_judge.assess_outputs, _judge.locate_nonfinite, _judge.mismatches,
                _where.row_profiles, direct_log_alpha=True),
    kernels="glaref.kernels", builtin_claims=_scalar_builtin_claims, presets=PRESETS,
    all_regimes=ALL_REGIMES, oracle_bytes=_scalar_oracle_bytes, causal=("o", "dq"),
    anticausal=("dk", "dv"),
    perturb=_perturb_scalar_gate)
