"""Writing and verifying the golden vectors (``oracles/``): ``glaref oracles generate | verify``.

The cases are listed once, in :data:`SPECS`: small versions of the seed's four configs, every
default regime of ``glaref.regimes`` (``ragged`` and ``tiny_dims`` give the T = 1, 63, 65, 1000
and dk = dv = 1 edges) and a few more edges (T = 0, G < H with B > 1, h0 absent, scale != 1).
Each spec is stored once per dtype (float32, bfloat16): the inputs are rounded to that dtype
(exactly representable, stored in float64), the float64 oracle is run on the rounded values, and
glaref's same-precision reference kernels (``_baseline``) are run in that dtype's arithmetic
(bfloat16: bfloat16 matmul operands, float32 accumulation, ``_verdict.reference_arithmetic``)
to give the figures the calibrated verdict compares with.

Files are byte-for-byte deterministic on one platform: the .npz is written here with fixed zip
timestamps, attributes, order and compression level (``numpy.savez_compressed`` stamps the
current time into every member). The manifest records each file's sha256; mpmath figures are
carried over from the previous manifest while the arrays they measure are unchanged.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import platform
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import threadpoolctl

from .. import __version__, golden, regimes
from .._audit import _metrics, _verdict
from .._audit._presets import SEED_CONFIGS
from .._inputs import Dims, Problem
from ..golden import FIGURES, GLAREF_NAMES, OUTPUTS, STRUCTURES, OracleFileError
from ..tolerances import UNIT_ROUNDOFF, tol
from . import _baseline, _exact, _judge
from ._problems import round_problem

DTYPES = ("float32", "bfloat16")
# What the reference kernels (and the proven bound) assume a kernel of each dtype accumulates in.
ACCUMULATE = {"float32": None, "bfloat16": "float32"}
ORACLE_IMPL = "numba"
STRUCTURE_CHUNK = {"unknown": None, "step_by_step": 1, "chunked_64": 64}
ZIP_DATE = (1980, 1, 1, 0, 0, 0)       # the earliest date a zip can hold
ZIP_LEVEL = 9
MAX_TOTAL_BYTES = 8_000_000            # issue 11: the whole of oracles/ within 8 MB
C_EXAMPLE_MAX_LINES = 80               # issue 11: the README's C reader and judge, ~80 lines

# Sizes. The seed configs keep G, H, dk and dv and cut B to 1 and T to SEED_T (the two largest,
# whose (H, dk, dv) states alone would take several MB each, run without h0 and final state: a
# prefill's o and its gradients). Regimes run on REGIME_DIMS, which crosses one 64-step chunk.
SEED_T = 12
REGIME_DIMS = Dims(B=1, G=1, H=2, T=80, dk=4, dv=4)
STATELESS_SEEDS = ("g2h8_d128", "g1h24_dk128_dv64")


@dataclass(frozen=True)
class Spec:
    """One case before its dtype: regime, sizes, seed, scale, and whether the kernel gets h0
    (else zeros, no dh0) and returns h_T (else dh_T is zero and there is no h_T)."""

    name: str
    regime: str
    dims: Dims
    seed: int = 0
    scale: float = 1.0
    h0: bool = True
    final_state: bool = True
    description: str = ""


def _specs() -> list[Spec]:
    out = []
    for cname, (_B, G, H, dk, dv) in SEED_CONFIGS.items():
        stateless = cname in STATELESS_SEEDS
        out.append(Spec(f"seed_{cname}", "standard", Dims(1, G, H, SEED_T, dk, dv),
                        h0=not stateless, final_state=not stateless,
                        description=f"the seed config {cname} with B = 1, T = {SEED_T}"
                        + (" (no h0, no final state)" if stateless else "")))
    for rname in regimes.DEFAULT_REGIMES:
        r = regimes.REGIMES[rname]
        sizes = r.cases(REGIME_DIMS)
        for d in sizes:
            name = f"regime_{rname}" if len(sizes) == 1 else f"regime_{rname}_T{d.T}"
            out.append(Spec(name, rname, d, description=r.description))
    std = "standard"
    out += [
        Spec("edge_T0", std, Dims(2, 1, 2, 0, 3, 2), description="no time step: o and the "
             "gradients of q, k, v, log_alpha are empty, h_T = h0, dh0 = dh_T"),
        Spec("edge_G2_H6", std, Dims(2, 2, 6, 8, 3, 3), description="B = 2, three heads per "
             "group: dq, dk summed over each group's heads"),
        Spec("edge_h0_absent", std, Dims(1, 1, 2, 8, 3, 3), h0=False, description="no initial "
             "state (zeros, no dh0), final state returned"),
        Spec("edge_scale", std, Dims(1, 1, 2, 8, 3, 3), scale=0.375, description="scale = 0.375 "
             "(exact in every format)"),
    ]
    return out


SPECS: list[Spec] = _specs()


def case_name(spec: Spec, dtype: str) -> str:
    return f"{spec.name}-{dtype}"


def all_cases() -> dict[str, tuple[Spec, str]]:
    """{case name: (spec, dtype)} in manifest order."""
    return {case_name(s, dt): (s, dt) for s in SPECS for dt in DTYPES}


def tags(spec: Spec) -> list[str]:
    """The edge conditions a case exercises (listed in the manifest)."""
    d = spec.dims
    t = []
    if d.T in (0, 1):
        t.append(f"T = {d.T}")
    if d.T in (63, 65):
        t.append(f"T = {d.T} ({'just below' if d.T == 63 else 'just above'} a 64-step chunk)")
    if d.T > 64:
        t.append("T > 64 (crosses a 64-step chunk)")
    if d.dk == d.dv == 1:
        t.append("dk = dv = 1")
    if d.G < d.H:
        t.append("G < H")
    if d.B > 1:
        t.append("B > 1")
    if not spec.h0:
        t.append("h0 absent")
    if not spec.final_state:
        t.append("no final state")
    if spec.scale != 1.0:
        t.append("scale != 1")
    return t


# ------------------------------------------------------------------------------ the arrays

def problem(spec: Spec, dtype: str) -> Problem:
    """The case's canonical problem: the regime's inputs rounded to ``dtype`` (h0 zeros when
    absent, dh_T None without a final state)."""
    p = round_problem(regimes.make_inputs(spec.regime, spec.dims, spec.seed), dtype)
    return p._replace(h0=p.h0 if spec.h0 else np.zeros_like(p.h0),
                      dh_T=p.dh_T if spec.final_state else None)


def _norm(x: np.ndarray) -> float:
    """||x||_2 as sqrt of the correctly rounded sum of the squares: the same bits on every
    platform and thread count (np.linalg.norm goes through a threaded BLAS dot product)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return math.sqrt(math.fsum(x * x))


