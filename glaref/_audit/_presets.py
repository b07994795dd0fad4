"""Problem sizes and the two presets of the audit.

A config is [batch, groups, heads, dk, dv] (the seed report's order). The seed's four configs
are the ones its report measured; ``quick`` is a small grid that still exercises grouped heads
(G < H), dk != dv and sequence lengths that are not multiples of a chunk.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from .._errors import AuditUsageError

SEED_CONFIGS: dict[str, tuple[int, int, int, int, int]] = {
    "g2h8_d128": (4, 2, 8, 128, 128),
    "g1h24_dk128_dv64": (2, 1, 24, 128, 64),
    "g1h1_d128": (4, 1, 1, 128, 128),
    "g2h4_dk48_dv40": (4, 2, 4, 48, 40),
}

QUICK_CONFIGS: dict[str, tuple[int, int, int, int, int]] = {
    "g2h4_dk32_dv24": (2, 2, 4, 32, 24),
    "g1h2_dk16_dv48": (1, 1, 2, 16, 48),
}

SEED_SEQS = (512, 2048, 8192)

CONFIGS = {**SEED_CONFIGS, **QUICK_CONFIGS}

BUILTIN_IMPLS = ("chunked", "scan")
MODES = ("fwd", "fwd_bwd")


@dataclass(frozen=True)
class Preset:
    impls: tuple[str, ...]
    configs: dict[str, tuple[int, int, int, int, int]]
    seqs: tuple[int, ...]
    modes: tuple[str, ...]
    repeats: int


PRESETS: dict[str, Preset] = {
    "quick": Preset(BUILTIN_IMPLS, QUICK_CONFIGS, (100, 1000), MODES, 3),
    "seed": Preset(BUILTIN_IMPLS, SEED_CONFIGS, SEED_SEQS, MODES, 3),
}


def config_name(c: tuple[int, int, int, int, int]) -> str:
    """A name for a custom [B, G, H, dk, dv], in the style of the seed's names."""
    B, G, H, dk, dv = c
    return f"b{B}g{G}h{H}_dk{dk}_dv{dv}"


FIELDS = ("batch", "groups", "heads", "dk", "dv")


def _int_field(name: str, i: int, x) -> int:
    """One field of a config: an int or a string of digits (never a float or a bool, which
    int() would truncate or take as 1)."""
    if isinstance(x, str):
        if x.strip().lstrip("-").isdigit():
            return int(x)
    elif type(x).__name__ not in ("bool", "bool_"):
        try:
            return operator.index(x)
        except TypeError:
            pass
    raise AuditUsageError(f"config {name!r}: got {x!r} as {FIELDS[i]}, expected an integer")


def check_config(name: str, c) -> tuple[int, int, int, int, int]:
    items = c.split(",") if isinstance(c, str) else c
    try:
        items = list(items)
    except TypeError:
        items = None
    if items is None or len(items) != 5:
        raise AuditUsageError(f"config {name!r}: got {c!r}, expected five integers "
                              "[batch, groups, heads, dk, dv]")
    t = tuple(_int_field(name, i, x) for i, x in enumerate(items))
    if min(t) < 1:
        raise AuditUsageError(f"config {name!r}: got {c!r}, expected five positive integers "
                              "[batch, groups, heads, dk, dv]")
    if t[2] % t[1]:
        raise AuditUsageError(f"config {name!r}: got heads={t[2]}, expected a multiple of "
                              f"groups={t[1]}")
    return t  # type: ignore[return-value]


def parse_config(text: str) -> dict[str, tuple[int, int, int, int, int]]:
    """'B,G,H,dk,dv' (five integers) or a comma-separated list of config names."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts and any(p.lstrip("-").isdigit() for p in parts):
        # numbers: B,G,H,dk,dv (a part that is not an integer is named by check_config)
        c = check_config(text, ",".join(parts))
        return {config_name(c): c}
    out = {}
    for p in parts:
        if p not in CONFIGS:
            raise AuditUsageError(f"config: got {p!r}, expected B,G,H,dk,dv or one of {sorted(CONFIGS)}")
        out[p] = CONFIGS[p]
    if not out:
        raise AuditUsageError(f"config: got {text!r}, expected B,G,H,dk,dv or a config name")
    return out
