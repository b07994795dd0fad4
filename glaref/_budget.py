"""Error budgets: the scale of every output element, from the oracle run on absolute values.

Every element of o, h_T and of each gradient is a sum of products of inputs. Running the same
recurrence and vjp on |q|, |k|, |v|, |h0|, |do|, |dh_T| (the decay factors exp(log_alpha) are
already positive) gives, per element, the sum of the absolute values of those terms: the natural
unit of rounding error (docs/math.md). budget_ulps = |x - ref| / (scale * u).
"""

from __future__ import annotations

import numpy as np

from ._inputs import Problem


def scales(p: Problem, scale: float = 1.0, impl: str = "numba") -> dict[str, np.ndarray]:
    """Per-element scales for o, h_T, q, k, v, log_alpha, h0 of canonical problem ``p``."""
    from ._oracle import _backend

    be = _backend(impl)
    a = np.abs
    s = abs(scale)
    o, h_T = be.forward(a(p.q), a(p.k), a(p.v), p.log_alpha, a(p.h0), s)
    out = {"o": o, "h_T": h_T}
    if p.do is not None:
        dh = None if p.dh_T is None else a(p.dh_T)
        g = be.vjp(a(p.q), a(p.k), a(p.v), p.log_alpha, a(p.h0), a(p.do), dh, s)
        out.update(zip(("q", "k", "v", "log_alpha", "h0"), g))
    return out
