"""Which of the gated delta rule's reference kernels a kernel's claims call for: the delta
family's yardstick table, in the shape of the scalar gate's ``glaref.gla._designs``; both fill
``Design``, ``Yardstick`` and ``Table`` of ``glaref._audit._designs`` (the two families' tables
differ in their designs, not in their logic).

The reference kernels are ``glaref.delta._baseline.run``'s: the step-by-step scan (every dot
product in eight interleaved partial sums, as a scan kernel's vectorised reductions accumulate;
or, as a field design, one term after another: ``glaref._audit._designs.SCAN_SEQUENTIAL``,
the loosest order a compiler uses) and the chunked WY / UT form at C steps (flash-linear-attention's
chunk_gated_delta_rule and chunk_kda), with decays as segment sums or, as
flash-linear-attention forms them, as differences of a chunk-local float32 cumulative sum
(``chunk_cumsum``). :func:`yardstick` reads the claimed chunk size and decay form and
returns which to run, the one the kernel is held to, the extremes that widen that baseline when
the kernel's structure is unknown, and the field's correct but less accurate designs whose
errors bound the envelope (``glaref._audit._verdict``: ok within the baseline's rule, less accurate
within the envelope's, FAIL beyond it).
"""

from __future__ import annotations

from .._audit._designs import Design, Table, Yardstick
from ._baseline import CHUNK

__all__ = ["DESIGNS", "TABLE", "chunk_cumsum", "chunked", "yardstick"]


def chunked(C: int) -> Design:
    """The chunked WY / UT form at chunk C, every decay a segment sum of its gates."""
    return Design("chunked", C, f"{C}-step WY/UT chunks")


def chunk_cumsum(C: int) -> Design:
    """The field's chunked form at chunk C: decays from chunk-local cumulative sums."""
    return Design("chunked", C, f"{C}-step WY/UT chunks with chunk-local cumsum decays",
                  decay="chunk_cumsum",
                  family=f"decays from chunk-local cumulative sums over {C} steps "
                         "(flash-linear-attention's chunk_local_cumsum in chunk_gated_delta_rule "
                         "and chunk_kda)")


DESIGNS: dict[str, Design] = {
    "scan": Design("scan", None, "a step-by-step scan"),
    "chunked": chunked(CHUNK),
}
TABLE = Table(DESIGNS, chunked, chunk_cumsum)


def yardstick(chunk_size: int | None, decay_form: str | None = None) -> Yardstick:
    """The delta family's reference kernels for a kernel of ``chunk_size`` (1: step by step;
    None: unknown) whose decays are of ``decay_form`` (``glaref._audit._claims.DECAY_FORMS``; None:
    unknown).

    A step-by-step kernel is held to the scan (dot products in lanes), its envelope the scan
    summing term by term. A chunked one (C) to the segment-sum WY / UT form at C, its envelope
    the chunk-local cumsum form at C; to that form alone when it declares chunk_cumsum decays,
    and to the segment-sum one alone when it declares segment sums. One of unknown structure is
    held to the 64-step WY / UT form (flash-linear-attention's chunk for GDN and KDA), widened
    towards the scan (``Yardstick.extremes``), its envelope the 64-step form with chunk-local
    cumsum decays and the term-by-term scan."""
    return TABLE.structure(chunk_size, decay_form)
