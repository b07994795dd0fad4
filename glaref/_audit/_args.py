"""The audit's own arguments checked once, at the face (usage errors naming the argument).

A kernel's claims (layout, dtypes, chunk size, forms, gate kind) are ``glaref._audit._claims.Claims``'s;
here are the rest: which rows (configs, sequence lengths, modes, regimes, packed sequences, seed),
how they are measured (preset, repeats, precision, oracle) and what :func:`header` writes of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

import numpy as np

from .. import regimes as _regimes
from .._errors import AuditUsageError, GlarefError
from .._inputs import Dims, check_cu_seqlens, check_scale, whole_number
from . import _presets
from ._claims import FAMILIES, family  # the faces' registry of families: defined with the claims
from ._family import Family
from ._presets import (
    BUILTIN_IMPLS,
    MODES,
    Preset,
    check_config,
    config_name,
    parse_config,
    regime_names,
)

__all__ = ["FAMILIES", "Rows", "check_preset", "check_user_claims", "choices", "default_oracle",
           "family", "integer",
           "rows", "split"]

RANDOM_PACKING = "random:"
ORACLES = ("numba", "numpy")


def default_oracle() -> str:
    """The oracle used when none is named: Numba's when it is installed, else NumPy's."""
    try:
        import numba  # noqa: F401  (the lazy numba boundary)

        from ..gla import _numba  # noqa: F401
    except ImportError:
        return "numpy"
    return "numba"


def split(x) -> list:
    """A comma-separated string, a callable, an iterable or one value, as a list."""
    if x is None:
        return []
    if isinstance(x, str):
        return [p.strip() for p in x.split(",") if p.strip()]
    if callable(x):
        return [x]
    try:
        return list(x)
    except TypeError:       # a single non-iterable value: checked (and refused) by the caller
        return [x]


def integer(name: str, x, low: int) -> int:
    """An integer argument (int, numpy int or a string of digits; never a bool or a float, which
    would be truncated) that is at least ``low``."""
    t = whole_number(x)
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    if t is None:
        raise AuditUsageError(f"{name}: got {x!r} ({type(x).__name__}), expected {what}", argument=name)
    if t < low:
        raise AuditUsageError(f"{name}: got {t}, expected {what}", argument=name)
    return t


def choices(name: str, values, allowed: Iterable[str]) -> list[str]:
    allowed = tuple(allowed)
    vals = split(values)
    for v in vals:
        if v not in allowed:
            raise AuditUsageError(f"{name}: got {v!r}, expected one of {allowed}", argument=name)
    if not vals:
        raise AuditUsageError(f"{name}: got nothing, expected one of {allowed}", argument=name)
    return vals


def check_user_claims(impls: list, claims) -> None:
    """chunk_size, accumulate_dtype, operand_dtype and dlog_alpha_form (of ``claims``, a
    ``Claims``) describe user kernels (built-ins carry their own): refused when every kernel is
    built in, where they would apply to nothing."""
    given = {n: getattr(claims, n) for n in ("chunk_size", "accumulate_dtype", "operand_dtype",
                                             "dlog_alpha_form") if getattr(claims, n) is not None}
    if given and all(isinstance(i, str) and i in BUILTIN_IMPLS for i in impls):
        name, value = next(iter(given.items()))
        raise AuditUsageError(
            f"{name}: got {value!r}, but it describes user kernels and every kernel here is "
            f"built in ({', '.join(impls)}); built-in kernels carry their own", argument=name)


def check_preset(preset, fam: Family) -> Preset:
    """The preset ``preset`` of the recurrence family ``fam``."""
    if not isinstance(preset, str) or preset not in fam.presets:
        raise AuditUsageError(f"preset: got {preset!r}, expected one of {sorted(fam.presets)}",
                              argument="preset")
    return fam.presets[preset]


def _configs(configs, preset_configs) -> dict[str, tuple[int, ...]]:
    if configs is None:
        return dict(preset_configs)
    if isinstance(configs, str):
        out = parse_config(configs)
    elif isinstance(configs, dict):
        out = {str(k): check_config(str(k), v) for k, v in configs.items()}
    else:
        try:
            items = list(configs)
        except TypeError:
            raise AuditUsageError(f"config: got {configs!r}, expected config names, 'B,G,H,dk,dv' "
                                  "strings or {name: (B, G, H, dk, dv)}", argument="config") from None
        out = {}
        for c in items:
            if isinstance(c, str):
                out.update(parse_config(c))
            else:
                c = check_config(repr(c), c)
                out[config_name(c)] = c
    if not out:
        # zero rows would pass vacuously
        raise AuditUsageError(f"config: got {configs!r}, expected at least one config", argument="config")
    return out


def _seqs(seqs, preset_seqs) -> list[int]:
    if seqs is None:
        return list(preset_seqs)
    if isinstance(seqs, str):
        vals = split(seqs)
    else:
        try:
            vals = list(seqs)
        except TypeError:
            vals = [seqs]
    out = [integer("seq", s, 1) for s in vals]
    if not out:
        raise AuditUsageError(f"seq: got {seqs!r}, expected at least one sequence length", argument="seq")
    return out


def _packing(cu_seqlens) -> np.ndarray | int | None:
    """None (one sequence per batch row), explicit offsets (an int64 array, validated) or the
    number N of random-length sequences ("random:N")."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, str):
        text = cu_seqlens.strip()
        if text.startswith(RANDOM_PACKING):
            n = text[len(RANDOM_PACKING):]
            if not n.isdigit() or int(n) < 1:
                raise AuditUsageError(f"cu_seqlens: got {cu_seqlens!r}, expected 'random:N' with "
                                      "N >= 1 sequences, or offsets such as '0,5,5,40'",
                                      argument="cu_seqlens")
            return int(n)
        parts = [x.strip() for x in text.split(",") if x.strip()]
        try:
            cu_seqlens = [int(x) for x in parts]
        except ValueError:
            raise AuditUsageError(f"cu_seqlens: got {text!r}, expected integer offsets such as "
                                  "'0,5,5,40' or 'random:N'", argument="cu_seqlens") from None
    a = np.asarray(cu_seqlens)
    if a.dtype.kind not in "iu" or a.ndim != 1 or a.size < 2 or a[-1] < 1:
        raise AuditUsageError(f"cu_seqlens: got {cu_seqlens!r}, expected N + 1 >= 2 integer "
                              "offsets 0 = c_0 <= ... <= c_N = T with T >= 1 (e.g. '0,5,5,40'), "
                              "or 'random:N'", argument="cu_seqlens")
    try:
        return check_cu_seqlens(a, 1, int(a[-1]))
    except GlarefError as exc:         # not starting at 0, decreasing: names the first bad position
        raise AuditUsageError(str(exc), exc.argument) from None


