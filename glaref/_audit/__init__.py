"""The audit engine behind ``glaref.audit``: per-output, per-gradient accuracy and cost of JAX
kernels vs the float64 oracle.

    import glaref
    records = glaref.audit(impls="chunked,scan", configs="g1h1_d128", seqs=[512], json_path="r.json")

Each record has the seed report's fields (impl, mode, config, batch, groups, heads, seq, dk, dv,
compile_s, inner, median_ms, q1_ms, q3_ms, xla_temp_mb, xla_arg_mb, xla_out_mb, residual_mb,
rel_err, rel_err_grads) plus ``RECORD_ADDITIONS``; ``rel_err`` is the worst normwise relative error
over the outputs measured in the row (o and, when the kernel returns it, h_T; every gradient too
in mode fwd_bwd), ``rel_err_out`` the forward outputs' own. Per output, ``budget_ulps`` (error in
units of the compute dtype's u times the element's sum of |terms|) and ``budget_bound`` (what a
correct kernel can reach) give the verdict (glaref._verdict): ``ok`` is false when an output is
non-finite or over its bound, or the kernel raised or returned the wrong structure or dtype, and
``failures`` then names each failing output with its figure (or the reason). ``ok`` is null for
a row glaref skipped (not enough memory for the kernel's XLA buffers or the oracle's arrays),
the reason in ``skipped``. The CLI (``glaref audit``) is a thin face over :func:`audit`.

``glaref.audit`` is :func:`audit` itself (a plain function, loaded on first use);
``glaref.AuditUsageError`` and ``glaref.AuditEnvironmentError`` are its refusals. This package
is private: the CLI, ``glaref.testing`` and the tools reach the rest (``summary``, the presets,
``RECORD_ADDITIONS``) here.
"""

from __future__ import annotations

from .._errors import AuditEnvironmentError, AuditUsageError
from ._engine import audit
from ._presets import CONFIGS, PRESETS, SEED_CONFIGS
from ._report import RECORD_ADDITIONS, summary

__all__ = ["AuditEnvironmentError", "AuditUsageError", "CONFIGS", "PRESETS", "RECORD_ADDITIONS",
           "SEED_CONFIGS", "audit", "summary"]
