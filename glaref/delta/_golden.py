"""Golden vectors of the gated delta rule: ``oracles/delta/`` (its own manifest.json, the same
.npz format and manifest fields as ``oracles/``), readable with ``glaref.golden.load(name,
root=".../oracles/delta")`` or with numpy alone.

    python3 -m glaref.delta._golden generate [FOLDER]     # default: the repository's oracles/delta
    python3 -m glaref.delta._golden verify [FOLDER]

Each case: a regime of ``glaref.delta.regimes`` at a small size, inputs rounded to float32
(stored exactly in float64, layout "bhtd"), the float64 oracle's outputs and gradients on them
(o, h_T, dq, dk, dv, dbeta, dlog_alpha, dh0) and their per-element sums of |terms|
(scale_<output>, docs/math_delta.md section 4). The verdict figures of the scalar family's cases
(reference kernels, budgets) do not exist for this family and are not stored.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__, golden
from .._inputs import Dims
from ..gla._golden import fingerprint, folder_default, manifest_text, npz_bytes
from ..tolerances import UNIT_ROUNDOFF, tol
from . import _oracle as gd
from . import regimes

DTYPE = "float32"
INPUTS = ("q", "k", "v", "beta", "log_alpha", "h0", "do", "dh_T")
OUTPUTS = ("o", "h_T", "dq", "dk", "dv", "dbeta", "dlog_alpha", "dh0")
SCALES = tuple(f"scale_{n}" for n in OUTPUTS)
ARRAYS = INPUTS + OUTPUTS + SCALES + ("scale", "u")


@dataclass(frozen=True)
class Spec:
    name: str
    regime: str
    dims: Dims
    gate: str = "scalar"
    scale: float = 0.5


SPECS = (
    Spec("delta_standard", "standard", Dims(1, 1, 2, 40, 4, 4)),
    Spec("delta_standard_vector", "standard", Dims(1, 1, 2, 40, 4, 4), "vector"),
    Spec("delta_beta_two", "beta_two", Dims(1, 1, 2, 40, 4, 4)),
    Spec("delta_gate_one", "gate_one", Dims(1, 1, 2, 40, 4, 4)),
    Spec("delta_converged", "converged", Dims(1, 1, 2, 40, 4, 4)),
    Spec("delta_strong_decay_vector", "strong_decay", Dims(1, 1, 2, 40, 4, 4), "vector"),
    Spec("delta_grouped", "standard", Dims(2, 1, 3, 17, 3, 5)),
    Spec("delta_T1", "standard", Dims(1, 1, 2, 1, 4, 4)),
    Spec("delta_T0", "standard", Dims(1, 1, 2, 0, 4, 4)),
)


def default_folder() -> Path:
    return folder_default() / "delta"


def _r32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float64)


def build_arrays(spec: Spec) -> dict[str, np.ndarray]:
    """Every array of one case, float64 "bhtd"."""
    dp = regimes.make_inputs(spec.regime, spec.dims, 0, gate=spec.gate)
    p = dp.p
    x = dict(zip(INPUTS, (_r32(a) for a in (p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, p.do,
                                            p.dh_T))))
    args = [x[n] for n in INPUTS[:6]]
    o, h_T = gd.forward(*args, scale=spec.scale)
    g = gd.vjp(*args, x["do"], x["dh_T"], scale=spec.scale)
    s = gd.scales(*args, x["do"], x["dh_T"], scale=spec.scale)
    a = dict(x)
    a.update(zip(OUTPUTS, (o, h_T, *g)))
    a.update(zip(SCALES, s))
    a["scale"] = np.array(float(spec.scale))
    a["u"] = np.array(UNIT_ROUNDOFF[DTYPE])
    return {n: np.asarray(a[n], dtype="<f8", order="C") for n in ARRAYS}


def case_meta(spec: Spec, arrays: dict[str, np.ndarray], data: bytes) -> dict:
    d = spec.dims
    return {"file": f"{spec.name}-{DTYPE}.npz", "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "dtype": DTYPE, "family": "delta", "regime": spec.regime,
            "gate": spec.gate, "seed": 0, "scale": spec.scale, "layout": "bhtd",
            "dims": {"B": d.B, "G": d.G, "H": d.H, "T": d.T, "dk": d.dk, "dv": d.dv},
            "outputs": list(OUTPUTS), "shapes": {n: list(x.shape) for n, x in arrays.items()}}


def build_manifest(entries: dict[str, dict]) -> dict:
    return {"format_version": golden.FORMAT_VERSION, "family": "delta",
            "generator": {"glaref": __version__, "command": "python3 -m glaref.delta._golden "
                          "generate", "oracle_impl": "numba", "platform": fingerprint()},
            "layout": "bhtd",
            "arrays": {"inputs": list(INPUTS), "outputs": list(OUTPUTS), "scales": list(SCALES),
                       "figures": ["scale", "u"]},
            "total_bytes": sum(e["bytes"] for e in entries.values()), "cases": entries}


def generate(out=None) -> dict:
    """Write every case and the manifest into ``out``; return the manifest."""
    out = default_folder() if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = {}
    for spec in SPECS:
        arrays = build_arrays(spec)
        data = npz_bytes(arrays)
        meta = case_meta(spec, arrays, data)
        path = out / meta["file"]
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
        entries[f"{spec.name}-{DTYPE}"] = meta
    doc = build_manifest(entries)
    (out / golden.MANIFEST).write_text(manifest_text(doc), encoding="utf-8")
    return doc


def verify(folder=None) -> list[str]:
    """Problems found in ``folder`` (empty when every stored case is what this glaref
    generates: inputs bit-identical, values within tol("golden_recompute") of their scale)."""
    folder = default_folder() if folder is None else Path(folder)
    try:
        listed = golden.manifest(folder)["cases"]
    except golden.OracleFileError as exc:
        return [str(exc)]
    problems = []
    want = {f"{s.name}-{DTYPE}": s for s in SPECS}
    for n in want.keys() - listed.keys():
        problems.append(f"case {n}: missing from {folder / golden.MANIFEST}")
    for n, spec in want.items():
        if n not in listed:
            continue
        try:
            case = golden.load(n, folder)
        except golden.OracleFileError as exc:
            problems.append(str(exc))
            continue
        fresh = build_arrays(spec)
        for a, f in fresh.items():
            s = case.arrays.get(a)
            if s is None or s.shape != f.shape:
                problems.append(f"case {n}: array {a}: missing or of another shape")
            elif a in INPUTS or a in ("scale", "u"):
                if not np.array_equal(s, f):
                    problems.append(f"case {n}: array {a}: differs from the seeded generator's")
            else:
                unit = np.abs(case.arrays[f"scale_{a}"]) if a in OUTPUTS else np.abs(s)
                with np.errstate(invalid="ignore"):
                    bad = np.abs(s - f) > tol("golden_recompute") * unit
                if np.any(bad):
                    problems.append(f"case {n}: array {a}: {int(bad.sum())} element(s) differ "
                                    "beyond tolerance")
    return problems


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("generate", "verify"):
        print("usage: python3 -m glaref.delta._golden generate|verify [FOLDER]", file=sys.stderr)
        return 2
    folder = argv[1] if len(argv) > 1 else None
    if argv[0] == "generate":
        doc = generate(folder)
        print(f"{len(doc['cases'])} cases, {doc['total_bytes']} bytes")
        return 0
    problems = verify(folder)
    print("\n".join(problems) or "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
