"""The package's error and warning types.

Every message names the argument, what it got and what was expected.
"""

from __future__ import annotations

from typing import Mapping


class GlarefError(Exception):
    """Base class of every error glaref raises on purpose.

    ``argument``: the argument the error is about, as glaref's API names it (None: no single
    one); the message then begins with that name, so that a face can name the argument its own
    way (:meth:`worded`: the CLI shows its flag) without reading the message.
    """

    def __init__(self, message: str = "", argument: str | None = None):
        super().__init__(message)
        self.argument = argument

    def worded(self, names: Mapping[str, str]) -> str:
        """The message with its argument spelled as ``names`` spells it (unchanged when it names
        none or ``names`` has no spelling of it)."""
        msg, arg = str(self), self.argument
        if arg is not None and arg in names and msg.startswith(arg):
            return names[arg] + msg[len(arg):]
        return msg


class ShapeError(GlarefError, ValueError):
    """An argument has the wrong number of dimensions or a size that does not match."""


class DTypeError(GlarefError, TypeError):
    """An argument is not real floating point: an array of another dtype or container (masked,
    object, complex, integer, bool), or a ``scale`` that is not a real number."""


class NonFiniteError(GlarefError, ValueError):
    """An argument holds NaN or infinity (for arrays, ``allow_nonfinite=True`` accepts it)."""


class SeqlensError(GlarefError, ValueError):
    """``cu_seqlens`` is not a list of packed-sequence offsets 0 <= ... <= T (the message names
    the first bad position)."""


class LayoutError(GlarefError, ValueError):
    """An unknown layout name, or arrays that fit the other layout."""


class ArgumentError(GlarefError, ValueError):
    """A non-array argument (``impl``, ``allow_nonfinite``, ...) has a value glaref cannot use."""


class LessAccurateWarning(UserWarning):
    """A kernel passed, but some outputs err more than the most accurate correct designs do:
    within what a design the field ships makes (chunk-local cumulative-sum decays, another
    summation order), so not a failure unless the caller asks for ``strict``."""


class NonFiniteWarning(RuntimeWarning):
    """A result of the oracle holds NaN or infinity. The message names the outputs, where the
    first non-finite value is, and why: finite inputs whose true values (or the products on the
    way to them) overflow float64, naming the argument(s) responsible, or non-finite inputs
    accepted with ``allow_nonfinite=True``."""


# The audit's two kinds of refusal, which the CLI maps to exit codes 2 and 3.
class AuditUsageError(GlarefError, ValueError):
    """A bad argument: unknown preset, config, kernel spec, mode, dtype... (CLI exit code 2)."""


class AuditEnvironmentError(GlarefError, RuntimeError):
    """Something missing from this machine: jax, a backend, matplotlib... (CLI exit code 3)."""


class ClaimError(AuditUsageError, DTypeError):
    """A claim about a kernel (``glaref._audit._claims.Claims``: its layout, dtypes, chunk size, forms,
    gate kind, ...) that glaref cannot use, or two claims that contradict each other. The one
    usage error of every face that takes claims; ``argument`` names the argument (the CLI shows
    its flag), ``detail`` says what was got and what was expected."""

    def __init__(self, argument: str, detail: str):
        super().__init__(f"{argument}: {detail}", argument)
        self.detail = detail