def build_arrays(spec: Spec, dtype: str, impl: str = ORACLE_IMPL) -> dict[str, np.ndarray]:
    """Every array of one case (golden.ARRAYS, less the absent state's), float64 "bhtd"."""
    p = problem(spec, dtype)
    final = spec.final_state
    acc = ACCUMULATE[dtype]
    truth = _judge.Truth(p, spec.scale, impl)
    scales = truth.scales(final, True)
    refs = truth.references(final, True, None, _verdict.reference_arithmetic(dtype, acc))

    a: dict[str, np.ndarray] = {"q": p.q, "k": p.k, "v": p.v, "log_alpha": p.log_alpha}
    if spec.h0:
        a["h0"] = p.h0
    a["do"] = p.do
    if final:
        a["dh_T"] = p.dh_T
    present = [n for n in OUTPUTS if (final or n != "h_T") and (spec.h0 or n != "dh0")]
    for out, g in zip(OUTPUTS, GLAREF_NAMES):
        if out in present:
            a[out] = truth.reference(g, final)
    for out, g in zip(OUTPUTS, GLAREF_NAMES):
        if out in present:
            a[f"scale_{out}"] = scales["log_alpha_identity" if g == "log_alpha" else g]
    a["scale_dlog_alpha_direct"] = scales["log_alpha"]

    n_out, n_k, n_s = len(OUTPUTS), len(golden.REFERENCE_KERNELS), len(STRUCTURES)
    nan = np.full
    fig = {"ref_norm": nan(n_out, np.nan), "ref_err": nan((n_k, n_out), np.nan),
           "ref_budget_ulps": nan((n_k, n_out), np.nan), "floor_err": nan(n_out, np.nan),
           "baseline_err": nan((n_s, n_out), np.nan), "underflow_floor": nan(n_out, np.nan),
           "proven_bound": nan((n_s, n_out), np.nan)}
    for i, (out, g) in enumerate(zip(OUTPUTS, GLAREF_NAMES)):
        if out not in present:
            continue
        ref, sc = a[out], a[f"scale_{out}"]
        fig["ref_norm"][i] = _norm(ref)
        errs = {}
        for j, kern in enumerate(golden.REFERENCE_KERNELS):
            x = _baseline.round_to(refs[kern][g], dtype)      # returned in the case's dtype
            errs[kern] = _norm(x - ref)
            fig["ref_err"][j, i] = errs[kern]
            fig["ref_budget_ulps"][j, i] = _metrics.budget_ulps(g, x, ref, sc, dtype, p.dims)[0]
        fig["floor_err"][i] = _verdict.calibrated_floor(fig["ref_norm"][i], dtype, dtype, g, p.dims,
                                                        ref.size)
        fig["underflow_floor"][i] = _metrics.underflow_floor(g, dtype, p.dims)
        for r, s in enumerate(STRUCTURES):
            cs = STRUCTURE_CHUNK[s]
            fig["baseline_err"][r, i] = max(_judge.baseline_error(errs, cs), fig["floor_err"][i])
            fig["proven_bound"][r, i] = _verdict.budget_bound(g, dtype, p.dims, cs, log_alpha=p.log_alpha,
                                                              accumulate_dtype=acc)
    a["scale"] = np.array(float(spec.scale))
    a["u"] = np.array(UNIT_ROUNDOFF[dtype])
    a.update(fig)
    order = [n for n in golden.ARRAYS if n in a]
    assert set(order) == set(a), sorted(set(a) - set(order))
    return {n: np.asarray(a[n], dtype="<f8", order="C") for n in order}   # keeps 0-d 0-d


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The .npz (a zip of .npy files, deflated) of ``arrays``, identical bytes for identical
    arrays: fixed member order, dates, attributes and compression level."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, x in arrays.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, x, version=(1, 0), allow_pickle=False)
            zi = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.create_system = 3                       # unix, whatever the writing platform
            zi.external_attr = 0o100644 << 16          # a regular file, rw-r--r--
            zf.writestr(zi, npy.getvalue(), compresslevel=ZIP_LEVEL)
    return buf.getvalue()


