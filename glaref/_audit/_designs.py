"""The shape of a yardstick: :class:`Design` (one reference kernel) and :class:`Yardstick` (the
reference kernels one claim calls for, and how their errors combine), the logic both families'
yardsticks share (:class:`Table`) and the step-by-step design both hold as a field design
(``SCAN_SEQUENTIAL``).

Each family fills them from its own table: ``glaref.gla._designs.yardstick`` for the scalar gate,
``glaref.delta._designs.yardstick`` for the gated delta rule; the verdict
(``glaref._audit._verdict``) and the records read them alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SCAN_SEQUENTIAL", "Design", "Table", "Yardstick"]


@dataclass(frozen=True)
class Design:
    """One reference kernel: ``kernel`` (``glaref.gla._baseline.run``'s name) at ``chunk`` steps per
    chunk (None: not chunked), and how messages name it; ``decay`` and ``order``:
    ``glaref.gla._baseline.run``'s keywords of the same names (``DECAY_FORMS``, ``ORDERS``).
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


@dataclass(frozen=True)
class Yardstick:
    """The reference kernels one claim calls for ({role: Design}), the role the kernel is held
    to, the roles that widen that baseline when the kernel's structure is unknown (each a
    correct design the kernel might be), and the field's correct but less accurate designs
    (``field``) whose errors bound the envelope: beyond the baseline but within the envelope a
    kernel is *less accurate*, beyond the envelope it FAILs (``glaref._audit._verdict.calibrated``).
    ``dlog_alpha_form``: the form of dlog_alpha the designs of every output are read in
    ("direct" or "identity", ``key``)."""

    designs: dict[str, Design]
    held_to: str
    extremes: tuple[str, ...] = ()
    field: tuple[str, ...] = ()
    dlog_alpha_form: str = "direct"

    def key(self, role: str, output: str) -> str | None:
        """The output of reference kernel ``role`` (``glaref.gla._baseline.run``'s keys) that a
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


# the field's step-by-step design: every dot product (over dk, dv, and the dk dv terms of
# <S_{t-1}, G_t>) summed term by term, the loosest order compilers use (XLA's CPU backend)
SCAN_SEQUENTIAL = Design("scan", None, "a step-by-step scan summing term by term",
                         order="sequential",
                         family="a step-by-step scan whose dot products sum term by term "
                                "(XLA's sequential reductions)")


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
