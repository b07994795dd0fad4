"""Where the error is, for the scalar-gate family: the error profile of every output of one row.

The family's ``Judge.row_profiles`` hook (``glaref.gla._family.SCALAR_GATE``): the generic profile
and its patterns are ``glaref._audit._where``'s; here they are fed what the scalar gate's verdict
used (``glaref.gla._judge``: the oracle's values, the error scales and the reference kernels, all
cached by its ``Truth``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._audit._where import Profile, profile
from ..tolerances import tol
from . import _baseline, _judge

__all__ = ["row_profiles"]


def row_profiles(truth: _judge.Truth, canonical: dict[str, np.ndarray], dtypes: dict[str, str], *,
                 final: bool, grads: bool, claims=None, **declared) -> dict[str, Profile]:
    """The profile of every output of one row, from what its verdict used: ``truth`` (a
    ``_judge.Truth``: the oracle's values, the scales and the reference kernels, all cached
    there), the kernel's ``canonical`` values and the dtypes they were returned in, and its
    ``claims`` (or the claim keywords, as ``_judge.assess_outputs`` takes them); the band is
    ``calibrated_ratio`` times the reference kernels' profile, as the verdict holds the whole
    output to it."""
    c = _judge._claimed(claims, declared)
    scales = truth.scales(final, grads)
    # the verdict's own references (the same design: chunk size and decay form), cached there
    refs, stick = _judge.claimed_references(truth, c, final, grads)
    # budget_ulps in the unit the verdict measures them in (_judge.assess_output)
    unit = replace(c, compute_dtype=_judge.proven_arithmetic(c)[0])
    dims = truth.p.dims
    out = {}
    for name, x in canonical.items():
        if x is None or not c.judged(name):
            continue
        sc = scales["log_alpha_identity"] if name == "log_alpha" else scales[name]
        base = [_baseline.round_to(refs[r][stick.key(r, name)], dtypes.get(name))
                for r in stick.roles(name)]
        out[name] = profile(name, x, truth.reference(name, final), sc, claims=unit, dims=dims,
                            baseline=base, ratio=tol("calibrated_ratio"))
    return out