def case_meta(spec: Spec, dtype: str, arrays: dict[str, np.ndarray], data: bytes) -> dict:
    d = spec.dims
    return {
        "file": f"{case_name(spec, dtype)}.npz",
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "dtype": dtype,
        "accumulate_dtype": ACCUMULATE[dtype] or dtype,
        "regime": spec.regime,
        "seed": spec.seed,
        "scale": spec.scale,
        "layout": "bhtd",
        "dims": {"B": d.B, "G": d.G, "H": d.H, "T": d.T, "dk": d.dk, "dv": d.dv},
        "h0": spec.h0,
        "final_state": spec.final_state,
        "outputs": [n for n in OUTPUTS if n in arrays],
        "tags": tags(spec),
        "description": spec.description,
        "shapes": {n: list(x.shape) for n, x in arrays.items()},
    }


# ------------------------------------------------------------------------------ mpmath

def mpmath_tolerance(d: Dims) -> str | None:
    """The trust tolerance (glaref/tolerances.py) whose derivation covers a case of these sizes,
    None when the case is too large for the 50-digit evaluation (or outside those derivations)."""
    if d.B * d.H * max(d.T, d.dk) * d.dv > 4096:
        return None
    if d.T <= 8 and d.dk <= 3 and d.dv <= 3:
        return "trust_mpmath"
    if d.T <= 160 and d.dk <= 4 and d.dv <= 4:
        return "trust_multichunk"
    return None


