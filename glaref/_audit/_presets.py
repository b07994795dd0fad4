"""Problem sizes, regimes and the two presets of the audit; the defaults of ``check_kernel``.

A config is [batch, groups, heads, dk, dv] (the seed report's order). The seed's four configs
are the ones its report measured; ``quick`` (``glaref audit``'s default) is a small grid that
still exercises grouped heads (G < H), dk != dv, sequence lengths that are not multiples of a
chunk, and the regimes where kernels' bugs hide (``AUDIT_REGIMES``). ``coverage`` words what a
run covered for its summary line.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable

from .._errors import AuditUsageError
from .._inputs import Dims
from ..regimes import REGIMES

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

# The regimes of the defaults besides the standard gates (issue 23). strong_decay (per-step log
# decays down to ~ -30) is where a clamped, floored or underflowing gate shows: a kernel clamping
# log_alpha at -4 passes the standard gates (they go below -4 about once in 30,000 steps) and
# errs ~1e5x the reference kernels here. near_one (almost no decay) makes the state a sum of ~T
# terms, so 16-bit accumulation shows once T is long: a bfloat16 kernel carrying its state in
# bfloat16 passes at T = 65 and errs 7-10x the references at T = 1000, on every output
# (tests/test_first_hour.py's kernels, check_kernel's config).
AUDIT_REGIMES = ("standard", "strong_decay", "near_one")
QUICK_SEQS = (1000,)               # long enough to accumulate; not a multiple of a chunk

# check_kernel's defaults: a few seconds of small cases, the default audit's regimes on a smaller
# config, at T = 65 (one step past a 64-step chunk) as well. Six rows.
CHECK_CONFIG = "1,2,4,16,16"       # B, G, H, dk, dv: grouped heads (G = 2 < H = 4)
CHECK_SEQS = (65, 1000)
CHECK_REGIMES = AUDIT_REGIMES
CHECK_MODES = ("fwd_bwd",)

# "all" among the regime names: every regime that is not slow ("long", T = 65536, is named
# explicitly: "all,long").
ALL = "all"
ALL_REGIMES = tuple(name for name, r in REGIMES.items() if not r.slow)

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
    regimes: tuple[str, ...]


# quick: 2 kernels x 3 regimes x 1 config x T = 1000 x 2 modes = 12 rows, in about the CPU time
# of the 16 standard-gate rows it replaced (2 configs x T = 100, 1000): 1.05x here, where 24
# rows (T = 65 as well) cost 1.4-1.5x (docs/reports/defaults_cpu.txt). seed: the seed report's grid.
PRESETS: dict[str, Preset] = {
    "quick": Preset(BUILTIN_IMPLS, {"g2h4_dk32_dv24": QUICK_CONFIGS["g2h4_dk32_dv24"]}, QUICK_SEQS,
                    MODES, 3, AUDIT_REGIMES),
    "seed": Preset(BUILTIN_IMPLS, SEED_CONFIGS, SEED_SEQS, MODES, 3, ("standard",)),
}


def regime_names(regimes, default: tuple[str, ...],
                 every: tuple[str, ...] = ALL_REGIMES) -> list[str]:
    """The regimes asked for: ``default`` for None, "all" expanded to ``every`` (alone or
    among other names, "all,long"), names otherwise as given (comma-separated or a sequence; the
    engine checks each against ``glaref.regimes.REGIMES``), in order, without repeats."""
    if regimes is None:
        return list(default)
    if isinstance(regimes, str):
        names = [p.strip() for p in regimes.split(",") if p.strip()]
    else:
        try:
            names = list(regimes)
        except TypeError:       # not a name nor a sequence: the engine names what it got
            return [regimes]
    out: list = []
    for n in names:
        for m in (every if n == ALL else (n,)):
            if m not in out:
                out.append(m)
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def coverage(records) -> str:
    """What a run covered, for its OK/FAIL summary line: kernels, regimes, dtypes and sequence
    lengths of ``records`` (the audit's, keys impl, regime, dtype, seq), e.g.
    "2 kernels x 3 regimes (standard, strong_decay, near_one) x float32, T 65, 1000". Lengths are
    listed up to four, else given as a range."""
    recs = list(records)
    if not recs:
        return "nothing run"

    def seen(key):
        return list(dict.fromkeys(r.get(key) for r in recs if r.get(key) is not None))

    regimes, dtypes, seqs = seen("regime"), seen("dtype"), sorted(seen("seq"))
    ts = ", ".join(map(str, seqs)) if len(seqs) <= 4 else f"{seqs[0]}..{seqs[-1]}"
    kinds = f" x {','.join(dtypes)}" if dtypes else ""
    return (f"{_plural(len(seen('impl')), 'kernel')} x {_plural(len(regimes), 'regime')} "
            f"({', '.join(regimes)}){kinds}, T {ts}")


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
    raise AuditUsageError(f"config {name!r}: got {x!r} as {FIELDS[i]}, expected an integer",
                          argument="config")


def check_config(name: str, c) -> tuple[int, int, int, int, int]:
    items = c.split(",") if isinstance(c, str) else c
    try:
        items = list(items)
    except TypeError:
        items = None
    if items is None or len(items) != 5:
        raise AuditUsageError(f"config {name!r}: got {c!r}, expected five integers "
                              "[batch, groups, heads, dk, dv]", argument="config")
    t = tuple(_int_field(name, i, x) for i, x in enumerate(items))
    if min(t) < 1:
        raise AuditUsageError(f"config {name!r}: got {c!r}, expected five positive integers "
                              "[batch, groups, heads, dk, dv]", argument="config")
    if t[2] % t[1]:
        raise AuditUsageError(f"config {name!r}: got heads={t[2]}, expected a multiple of "
                              f"groups={t[1]}", argument="config")
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
            raise AuditUsageError(f"config: got {p!r}, expected B,G,H,dk,dv or one of {sorted(CONFIGS)}",
                                  argument="config")
        out[p] = CONFIGS[p]
    if not out:
        raise AuditUsageError(f"config: got {text!r}, expected B,G,H,dk,dv or a config name",
                              argument="config")
    return out


def plan(regimes: Iterable[str], configs: dict[str, tuple[int, ...]],
         seqs: Iterable[int], table=None) -> list[tuple[str, str, Dims]]:
    """The rows to run: (regime, config name, sizes) for every regime, config and sequence
    length, with the sizes each regime derives from them (``Regime.cases``), in that order.
    table: {name: regime} of the recurrence (None: ``glaref.regimes.REGIMES``, the
    scalar gate's)."""
    table = REGIMES if table is None else table
    seqs = list(seqs)
    rows = []
    for regime in regimes:
        for cname, (B, G, H, dk, dv) in configs.items():
            for T in seqs:
                for dims in table[regime].cases(Dims(B, G, H, T, dk, dv)):
                    rows.append((regime, cname, dims))
    return rows
