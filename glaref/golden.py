"""Golden vectors: the float64 truth of canonical cases, stored as data (``oracles/``).

A kernel's test suite in any language reads a case (a compressed .npz, i.e. a zip of .npy files)
and judges its own outputs by the rule written out in ``oracles/README.md``, without glaref,
numba or jax. From Python, with nothing but numpy::

    import glaref.golden
    for name in glaref.golden.cases(dtype="float32"):
        c = glaref.golden.load(name)          # c["q"], c["o"], c["scale_o"], c.meta["dims"], ...

Each case holds its inputs and cotangents (already rounded to the case's dtype, stored exactly in
float64, layout "bhtd"), the oracle's outputs and gradients on them, the per-element error scales
of every output and the figures of glaref's same-precision reference kernels that the calibrated
verdict compares with. ``ARRAYS`` lists the names; ``OUTPUTS`` the order of the figure arrays.
``glaref oracles generate`` writes them (glaref/gla/_golden.py) and ``glaref oracles verify``
recomputes them.

Only numpy is imported here: a corrupted or truncated file raises :class:`OracleFileError`
naming the case (and the array, when one is unreadable), never an error from inside numpy.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import GlarefError
from ._inputs import ARRAYS as INPUTS
from ._inputs import OUTPUTS as GLAREF_NAMES  # noqa: F401 - public here, beside OUTPUTS

__all__ = ["ARRAYS", "Case", "FIGURES", "FORMAT_VERSION", "GLAREF_NAMES", "INPUTS", "MANIFEST",
           "OUTPUTS", "OracleFileError", "REFERENCE_KERNELS", "SCALES", "STRUCTURES", "cases",
           "default_root", "load", "manifest", "read_npz", "sha256_file"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"

# Inputs and cotangents (INPUTS: glaref's Problem arrays), then the outputs (what a kernel
# returns) under the files' names, in the figures' order; GLAREF_NAMES: glaref's own names of
# the same outputs (glaref.Grads fields, _inputs.OUTPUTS), in OUTPUTS' order.
OUTPUTS = ("o", "h_T", "dq", "dk", "dv", "dlog_alpha", "dh0")
# Per-element error scales: scale_<output>; for dlog_alpha the verdict uses the reverse-cumsum
# identity's scale (scale_dlog_alpha) and the direct form's is stored beside it.
SCALES = tuple(f"scale_{n}" for n in OUTPUTS) + ("scale_dlog_alpha_direct",)
REFERENCE_KERNELS = ("scan", "chunked", "chunked_wide")
# Rows of baseline_err and proven_bound: what is known of the judged kernel's structure.
STRUCTURES = ("unknown", "step_by_step", "chunked_64")
FIGURES = ("scale", "u", "ref_norm", "ref_err", "ref_budget_ulps", "floor_err", "baseline_err",
           "underflow_floor", "proven_bound")
ARRAYS = INPUTS + OUTPUTS + SCALES + FIGURES


class OracleFileError(GlarefError, ValueError):
    """A golden-vector file or the manifest is missing, corrupted, truncated or inconsistent."""


def default_root() -> Path:
    """The folder that holds the golden vectors: ``glaref/oracles`` inside an installed wheel,
    else the repository's top-level ``oracles/`` beside the package (a source checkout or an
    editable install)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "oracles", here.parent / "oracles"):
        if (cand / MANIFEST).is_file():
            return cand
    raise OracleFileError(f"golden vectors: no {MANIFEST} in {here / 'oracles'} (installed wheel) "
                          f"or {here.parent / 'oracles'} (source checkout); reinstall glaref or "
                          "run `glaref oracles generate`")


def _root(root) -> Path:
    return default_root() if root is None else Path(root)


def manifest(root=None) -> dict[str, Any]:
    """The parsed ``manifest.json`` (``oracles/README.md`` documents every field)."""
    path = _root(root) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OracleFileError(f"golden vectors: cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OracleFileError(f"golden vectors: {path} is not valid JSON ({exc}): corrupted or "
                              "truncated") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), dict):
        raise OracleFileError(f"golden vectors: {path} has no 'cases' table: not a glaref manifest")
    if doc.get("format_version") != FORMAT_VERSION:
        raise OracleFileError(f"golden vectors: {path} has format_version "
                              f"{doc.get('format_version')!r}, this glaref reads {FORMAT_VERSION}")
    return doc


