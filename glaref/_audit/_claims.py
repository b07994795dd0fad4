"""What a kernel claims about itself, as one value: :class:`Claims`, checked once as it is made.

The verdict depends on what is known of a kernel: the layout and dtype of what it receives, the
arithmetic it computes in (compute, accumulate and operand dtypes), its chunk length, how it forms
its decays and its dlog_alpha, its gate kind, which gradients it provides, and whether a design
that is correct but less accurate than the most accurate one should fail (``strict``). Every face
(``glaref audit``, ``glaref.audit``, ``glaref.testing.check_kernel``,
``glaref.testing.assert_close_to_oracle``, the pytest plugin) turns its arguments into one
``Claims`` (whose constructor is the one check) and hands it down; nothing deeper checks an
argument again.

Every bad or contradictory claim raises :class:`glaref.ClaimError` (an ``AuditUsageError`` and a
``DTypeError``, so a ValueError and a TypeError) naming the argument, what it got and what was
expected. Dtypes are accepted as users write them: ``"float32"``, ``np.float32``,
``np.dtype("float32")``, ``torch.float32``, ``jnp.float32`` (never importing torch or jax).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ClaimError, GlarefError
from .._inputs import DTYPES, check_layout, whole_number
from ..regimes import GATES
from ..tolerances import UNIT_ROUNDOFF
from ._verdict import COMPUTE_DTYPES, DLOG_ALPHA_FORMS

if TYPE_CHECKING:                  # the annotation only: _family imports this module
    from ._family import Family

__all__ = ["DECAY_FORMS", "DEFAULT_ACCUMULATE", "FAMILIES", "RECURRENCES", "Claims", "dtype_name",
           "family"]

# The recurrences a kernel may compute, each the family of the audit that judges it (a
# ``glaref._audit._family.Family`` value in its own folder, "module:attribute"), loaded when named
# (:func:`family`): gated linear attention with a scalar or vector gate (glaref's first family,
# the default) and the gated delta rule (glaref.delta). A family plugs into the judging layer,
# which never imports one; the gradients a kernel may claim are its family's ``grads``.
FAMILIES: dict[str, str] = {"scalar_gate": "glaref.gla._family:SCALAR_GATE",
                            "delta": "glaref.delta._family:DELTA"}
RECURRENCES: tuple[str, ...] = tuple(FAMILIES)


def family(recurrence: str) -> Family:
    """The family of ``recurrence``, one of ``RECURRENCES`` (as the claims checked it)."""
    module, _, attribute = FAMILIES[recurrence].partition(":")
    return getattr(importlib.import_module(module), attribute)

# How a kernel forms the decay exp(b_i - b_j) between positions of a chunk: from differences of
# exact segment sums of log_alpha (glaref's kernels), or of a float cumulative sum of log_alpha
# within each chunk (flash-linear-attention's chunk_local_cumsum, Mamba2's dA_cumsum).
DECAY_FORMS = ("segment_sums", "chunk_cumsum")

# What a kernel that says nothing is assumed to accumulate in when its compute dtype is narrower:
# float32, the practice of every production kernel of this recurrence (flash-linear-attention's
# Triton kernels, mamba_ssm's SSD, axlearn's Pallas kernels accumulate dots and carry the state
# in float32). A kernel that really accumulates in its 16-bit input dtype claims accumulate_dtype
# equal to that dtype, and then gets the (much looser) all-16-bit bound.
DEFAULT_ACCUMULATE = "float32"


@dataclass(frozen=True)
class Claims:
    """What a kernel is declared to be; None means unknown (the verdict then allows every
    correct design the field ships). Made from the spellings users write (``Claims(dtype=
    np.float32, chunk_size="64", grads="q,k")``): the constructor checks every field and holds
    its canonical value (``__post_init__``, the one check; ClaimError naming the field).

    layout: "bhtd" or "bthd", that of the arrays it takes and returns. dtype: its inputs'.
    compute_dtype: the arithmetic its errors are measured in (None: ``dtype``; for JAX kernels
    derived from the matmul precision and platform). accumulate_dtype: what a kernel with
    narrower inputs accumulates and carries its states in (None: float32, what production kernels
    do). operand_dtype: the format it rounds its matmul operands to beyond ``dtype``.
    chunk_size: its chunk length (1: step by step). dlog_alpha_form: ``DLOG_ALPHA_FORMS``.
    decay_form: ``DECAY_FORMS``. gate: "scalar" or "vector". grads: the gradients it provides
    (None: all of its recurrence's; a kernel with a constant decay per head has no log_alpha
    gradient). strict: a correct design less accurate than the most accurate one fails.
    recurrence: what it computes (``RECURRENCES``): "scalar_gate" (gated linear attention,
    ``kernel(q, k, v, log_alpha, h0)``) or "delta" (the gated delta rule,
    ``kernel(q, k, v, beta, log_alpha, h0)``).
    """

    layout: str = "bhtd"
    dtype: str = "float32"
    compute_dtype: str | None = None
    accumulate_dtype: str | None = None
    operand_dtype: str | None = None
    chunk_size: int | None = None
    dlog_alpha_form: str | None = None
    decay_form: str | None = None
    gate: str = "scalar"
    grads: tuple[str, ...] | None = None
    strict: bool = False
    recurrence: str = "scalar_gate"

    def __post_init__(self) -> None:
        """The one check of a kernel's claims: every field given in any of the spellings users
        write is replaced by its canonical value.

        Raises
        ------
        glaref.ClaimError
            naming the argument, for a value glaref cannot use, an accumulate dtype less precise
            than the compute dtype, or claims that contradict each other: a step-by-step kernel
            (chunk_size 1) has no chunks, so neither the reverse-cumsum identity for dlog_alpha
            (which sums over a chunk) nor chunk-local cumulative-sum decays.
        """
        try:
            layout = check_layout(self.layout)
        except GlarefError as exc:
            raise ClaimError("layout", str(exc).split(": ", 1)[-1]) from None
        dtype = dtype_name(self.dtype, "dtype", DTYPES)
        cdtype = None if self.compute_dtype is None else dtype_name(self.compute_dtype,
                                                                    "compute_dtype")
        acc = None if self.accumulate_dtype is None else dtype_name(self.accumulate_dtype,
                                                                    "accumulate_dtype", DTYPES)
        if acc is not None and UNIT_ROUNDOFF[acc] > UNIT_ROUNDOFF[cdtype or dtype]:
            raise ClaimError("accumulate_dtype", f"got {self.accumulate_dtype!r}, expected a "
                             f"format at least as precise as the compute dtype {cdtype or dtype!r}")
        operand = None if self.operand_dtype is None else dtype_name(self.operand_dtype,
                                                                     "operand_dtype")
        chunk = None if self.chunk_size is None else _chunk_size(self.chunk_size)
        form = _choice("dlog_alpha_form", self.dlog_alpha_form, DLOG_ALPHA_FORMS)
        decay = _choice("decay_form", self.decay_form, DECAY_FORMS)
        gate = _choice("gate", self.gate, GATES, unknown=False)
        recurrence = _choice("recurrence", self.recurrence, RECURRENCES, unknown=False)
        if not isinstance(self.strict, (bool, np.bool_)):
            raise ClaimError("strict", f"got {self.strict!r} ({type(self.strict).__name__}), "
                             "expected True or False")
        if chunk == 1:
            for argument, value, what in (("dlog_alpha_form", form, "identity"),
                                          ("decay_form", decay, "chunk_cumsum")):
                if value == what:
                    raise ClaimError(argument, f"got {what!r} with chunk_size 1, expected "
                                     f"{'direct' if what == 'identity' else 'segment_sums'} or "
                                     "None: a step-by-step kernel has no chunks to form it over")
        checked = {"layout": layout, "dtype": dtype, "compute_dtype": cdtype,
                   "accumulate_dtype": acc, "operand_dtype": operand, "chunk_size": chunk,
                   "dlog_alpha_form": form, "decay_form": decay, "gate": gate,
                   "grads": _grads(self.grads, family(recurrence).grads),
                   "strict": bool(self.strict), "recurrence": recurrence}
        for name, value in checked.items():
            object.__setattr__(self, name, value)      # frozen: set once, here

    def resolved(self, compute_dtype: str) -> Claims:
        """These claims as judged at ``compute_dtype`` (the face knows it: for JAX kernels it
        depends on the matmul precision and the platform): the compute dtype set, and the
        accumulate dtype the one claimed (``DEFAULT_ACCUMULATE`` when none is) where that is
        strictly more precise than ``compute_dtype`` (a float32 promise means nothing for float32
        or float64 inputs), else None."""
        acc = self.accumulate_dtype or DEFAULT_ACCUMULATE
        if UNIT_ROUNDOFF[acc] >= UNIT_ROUNDOFF[compute_dtype]:
            acc = None
        return replace(self, compute_dtype=compute_dtype, accumulate_dtype=acc)

    def design(self, **known: Any) -> Claims:
        """These claims completed by what a built-in kernel carries of its own (its chunk size,
        accumulate dtype, dlog_alpha form, ...): the fields of ``known`` replace these."""
        return replace(self, **known)

    def judged(self, name: str) -> bool:
        """Whether output or gradient ``name`` is one the kernel claims to provide."""
        return self.grads is None or name not in family(self.recurrence).grads or \
            name in self.grads


def dtype_name(x: Any, argument: str, allowed: tuple[str, ...] = COMPUTE_DTYPES) -> str:
    """The name of a dtype given as a string, a numpy dtype or scalar type, a torch dtype or a
    JAX scalar type ("float32", "bfloat16", ...), one of ``allowed``; else ClaimError."""
    if isinstance(x, str):
        text = x
    elif (type(x).__module__ or "").startswith("torch"):
        text = str(x).rsplit(".", 1)[-1]                       # torch.float32 -> float32
    else:
        try:
            text = np.dtype(x).name if x is not None else None
        except TypeError:
            text = None
    if text not in allowed:
        raise ClaimError(argument, f"got {x!r}, expected one of {allowed}")
    return text


def _chunk_size(x: Any) -> int:
    """A positive integer (an int, a numpy int or a string of digits; never a bool or a float)."""
    t = whole_number(x)
    if t is None:
        raise ClaimError("chunk_size", f"got {x!r} ({type(x).__name__}), expected a positive integer")
    if t < 1:
        raise ClaimError("chunk_size", f"got {t}, expected a positive integer")
    return t


def _choice(argument: str, x: Any, allowed: tuple[str, ...], unknown: bool = True) -> str | None:
    if (x is None and unknown) or (isinstance(x, str) and x in allowed):
        return x
    expected = f"None (unknown) or one of {allowed}" if unknown else f"one of {allowed}"
    raise ClaimError(argument, f"got {x!r}, expected {expected}")


def _grads(x: Any, known: tuple[str, ...]) -> tuple[str, ...] | None:
    if x is None:
        return None
    items = [p.strip() for p in x.split(",") if p.strip()] if isinstance(x, str) else x
    try:
        names = tuple(items)
    except TypeError:
        names = ()
    if not names or any(n not in known for n in names):
        raise ClaimError("grads", f"got {x!r}, expected None (all) or some of {known}")
    return tuple(n for n in known if n in names)
