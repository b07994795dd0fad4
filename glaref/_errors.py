"""The package's error types.

Every message names the argument, what it got and what was expected.
"""

from __future__ import annotations


class GlarefError(Exception):
    """Base class of every error glaref raises on purpose."""


class ShapeError(GlarefError, ValueError):
    """An argument has the wrong number of dimensions or a size that does not match."""


class DTypeError(GlarefError, TypeError):
    """An argument is not a real floating-point array."""


class NonFiniteError(GlarefError, ValueError):
    """An argument holds NaN or infinity (pass ``allow_nonfinite=True`` to accept it)."""


class SeqlensError(GlarefError, ValueError):
    """``cu_seqlens`` is not a list of packed-sequence offsets 0 <= ... <= T (the message names
    the first bad position)."""


class LayoutError(GlarefError, ValueError):
    """An unknown layout name."""