@dataclass(frozen=True)
class Problems:
    """How the rows' problems are made, checked (:func:`problems`): the input seed, the scale,
    the packing (None, offsets or "random:N"'s N) and the oracle's implementation."""

    seed: int = 0
    scale: float = 1.0
    packing: Any = None
    oracle: str = ""


def problems(seed=0, scale=1.0, cu_seqlens=None, oracle_impl=None) -> Problems:
    """``seed``, ``scale``, ``cu_seqlens`` and ``oracle_impl`` checked (AuditUsageError naming
    the bad one, what it got and what was expected); oracle_impl None: ``default_oracle()``."""
    try:
        scale = check_scale(scale)
    except GlarefError as exc:
        raise AuditUsageError(str(exc), exc.argument) from None
    seed = integer("seed", seed, 0)
    oracle = oracle_impl or default_oracle()
    choices("oracle_impl", oracle, ORACLES)
    return Problems(seed, scale, _packing(cu_seqlens), oracle)


@dataclass(frozen=True)
class Rows:
    """The rows an audit runs and how its problems are made, checked: the configs, sequence
    lengths, modes, regimes, input seed, scale, packing (None, offsets or "random:N"'s N), the
    oracle's implementation, the recurrence family (``_family.Family``) whose problems they are,
    and the shard (I, N) or None."""

    configs: dict[str, tuple[int, ...]]
    seqs: list[int]
    modes: list[str]
    regimes: list[str]
    seed: int
    scale: float
    packing: Any
    oracle: str
    family: Family
    shard: tuple[int, int] | None = None

    def offsets(self, T: int) -> np.ndarray | None:
        """The offsets of one problem of length T: the explicit ones, or N random lengths drawn
        by ``regimes.random_cu_seqlens(T, N, seed)`` (empty sequences included)."""
        if self.packing is None or isinstance(self.packing, np.ndarray):
            return self.packing
        return _regimes.random_cu_seqlens(T, self.packing, self.seed)

    def cu_seqlens(self):
        """The packing as the report's header writes it: offsets, "random:N" or None."""
        if self.packing is None:
            return None
        if isinstance(self.packing, int):
            return f"{RANDOM_PACKING}{self.packing}"
        return self.packing.tolist()

    def only_forward(self) -> Rows:
        """These rows with every mode forward only (a kernel that cannot be differentiated)."""
        return replace(self, modes=["fwd"])

    def plan(self) -> list[tuple[str, str, Dims]]:
        """(regime, config name, sizes) of every problem (``_presets.plan``); packed
        sequences are the batch, so B = 1."""
        out = _presets.plan(self.regimes, self.configs, self.seqs, self.family.regimes)
        if self.packing is not None:
            out = [(regime, cname, replace(dims, B=1)) for regime, cname, dims in out]
        if self.shard is not None:       # every N-th problem from the I-th: deterministic
            i, n = self.shard
            out = out[i::n]
        return out


