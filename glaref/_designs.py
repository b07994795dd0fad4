"""Which reference kernels a kernel's claims call for: the one table of the calibrated verdict.

Two things are never confused here: *the oracle* is the float64 truth (``glaref._oracle``); the
*reference kernels* are correct designs of the recurrence run in the kernel's own arithmetic on
exactly its inputs (``glaref._baseline.run``), whose errors against the oracle say what a correct
kernel errs. :func:`yardstick` reads what is claimed (the chunk size, the decay form and the
dlog_alpha form) and returns which reference kernels to run (``Yardstick.designs``, read by
``glaref._judge.Truth.references`` to run them), which of their outputs judges each of the
kernel's (``Yardstick.key``), and how their errors combine into the baseline
(``Yardstick.held_to`` and ``Yardstick.extremes``, read by ``glaref._verdict.baseline_error`` and
``looseness_notes``) and into the envelope of the field's correct designs (``Yardstick.field``,
read by ``glaref._verdict.assess``: ok within the baseline's rule, less accurate within the
envelope's, FAIL beyond it; docs/budgets.md, section 9).

Adding a reference design:
  1. teach ``glaref._baseline.run`` the design (a kernel name, or a ``decay`` / ``order``);
  2. add a role to ``DESIGNS`` below (role name -> ``Design(kernel, chunk, label, ...)``), or
     build the Design in :func:`yardstick` when its chunk comes from the claims;
  3. in :func:`yardstick`, put the role in the designs of the claims that call for it, and say
     whether it is what the kernel is held to, an extreme that widens the baseline, or a field
     design that widens the envelope (give it a ``family``, and the declaration that holds a
     kernel to it alone in ``declares``).
Nothing else names the roles: the engine, the records and the messages follow the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ._baseline import CHUNK, CHUNK_WIDE

__all__ = ["DESIGNS", "SCAN_SEQUENTIAL", "TABLE", "Design", "Table", "Yardstick", "chunk_cumsum",
           "identity", "yardstick"]


@dataclass(frozen=True)
class Design:
    """One reference kernel: ``kernel`` (``glaref._baseline.run``'s name) at ``chunk`` steps per
    chunk (None: not chunked), and how messages name it; ``decay`` and ``order``:
    ``glaref._baseline.run``'s keywords of the same names (``DECAY_FORMS``, ``ORDERS``).
    ``family``: for the field's correct but less accurate designs (docs/budgets.md, section 9),
    the design family a less accurate kernel's error is explained by; None for the most
    accurate ones. ``declares``: the declaration that holds a kernel to this design alone
    (None: none narrower exists). ``dlog_alpha``: "identity" for a design of dlog_alpha alone,
    the chunked kernel's dlog_alpha by the chunk-local reverse-cumsum identity (``identity``);
    None for a design of every output, whose dlog_alpha is read in the form the kernel is held
    to (``Yardstick.key``)."""

    kernel: str
    chunk: int | None
    label: str
    decay: str = "segment_sums"
    order: str | None = None          # None: the kernel's own (``_baseline.DEFAULT_ORDER``)
    family: str | None = None
    declares: str | None = None
    dlog_alpha: str | None = None


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


# the field's step-by-step design: every dot product (over dk, dv, and the dk dv terms of
# <S_{t-1}, G_t>) summed term by term, the loosest order compilers use (XLA's CPU backend)
SCAN_SEQUENTIAL = Design("scan", None, "a step-by-step scan summing term by term",
                         order="sequential",
                         family="a step-by-step scan whose dot products sum term by term "
                                "(XLA's sequential reductions)")


DESIGNS: dict[str, Design] = {
    "scan": Design("scan", None, "a step-by-step scan"),
    "chunked": Design("chunked", CHUNK, f"{CHUNK}-step chunks"),
    "chunked_wide": Design("chunked", CHUNK_WIDE, f"{CHUNK_WIDE}-step chunks"),
}


@dataclass(frozen=True)
class Yardstick:
    """The reference kernels one claim calls for ({role: Design}), the role the kernel is held
    to, the roles that widen that baseline when the kernel's structure is unknown (each a
    correct design the kernel might be), and the field's correct but less accurate designs
    (``field``) whose errors bound the envelope: beyond the baseline but within the envelope a
    kernel is *less accurate*, beyond the envelope it FAILs (``glaref._verdict.assess``).
    ``dlog_alpha_form``: the form of dlog_alpha the designs of every output are read in
    ("direct" or "identity", ``key``)."""

    designs: dict[str, Design]
    held_to: str
    extremes: tuple[str, ...] = ()
    field: tuple[str, ...] = ()
    dlog_alpha_form: str = "direct"

    def key(self, role: str, output: str) -> str | None:
        """The output of reference kernel ``role`` (``glaref._baseline.run``'s keys) that a
        kernel's ``output`` is compared with; None when the role does not judge that output (a
        design of dlog_alpha alone). dlog_alpha: "log_alpha" is each reference kernel's own
        form (the identity for the chunked ones, the direct form for the scan),
        "log_alpha_direct" the direct form."""
        form = self.designs[role].dlog_alpha
        if form is not None and output != "log_alpha":
            return None
        if output != "log_alpha":
            return output
        return "log_alpha" if (form or self.dlog_alpha_form) == "identity" else "log_alpha_direct"

    def roles(self, output: str) -> list[str]:
        """The roles that judge ``output`` (``key``)."""
        return [r for r in self.designs if self.key(r, output) is not None]


def yardstick(chunk_size: int | None, decay_form: str | None = None,
              dlog_alpha_form: str | None = None) -> Yardstick:
    """The reference kernels for a kernel of ``chunk_size`` (1: step by step; None: unknown)
    whose decays are of ``decay_form`` (``glaref._claims.DECAY_FORMS``; None: unknown) and whose
    dlog_alpha is of ``dlog_alpha_form`` (``glaref._verdict.DLOG_ALPHA_FORMS``; None: unknown).

    A step-by-step kernel is held to the scan, its envelope the scan summing term by term; a
    chunked one (C) to the segment-sum chunked reference at C, its envelope the chunk-local
    cumsum design at C, or to that design alone when it declares chunk_cumsum decays (and the
    segment-sum one alone when it declares segment sums); one of unknown structure to the
    64-step chunked reference, widened towards a scan and towards 256-step chunks
    (``glaref._verdict.baseline_error``), its envelope the chunk-local cumsum design at 64 steps
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


