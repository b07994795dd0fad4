"""glaref: the float64 ground truth for scalar-gated linear attention.

    o, h_T = glaref.forward(q, k, v, log_alpha, h0=None, scale=1.0, layout="bhtd")
    g = glaref.vjp(q, k, v, log_alpha, h0, do, dh_T=None, scale=1.0, layout="bhtd")

Importing glaref is cheap: numba, jax and the audit engine load only when first used.
"""

from __future__ import annotations

import importlib

from ._errors import (
    ArgumentError,
    AuditEnvironmentError,
    AuditUsageError,
    ClaimError,
    DTypeError,
    GlarefError,
    LayoutError,
    NonFiniteError,
    NonFiniteWarning,
    SeqlensError,
    ShapeError,
)
from .gla._oracle import Grads, dlog_alpha_identity, forward, vjp

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "AuditEnvironmentError",
    "AuditUsageError",
    "ClaimError",
    "DTypeError",
    "audit",
    "kernels",
    "scales",
    "GlarefError",
    "golden",
    "Grads",
    "Scales",
    "LayoutError",
    "NonFiniteError",
    "NonFiniteWarning",
    "SeqlensError",
    "ShapeError",
    "__version__",
    "dlog_alpha_identity",
    "forward",
    "vjp",
]


def __getattr__(name: str):
    # Lazy attributes: the audit engine and the JAX kernels pull in jax; scales pulls in the oracle.
    if name == "audit":
        # the engine's entry point, a plain function (its package, glaref._audit, is private)
        from ._audit._engine import audit
        return audit
    if name in ("kernels", "golden", "delta"):
        return importlib.import_module(f".{name}", __name__)
    if name == "scales":
        from .gla._budget import scales as public_scales
        return public_scales
    if name == "Scales":
        from .gla._budget import Scales
        return Scales
    raise AttributeError(f"module 'glaref' has no attribute {name!r}")
