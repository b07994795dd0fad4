"""Which reference kernels a scalar-gate kernel's claims call for: the family's table of the
calibrated verdict, filled with the ``Design`` and ``Yardstick`` of ``glaref._audit._designs``.

Two things are never confused here: *the oracle* is the float64 truth (``glaref.gla._oracle``); the
*reference kernels* are correct designs of the recurrence run in the kernel's own arithmetic on
exactly its inputs (``glaref.gla._baseline.run``), whose errors against the oracle say what a correct
kernel errs. :func:`yardstick` reads what is claimed (the chunk size, the decay form and the
dlog_alpha form) and returns which reference kernels to run (``Yardstick.designs``, read by
``glaref.gla._judge.Truth.references`` to run them), which of their outputs judges each of the
kernel's (``Yardstick.key``), and how their errors combine into the baseline
(``Yardstick.held_to`` and ``Yardstick.extremes``, read by ``glaref._audit._verdict.widen`` and
``looseness``) and into the envelope of the field's correct designs (``Yardstick.field``,
read by ``glaref._audit._verdict.calibrated``: ok within the baseline's rule, less accurate within the
envelope's, FAIL beyond it; docs/budgets.md, section 9).

Adding a reference design:
  1. teach ``glaref.gla._baseline.run`` the design (a kernel name, or a ``decay`` / ``order``);
  2. add a role to ``DESIGNS`` below (role name -> ``Design(kernel, chunk, label, ...)``), or
     build the Design in :func:`yardstick` when its chunk comes from the claims;
  3. in :func:`yardstick`, put the role in the designs of the claims that call for it, and say
     whether it is what the kernel is held to, an extreme that widens the baseline, or a field
     design that widens the envelope (give it a ``family``, and the declaration that holds a
     kernel to it alone in ``declares``).
Nothing else names the roles: the engine, the records and the messages follow the table.
"""

from __future__ import annotations

from dataclasses import replace

from .._audit._designs import SCAN_SEQUENTIAL, Design, Table, Yardstick
from ._baseline import CHUNK, CHUNK_WIDE

__all__ = ["DESIGNS", "SCAN_SEQUENTIAL", "chunk_cumsum", "identity", "yardstick"]


def chunk_cumsum(C: int) -> Design:
    """The field's chunked design at chunk C: decays from chunk-local cumulative sums."""
    return Design("chunked", C, f"{C}-step chunks with chunk-local cumsum decays",
                  decay="chunk_cumsum",
                  family=f"decays from chunk-local cumulative sums over {C} steps "
                         "(flash-linear-attention's chunk_local_cumsum, Mamba2's dA_cumsum)",
                  declares="decay_form='chunk_cumsum'")


def identity(design: Design) -> Design:
    """The field's design of dlog_alpha in a chunked ``design``: the chunk-local reverse-cumsum
    identity sum_{s >= t} (q_s . dq_s - k_s . dk_s) plus the chunk's state term
    (flash-linear-attention's chunk kernels). Its pairs cancel under strong decay, so it errs
    more than the direct form alpha_t <S_{t-1}, G_t>, bounded by the chunk, never by T
    (docs/budgets.md, section 9)."""
    cumsum = ", decays from chunk-local cumulative sums" if design.decay == "chunk_cumsum" else ""
    also = "" if design.declares is None else f" and {design.declares}"
    return replace(design, label=f"{design.label}, dlog_alpha by the identity",
                   dlog_alpha="identity", declares=f"dlog_alpha_form='identity'{also}",
                   family=f"dlog_alpha by the chunk-local reverse-cumsum identity over "
                          f"{design.chunk} steps{cumsum} (flash-linear-attention's chunk kernels)")


DESIGNS: dict[str, Design] = {
    "scan": Design("scan", None, "a step-by-step scan"),
    "chunked": Design("chunked", CHUNK, f"{CHUNK}-step chunks"),
    "chunked_wide": Design("chunked", CHUNK_WIDE, f"{CHUNK_WIDE}-step chunks"),
}


def yardstick(chunk_size: int | None, decay_form: str | None = None,
              dlog_alpha_form: str | None = None) -> Yardstick:
    """The reference kernels for a kernel of ``chunk_size`` (1: step by step; None: unknown)
    whose decays are of ``decay_form`` (``glaref._audit._claims.DECAY_FORMS``; None: unknown) and whose
    dlog_alpha is of ``dlog_alpha_form`` (``glaref._audit._verdict.DLOG_ALPHA_FORMS``; None: unknown).

    A step-by-step kernel is held to the scan, its envelope the scan summing term by term; a
    chunked one (C) to the segment-sum chunked reference at C, its envelope the chunk-local
    cumsum design at C, or to that design alone when it declares chunk_cumsum decays (and the
    segment-sum one alone when it declares segment sums); one of unknown structure to the
    64-step chunked reference, widened towards a scan and towards 256-step chunks
    (``glaref._audit._verdict.widen``), its envelope the chunk-local cumsum design at 64 steps
    (flash-linear-attention's default chunk) and the term-by-term scan.

    dlog_alpha: a kernel declaring the identity is held to the references' own form (the
    identity of the chunked ones); one declaring the direct form, or none, to the direct form,
    the most accurate correct design. Undeclared, every chunked reference above computing
    dlog_alpha by the identity widens dlog_alpha's envelope (``identity``): an identity kernel
    that does not say so reads less accurate, never FAIL."""
    stick = TABLE.structure(chunk_size, decay_form)
    if dlog_alpha_form == "identity":
        return replace(stick, dlog_alpha_form="identity")
    if dlog_alpha_form is not None:
        return stick
    chunked = {f"{r}_identity": identity(d) for r, d in stick.designs.items()
               if d.kernel == "chunked"}
    return replace(stick, designs={**stick.designs, **chunked},
                   field=stick.field + tuple(chunked))


# the scalar gate's table
TABLE = Table(DESIGNS, lambda C: Design("chunked", C, f"{C}-step chunks"), chunk_cumsum)