def cases(dtype: str | None = None, root=None) -> list[str]:
    """Names of the stored cases (manifest order), only those of ``dtype`` ("float32",
    "bfloat16") when given."""
    doc = manifest(root)
    return [n for n, c in doc["cases"].items() if dtype is None or c.get("dtype") == dtype]


@dataclass
class Case:
    """One golden case: ``arrays`` by name (float64, "bhtd"), ``meta`` its manifest entry.
    ``case["o"]`` is ``case.arrays["o"]``."""

    name: str
    meta: dict[str, Any] = field(repr=False)
    arrays: dict[str, np.ndarray] = field(repr=False)

    def __repr__(self) -> str:
        d = self.meta.get("dims", {})
        return (f"Case({self.name!r}, dtype={self.meta.get('dtype')!r}, "
                f"dims={tuple(d.values())} (B, G, H, T, dk, dv), outputs={self.outputs})")

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.arrays[key]
        except KeyError:
            raise KeyError(f"case {self.name!r} has no array {key!r}; it has {sorted(self.arrays)}") from None

    def __contains__(self, key: str) -> bool:
        return key in self.arrays

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs this case judges (h_T only with a final state, dh0 only with h0)."""
        return tuple(n for n in OUTPUTS if n in self.arrays)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_npz(data: bytes, label: str) -> dict[str, np.ndarray]:
    """Every array of an .npz held in ``data``; any failure is an OracleFileError naming
    ``label`` (the case) and the array that could not be read."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        members = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise OracleFileError(f"{label}: not a readable .npz (zip) file: {exc}: corrupted or "
                              "truncated") from None
    out = {}
    for member in members:
        name = member[:-4] if member.endswith(".npy") else member
        try:
            raw = zf.read(member)
            out[name] = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
        except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, KeyError,
                NotImplementedError) as exc:
            raise OracleFileError(f"{label}: array {name!r} is unreadable ({type(exc).__name__}: "
                                  f"{exc}): corrupted or truncated") from None
    return out


def load(name: str, root=None, *, check_hash: bool = True) -> Case:
    """Load case ``name`` (one of :func:`cases`). The file's sha256 is checked against the
    manifest first (``check_hash``), then every array's presence and shape."""
    doc = manifest(root)
    entry = doc["cases"].get(name)
    if entry is None:
        known = list(doc["cases"])
        raise OracleFileError(f"name: got {name!r}, expected one of the {len(known)} cases "
                              f"({', '.join(known[:6])}, ...; glaref.golden.cases() lists them)")
    path = _root(root) / entry["file"]
    label = f"golden case {name!r} ({path})"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OracleFileError(f"{label}: cannot read the file: {exc.strerror or exc}") from None
    if check_hash:
        got = hashlib.sha256(data).hexdigest()
        if got != entry["sha256"]:
            raise OracleFileError(f"{label}: sha256 {got[:16]}... ({len(data)} bytes) differs from "
                                  f"the manifest's {entry['sha256'][:16]}... ({entry.get('bytes')} "
                                  "bytes): the file is corrupted, truncated or stale; reinstall "
                                  "glaref or run `glaref oracles generate`")
    arrays = read_npz(data, label)
    shapes = entry["shapes"]
    missing = [a for a in shapes if a not in arrays]
    if missing:
        raise OracleFileError(f"{label}: array(s) {missing} listed in the manifest are missing")
    for a, shape in shapes.items():
        x = arrays[a]
        if list(x.shape) != list(shape) or x.dtype != np.float64:
            raise OracleFileError(f"{label}: array {a!r} has shape {x.shape} and dtype {x.dtype}, "
                                  f"expected {tuple(shape)} float64 (manifest)")
    return Case(name, entry, arrays)
