"""Every tolerance glaref uses, in one table, each with its reason.

Tests and the audit look tolerances up here by name; no test carries a bare literal. A figure is
derived from the unit roundoff ``u`` of the dtype involved and the size of the problem, never
widened until a test passes. Add an entry with its justification rather than a literal elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

# Unit roundoff u = 2**-p for a p-bit significand (round to nearest).
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "tf32": 2.0**-11,  # NVIDIA TensorFloat-32: float32 range, 10 explicit mantissa bits
}


@dataclass(frozen=True)
class Tolerance:
    value: float
    reason: str


U64 = UNIT_ROUNDOFF["float64"]

TOLERANCES: dict[str, Tolerance] = {
    "numba_vs_numpy": Tolerance(
        1e-13,
        "Normwise relative gap between the two float64 oracles. Both sum the same terms in a "
        "different order (blocked vs. step by step); the gap is bounded by ~ n * u64 * kappa with "
        "n the accumulation length (<= T + dk) and kappa the ratio of the sum of |terms| to |sum|. "
        "1e-13 ~ 900 u64 leaves room for n up to ~1e3 on well-scaled inputs; the issue fixes it.",
    ),
}


def tol(name: str) -> float:
    """The value of tolerance ``name`` (KeyError names what exists)."""
    try:
        return TOLERANCES[name].value
    except KeyError:
        raise KeyError(f"no tolerance named {name!r}; known: {sorted(TOLERANCES)}") from None
