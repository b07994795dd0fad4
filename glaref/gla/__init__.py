"""glaref.gla: the scalar-gate family, gated linear attention with a scalar (or per-key-dimension)
gate, glaref's first recurrence (docs/math.md):

    S_t = alpha_t S_{t-1} + k_t^T v_t     alpha_t = exp(log_alpha_t) (or diag(exp(log_alpha_t)))
    o_t = scale * q_t S_t                 h_T = S_T

This folder holds what the family brings to the audit, parallel to ``glaref.delta``: the oracle
(``_reference`` the readable definition, ``_numba`` the compiled one, ``_oracle`` the two behind
one face, ``_budget`` the error scales, ``_exact`` an mpmath check), the same-precision reference
kernels (``_baseline``, ``_baseline_scan``) and the yardstick that picks them (``_designs``), the
problems (``_problems``), the oracle's side of the judging (``_judge``), the golden vectors'
build (``_golden``) and the family value the engine runs (``_family.SCALAR_GATE``). The judging
itself, shared by every family, lives in ``glaref._audit``.

Its public faces keep the package's top level, as the first family's: ``glaref.forward``,
``glaref.vjp``, ``glaref.dlog_alpha_identity``, ``glaref.scales``, ``glaref.kernels`` (the JAX
kernels), ``glaref.regimes`` and ``glaref.golden``. Importing this package loads nothing.
"""