@dataclass(frozen=True)
class Table:
    """A family's yardstick by structure: ``designs``, the reference kernels of a kernel whose
    structure is unknown ("scan" the step-by-step one, "chunked" the one it is held to at the
    family's default chunk, every other one an extreme that widens that baseline), and the
    family's chunked design (``chunked``) and chunk-local cumsum design (``chunk_cumsum``) at
    any chunk C. Both families read one table (``glaref.delta._designs``)."""

    designs: dict[str, Design]
    chunked: Callable[[int], Design]
    chunk_cumsum: Callable[[int], Design]

    def structure(self, chunk_size: int | None, decay_form: str | None) -> Yardstick:
        """The yardstick of every output for a kernel's chunking and decay form: step by step,
        held to the scan (dot products in lanes), its envelope the term-by-term scan; chunked
        at C, held to ``chunked(C)``, its envelope ``chunk_cumsum(C)``, or to that alone with
        chunk_cumsum decays declared (and the segment-sum one alone with segment sums declared);
        unknown, held to ``designs["chunked"]`` widened towards the other designs, its envelope
        the chunk-local cumsum design at that chunk and the term-by-term scan."""
        if chunk_size == 1:
            return Yardstick({"scan": self.designs["scan"], "scan_sequential": SCAN_SEQUENTIAL},
                             "scan", field=("scan_sequential",))
        if chunk_size is not None:
            if decay_form == "chunk_cumsum":
                return Yardstick({"chunked_cumsum": self.chunk_cumsum(chunk_size)},
                                 "chunked_cumsum")
            seg = {"chunked": self.chunked(chunk_size)}
            if decay_form == "segment_sums":
                return Yardstick(seg, "chunked")
            return Yardstick({**seg, "chunked_cumsum": self.chunk_cumsum(chunk_size)}, "chunked",
                             field=("chunked_cumsum",))
        cumsum = self.chunk_cumsum(self.designs["chunked"].chunk)
        return Yardstick({**self.designs, "chunked_cumsum": cumsum,
                          "scan_sequential": SCAN_SEQUENTIAL}, "chunked",
                         tuple(r for r in self.designs if r != "chunked"),
                         field=("chunked_cumsum", "scan_sequential"))


# the scalar gate's table
TABLE = Table(DESIGNS, lambda C: Design("chunked", C, f"{C}-step chunks"), chunk_cumsum)
