"""Which reference kernels a kernel's claims call for: the one table of the calibrated verdict.

Two things are never confused here: *the oracle* is the float64 truth (``glaref._oracle``); the
*reference kernels* are correct designs of the recurrence run in the kernel's own arithmetic on
exactly its inputs (``glaref._baseline.run``), whose errors against the oracle say what a correct
kernel errs. :func:`yardstick` reads what is claimed (today the chunk size) and returns which
reference kernels to run (``Yardstick.designs``, read by ``glaref._judge.Truth.references`` to run
them) and how their errors combine into the baseline (``Yardstick.held_to`` and
``Yardstick.extremes``, read by ``glaref._verdict.baseline_error`` and ``looseness_notes``).

Adding a reference design (say chunk-local cumulative-sum decays at chunk C):
  1. teach ``glaref._baseline.run`` the kernel (a new ``kernel`` name, same keywords);
  2. add a role to ``DESIGNS`` below (role name -> ``Design(kernel, chunk, label)``), or build the
     Design in :func:`yardstick` when its chunk comes from the claims;
  3. in :func:`yardstick`, put the role in the designs of the claims that call for it, and say
     whether it is what the kernel is held to or an extreme that widens the baseline.
Nothing else names the roles: the engine, the records and the messages follow the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._baseline import CHUNK, CHUNK_WIDE

__all__ = ["DESIGNS", "Design", "Yardstick", "yardstick"]


@dataclass(frozen=True)
class Design:
    """One reference kernel: ``kernel`` (``glaref._baseline.run``'s name) at ``chunk`` steps per
    chunk (None: not chunked), and how messages name it."""

    kernel: str
    chunk: int | None
    label: str


DESIGNS: dict[str, Design] = {
    "scan": Design("scan", None, "a step-by-step scan"),
    "chunked": Design("chunked", CHUNK, f"{CHUNK}-step chunks"),
    "chunked_wide": Design("chunked", CHUNK_WIDE, f"{CHUNK_WIDE}-step chunks"),
}


@dataclass(frozen=True)
class Yardstick:
    """The reference kernels one claim calls for ({role: Design}), the role the kernel is held
    to, and the roles that widen that baseline when the kernel's structure is unknown (each a
    correct design the kernel might be)."""

    designs: dict[str, Design]
    held_to: str
    extremes: tuple[str, ...] = ()


def yardstick(chunk_size: int | None) -> Yardstick:
    """The reference kernels for a kernel of ``chunk_size`` (1: step by step; None: unknown).

    A step-by-step kernel is held to the scan; a chunked one (C) to the chunked reference at C;
    one of unknown structure to the 64-step chunked reference, widened towards a scan and towards
    256-step chunks (``glaref._verdict.baseline_error``)."""
    if chunk_size == 1:
        return Yardstick({"scan": DESIGNS["scan"]}, "scan")
    if chunk_size is not None:
        return Yardstick({"chunked": Design("chunked", chunk_size, f"{chunk_size}-step chunks")},
                         "chunked")
    return Yardstick(dict(DESIGNS), "chunked", ("scan", "chunked_wide"))