def measured_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of what the mpmath figures measure (inputs, outputs, scales, in ARRAYS order): the
    figures stay valid while these bytes do, whatever happens to the reference figures."""
    h = hashlib.sha256()
    for n in golden.INPUTS + OUTPUTS + golden.SCALES + ("scale",):
        if n in arrays:
            h.update(n.encode() + b"\0" + np.ascontiguousarray(arrays[n], dtype="<f8").tobytes())
    return h.hexdigest()


def mpmath_figures(spec: Spec, arrays: dict[str, np.ndarray]) -> dict | None:
    """The stored outputs and scales against a 50-digit closed-form evaluation (glaref.gla._exact)
    on the stored (rounded) inputs; None when the case is too large. Figures per output:
    ``scaled`` = max |stored - exact| / exact term scale, ``rel`` = ||stored - exact|| / ||exact||;
    per scale array ``scale_rel`` = max |stored - exact| / exact (the exact term scale being the
    closed form on absolute values)."""
    name = mpmath_tolerance(spec.dims)
    if name is None:
        return None
    import mpmath  # a test dependency: loaded when used

    mp = mpmath.mp
    z = np.zeros((spec.dims.B, spec.dims.H, spec.dims.dk, spec.dims.dv))
    p = Problem(arrays["q"], arrays["k"], arrays["v"], arrays["log_alpha"], arrays.get("h0", z),
                arrays["do"], arrays.get("dh_T", z), spec.dims)
    pa = Problem(*(np.abs(x) if n != "log_alpha" else x for n, x in zip(Problem._fields[:7], p[:7])),
                 spec.dims)
    old = mp.dps
    try:
        mp.dps = _exact.MP_DPS
        exact = _exact.closed_form(p, spec.scale, mp)
        absx = _exact.closed_form(pa, abs(spec.scale), mp)
        scaled, rel, scale_rel = {}, {}, {}
        for out, g in zip(OUTPUTS, GLAREF_NAMES):
            if out not in arrays:
                continue
            scaled[out], rel[out] = _exact.scaled_error(arrays[out], exact[g], absx[g], mp)
            sname = "scale_dlog_alpha_direct" if out == "dlog_alpha" else f"scale_{out}"
            # the identity scale of dlog_alpha has no closed form here; the direct one has
            s, e = arrays[sname].ravel(), absx[g].ravel()
            scale_rel[sname] = max((float(abs(mp.mpf(float(a)) - b) / b) if b != 0 else
                                    (0.0 if a == 0 else math.inf) for a, b in zip(s, e)), default=0.0)
    finally:
        mp.dps = old
    return {"dps": _exact.MP_DPS, "arrays_sha256": measured_sha256(arrays),
            "worst_scaled": max(scaled.values()), "worst_rel": max(rel.values()),
            "tolerance": name, "tolerance_value": tol(name), "scaled": scaled, "rel": rel,
            "scale_rel": scale_rel}


# ------------------------------------------------------------------------------ generate

def fingerprint() -> dict:
    """What the files' bits depend on besides glaref: versions, machine, and the BLAS libraries
    loaded (with the CPU kernels OpenBLAS picked). Call it after a case was built, so that
    numba's and numpy's BLAS are loaded."""
    import numba

    blas = sorted({f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
                   for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"})
    return {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
            "machine": platform.machine(), "system": platform.system(), "blas": blas}


def verdict_entry() -> dict:
    return {
        "calibrated_ratio": tol("calibrated_ratio"),
        "calibrated_floor": tol("calibrated_floor"),
        "calibrated_extreme_margin": tol("calibrated_extreme_margin"),
        "outputs": list(OUTPUTS),
        "reference_kernels": list(golden.REFERENCE_KERNELS),
        "reference_chunk": _baseline.CHUNK,
        "reference_chunk_wide": _baseline.CHUNK_WIDE,
        "structures": list(STRUCTURES),
        "rule": ("fail on any non-finite value; else err = ||x - ref||_2 must be <= "
                 "calibrated_ratio * baseline_err[structure, output] (calibrated tier), and "
                 "budget_ulps = max_i |x_i - ref_i| / (u * scale_<output>_i + underflow_floor[output]) "
                 "must be <= proven_bound[structure, output] (proven tier); baseline_err = "
                 "max(B, floor_err) with B = max(chunked, sqrt(chunked * scan), sqrt(chunked * "
                 "chunked_wide), m * scan, m * chunked_wide) with m = calibrated_extreme_margin / "
                 "calibrated_ratio "
                 "(unknown), scan "
                 "(step_by_step) or chunked (chunked_64) of ref_err, floor_err = "
                 "calibrated_floor * u * ||ref||_2 + sqrt(size) * underflow_floor; dlog_alpha's "
                 "ref_err is each reference kernel's own form (scan: direct; chunked, "
                 "chunked_wide: the chunk-local reverse-cumsum identity), so for dlog_alpha this is "
                 "the rule of a kernel declaring dlog_alpha_form='identity' (undeclared, glaref "
                 "holds dlog_alpha to the direct form, not stored here, and reads an error beyond "
                 "it but within the identity's as less accurate); see README.md"),
    }


def build_manifest(entries: dict[str, dict]) -> dict:
    return {
        "format_version": golden.FORMAT_VERSION,
        "generator": {"glaref": __version__, "format_version": golden.FORMAT_VERSION,
                      "command": "glaref oracles generate", "oracle_impl": ORACLE_IMPL,
                      "platform": fingerprint()},
        "layout": "bhtd",
        "arrays": {"inputs": list(golden.INPUTS), "outputs": list(OUTPUTS),
                   "scales": list(golden.SCALES), "figures": list(FIGURES)},
        "verdict": verdict_entry(),
        "total_bytes": sum(e["bytes"] for e in entries.values()),
        "cases": entries,
    }


def manifest_text(doc: dict) -> str:
    """JSON with one key per line; lists of numbers or strings, and short flat objects, kept on
    one line."""
    def fmt(x, ind: str) -> str:
        if isinstance(x, dict) and x and not (all(not isinstance(v, (dict, list)) for v in x.values())
                                              and len(json.dumps(x)) <= 100):
            inner = ind + " "
            items = [f"{inner}{json.dumps(k)}: {fmt(v, inner)}" for k, v in x.items()]
            return "{\n" + ",\n".join(items) + "\n" + ind + "}"
        if isinstance(x, list) and any(isinstance(v, (dict, list)) for v in x):
            inner = ind + " "
            return "[\n" + ",\n".join(inner + fmt(v, inner) for v in x) + "\n" + ind + "]"
        return json.dumps(x)
    return fmt(doc, "") + "\n"


def _previous(out: Path) -> dict:
    try:
        return golden.manifest(out)["cases"]
    except OracleFileError:
        return {}


def generate(out, *, mpmath: bool = True, recompute_mpmath: bool = False,
             names: list[str] | None = None,
             progress: Callable[[str], None] | None = None) -> dict:
    """Write every case and the manifest into folder ``out``; return the manifest.

    mpmath figures: carried over from ``out``'s previous manifest while the arrays they measure
    are unchanged (``arrays_sha256``), else computed (``recompute_mpmath``: always computed;
    ``mpmath=False``: left out, for quick regeneration checks). ``names``: only these cases (a
    partial folder, for tests). Stale .npz files of cases no longer listed are removed."""
    out = Path(out)
    specs = all_cases()
    unknown = [n for n in (names or []) if n not in specs]
    if unknown:
        raise ValueError(f"names: got unknown case(s) {unknown}, expected names from all_cases()")
    out.mkdir(parents=True, exist_ok=True)
    prev = _previous(out)
    entries: dict[str, dict] = {}
    for name, (spec, dtype) in specs.items():
        if names is not None and name not in names:
            continue
        arrays = build_arrays(spec, dtype)
        data = npz_bytes(arrays)
        meta = case_meta(spec, dtype, arrays, data)
        path = out / meta["file"]
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
        if mpmath_tolerance(spec.dims) is None:
            meta["mpmath"] = None
        elif not mpmath:
            meta["mpmath"] = "not computed (--no-mpmath)"
        elif (not recompute_mpmath and isinstance(prev.get(name, {}).get("mpmath"), dict)
              and prev[name]["mpmath"].get("arrays_sha256") == measured_sha256(arrays)):
            meta["mpmath"] = prev[name]["mpmath"]
        else:
            if progress:
                progress(f"{name}: mpmath at 50 digits")
            meta["mpmath"] = mpmath_figures(spec, arrays)
        entries[name] = meta
        if progress:
            progress(f"{name}: {meta['bytes']} bytes")
    keep = {e["file"] for e in entries.values()}
    for stale in out.glob("*.npz"):
        if stale.name not in keep:
            stale.unlink()
    doc = build_manifest(entries)
    (out / golden.MANIFEST).write_text(manifest_text(doc), encoding="utf-8")
    return doc


# ------------------------------------------------------------------------------ verify

INPUT_ARRAYS = set(golden.INPUTS) | {"scale", "u"}
VALUE_ARRAYS = set(OUTPUTS) | set(golden.SCALES)
EXACT_FIGURES = {"ref_norm", "floor_err", "underflow_floor", "proven_bound"}
RATIO_FIGURES = {"ref_err", "ref_budget_ulps", "baseline_err"}


def _compare(name: str, array: str, stored: np.ndarray, fresh: np.ndarray,
             stored_all: dict) -> str | None:
    """None when ``fresh`` (recomputed here) matches ``stored``, else the mismatch, named."""
    where = f"case {name}: array {array}"
    if stored.shape != fresh.shape:
        return f"{where}: stored shape {stored.shape}, recomputed {fresh.shape}"
    if np.array_equal(stored, fresh, equal_nan=True):
        return None
    if array in INPUT_ARRAYS:
        return f"{where}: differs from the seeded generator's value (inputs must be bit-identical)"
    both_nan = np.isnan(stored) & np.isnan(fresh)
    if np.any(np.isnan(stored) != np.isnan(fresh)):
        return f"{where}: NaN pattern differs"
    s, f = np.where(both_nan, 0, stored), np.where(both_nan, 0, fresh)
    with np.errstate(invalid="ignore", divide="ignore"):
        if array in VALUE_ARRAYS:
            # two float64 evaluations of the same exact values (another BLAS or libm may sum in
            # another order): within tol("golden_recompute") of each element's error scale
            unit = stored_all.get(f"scale_{array}", np.abs(s)) if array in OUTPUTS else np.abs(s)
            bad = np.abs(s - f) > tol("golden_recompute") * unit
        elif array in EXACT_FIGURES:
            inf = np.isinf(s) | np.isinf(f)
            bad = np.where(inf, s != f, np.abs(s - f) > tol("golden_recompute") * np.abs(s))
        elif array in RATIO_FIGURES:
            # measured rounding errors of the reference kernels: another platform's summation
            # order is another correct kernel, within calibrated_ratio of it (tolerances.py)
            R = tol("calibrated_ratio")
            lo = (np.broadcast_to(stored_all["floor_err"], s.shape) if array != "ref_budget_ulps"
                  else np.ones_like(s))
            bad = np.abs(s - f) > (R - 1.0) * np.maximum(np.minimum(s, f), lo)
        else:
            return f"{where}: differs (no tolerance for this array)"
    if np.any(bad):
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        return (f"{where}: stored {stored[i]!r} vs recomputed {fresh[i]!r} at index {i} "
                f"({int(bad.sum())} element(s) beyond tolerance)")
    return None


def _check_mpmath_entry(spec: Spec, m, arrays: dict[str, np.ndarray]) -> str | None:
    """The manifest's mpmath entry of a case is present exactly when the case is small enough,
    measured the stored arrays, and lies within the tolerance it names."""
    want = mpmath_tolerance(spec.dims)
    if want is None:
        return None if m is None else f"mpmath: got {m!r}, expected null (case too large)"
    if not isinstance(m, dict):
        return f"mpmath: got {m!r}, expected the 50-digit figures (glaref oracles generate)"
    if m.get("arrays_sha256") != measured_sha256(arrays):
        return "mpmath: the figures measured other arrays than the stored ones (regenerate)"
    if m.get("tolerance") != want or m.get("tolerance_value") != tol(want):
        return (f"mpmath: tolerance {m.get('tolerance')!r} = {m.get('tolerance_value')!r}, "
                f"expected {want!r} = {tol(want)!r}")
    if not m.get("worst_scaled", math.inf) <= tol(want):
        return f"mpmath: worst scaled error {m.get('worst_scaled')!r} exceeds {want} = {tol(want)!r}"
    return None


def verify(folder, *, strict: bool = False, mpmath: bool = False, names: list[str] | None = None,
           partial: bool = False,
           progress: Callable[[str], None] | None = None) -> tuple[list[str], list[str]]:
    """Check folder ``folder`` against this glaref: (problems, notes). A problem is a file
    whose sha256 differs from the manifest, an unreadable array, metadata or a verdict constant
    that differs from what this glaref generates, or a recomputed array that differs (inputs:
    at all; values: beyond tolerance). ``strict``: the recomputed file must also be bit-identical
    (same platform). ``mpmath``: recompute the 50-digit figures too (slow). ``names``: only
    these cases; ``partial``: the folder may hold a subset of the cases (``generate(names=)``)."""
    folder = Path(folder)
    problems: list[str] = []
    notes: list[str] = []
    try:
        doc = golden.manifest(folder)
    except OracleFileError as exc:
        return [str(exc)], notes
    specs = all_cases()
    listed = doc["cases"]
    want = list(listed) if names is None else names
    for n in want:
        if n not in listed:
            problems.append(f"case {n}: not in {folder / golden.MANIFEST}")
    if names is None and not partial:
        for n in specs:
            if n not in listed:
                problems.append(f"case {n}: generated by this glaref but missing from the manifest")
    ver = verdict_entry()
    for key, val in ver.items():
        if doc.get("verdict", {}).get(key) != val:
            problems.append(f"manifest: verdict.{key} is {doc.get('verdict', {}).get(key)!r}, this "
                            f"glaref has {val!r} (regenerate: glaref oracles generate)")
    total = sum(e.get("bytes", 0) for e in listed.values())
    if doc.get("total_bytes") != total:
        problems.append(f"manifest: total_bytes {doc.get('total_bytes')} != sum of the cases' {total}")
    for n in want:
        if n not in listed:
            continue
        entry = listed[n]
        try:
            case = golden.load(n, folder)
        except OracleFileError as exc:
            problems.append(str(exc))
            continue
        if n not in specs:
            problems.append(f"case {n}: not generated by this glaref (stale manifest)")
            continue
        spec, dtype = specs[n]
        fresh = build_arrays(spec, dtype)
        data = npz_bytes(fresh)
        meta = case_meta(spec, dtype, fresh, data)
        for key, val in meta.items():
            if key not in ("sha256", "bytes") and entry.get(key) != val:
                problems.append(f"case {n}: manifest field {key} is {entry.get(key)!r}, this glaref "
                                f"generates {val!r}")
        for a in sorted(set(case.arrays) | set(fresh), key=lambda x: (x not in fresh, x)):
            if a not in fresh:
                problems.append(f"case {n}: array {a}: stored but not generated by this glaref")
            elif a not in case.arrays:
                problems.append(f"case {n}: array {a}: missing from the stored file")
            else:
                msg = _compare(n, a, case.arrays[a], fresh[a], case.arrays)
                if msg:
                    problems.append(msg)
        if strict and meta["sha256"] != entry["sha256"]:
            # without --strict the values above are the check: another BLAS's last bits (a
            # float64 sum in another order) change the bytes, not the verdict
            problems.append(f"case {n}: recomputed file differs in bytes from the stored one "
                            f"(sha256 {meta['sha256'][:16]}... vs {entry['sha256'][:16]}...; "
                            f"bit-identical files are expected on the generating platform only: "
                            f"{_platform_line(doc)})")
        msg = _check_mpmath_entry(spec, entry.get("mpmath"), case.arrays)
        if msg:
            problems.append(f"case {n}: {msg}")
        if mpmath and mpmath_tolerance(spec.dims) is not None:
            got = mpmath_figures(spec, case.arrays)
            if entry.get("mpmath") != got:
                problems.append(f"case {n}: mpmath figures {entry.get('mpmath')!r} differ from the "
                                f"recomputed {got!r}")
        if progress:
            progress(f"{n}: checked")
    present = {p.name for p in folder.glob("*.npz")}
    extra = sorted(present - {e["file"] for e in listed.values()})
    if extra:
        notes.append(f"files not in the manifest (ignored): {', '.join(extra)}")
    return problems, notes


def _platform_line(doc: dict) -> str:
    p = doc.get("generator", {}).get("platform", {})
    return ", ".join(f"{k} {v}" for k, v in p.items()) or "not recorded"


def folder_default() -> Path:
    """Where ``generate`` and ``verify`` work by default: the repository's oracles/ (a source
    checkout), else the installed copy."""
    here = Path(__file__).resolve().parents[1]          # glaref/ (this file is in glaref/gla/)
    repo = here.parent / "oracles"
    if repo.is_dir() or (here.parent / "pyproject.toml").is_file():
        return repo
    return here / "oracles"


def case_table() -> list[str]:
    """The rows of oracles/README.md's table of cases (tests/test_golden.py holds the README to
    them)."""
    rows = []
    for s in SPECS:
        d = s.dims
        yes = {True: "yes", False: "no"}
        mp = "yes" if mpmath_tolerance(d) else "no (too large)"
        rows.append(f"| {s.name} | {s.regime} | {d.B}, {d.G}, {d.H}, {d.T}, {d.dk}, {d.dv} | "
                    f"{s.scale:g} | {yes[s.h0]} | {yes[s.final_state]} | {mp} |")
    return rows