def parse_shard(shard) -> tuple[int, int] | None:
    """"I/N" (or (I, N)): shard I of N, 0 <= I < N; None: the whole audit."""
    if shard is None:
        return None
    parts = shard.split("/") if isinstance(shard, str) else shard
    try:
        i, n = (integer("shard", x, 0) for x in parts)
    except (AuditUsageError, TypeError, ValueError):
        i = n = -1
    if not 0 <= i < n:
        raise AuditUsageError(f"shard: got {shard!r}, expected I/N with 0 <= I < N (e.g. 0/4 .. "
                              "3/4)", argument="shard")
    return i, n


def rows(pre: Preset, made: Problems, *, configs=None, seqs=None, modes=None, regimes=None,
         fam: Family, shard=None) -> Rows:
    """The rows' arguments checked (AuditUsageError naming the bad one, what it got and what was
    expected), defaults from the preset ``pre`` (regimes: its own for None; "all" every regime but
    the slow ones), problems of the recurrence family ``fam`` (``family``) made as ``made``
    (:func:`problems`) says. Explicit ``cu_seqlens`` offsets fix T, so
    ``seqs`` may only repeat it (None: it becomes [T]) and no regime may set its own T."""
    cfgs = _configs(configs, pre.configs)
    seq_list = _seqs(seqs, pre.seqs)
    mode_list = choices("mode", modes if modes is not None else pre.modes, MODES)
    regime_list = choices("regime", regime_names(regimes, pre.regimes, fam.all_regimes),
                          fam.regimes)
    packing = made.packing
    if isinstance(packing, np.ndarray):
        T_cu = int(packing[-1])
        if seqs is None:
            seq_list = [T_cu]
        elif set(seq_list) != {T_cu}:
            raise AuditUsageError(f"seq: got {seq_list}, expected only {T_cu}, the T that "
                                  f"cu_seqlens {packing.tolist()} fixes (or cu_seqlens='random:N')",
                                  argument="seq")
        for regime in regime_list:
            if any(d.T != T_cu for d in fam.regimes[regime].cases(Dims(1, 1, 1, T_cu, 1, 1))):
                raise AuditUsageError(f"regime: got {regime!r}, which sets its own T; explicit "
                                      f"cu_seqlens fix T = {T_cu} (use cu_seqlens='random:N')",
                                      argument="regime")
    return Rows(cfgs, seq_list, mode_list, regime_list, made.seed, made.scale, packing,
                made.oracle, fam, parse_shard(shard))
