"""Regenerate the golden vectors (oracles/) and check them: a thin driver of the package.

    python3 tools/regen_oracles.py                      # glaref oracles generate, then verify --strict
    python3 tools/regen_oracles.py --recompute-mpmath   # also redo every 50-digit mpmath figure

Run it from a source checkout (it puts the repository first on sys.path) after any change to the
oracle, the reference kernels, the verdict's constants or the case list; commit oracles/ with
the change. Exit status: generate's (2, 3) or verify's (0 or 1).
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glaref.cli import main  # noqa: E402

if __name__ == "__main__":
    out = str(ROOT / "oracles")
    extra = [a for a in sys.argv[1:] if a == "--recompute-mpmath"]
    code = main(["oracles", "generate", "--out", out, *extra])
    if code == 0:
        code = main(["oracles", "verify", "--dir", out, "--strict"])
    sys.exit(code)
