"""The shape of a yardstick: :class:`Design` (one reference kernel) and :class:`Yardstick` (the
reference kernels one claim calls for, and how their errors combine).

Each family fills them from its own table: ``glaref.gla._designs.yardstick`` for the scalar gate,
``glaref.delta._designs.yardstick`` for the gated delta rule; the verdict
(``glaref._audit._verdict``) and the records read them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Design", "Yardstick"]


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
    kernel is *less accurate*, beyond the envelope it FAILs (``glaref._audit._verdict.assess``).
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
