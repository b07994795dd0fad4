"""ruff (configured in pyproject.toml) passes on the package, the tests, the tools and the examples.

The README's test command installs ruff with the test extra; without it the check is skipped,
saying so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("glaref", "tests", "tools", "examples")


def _ruff() -> list[str] | None:
    exe = shutil.which("ruff")
    if exe is not None:
        return [exe]
    try:
        import ruff  # noqa: F401 - the wheel ships the binary, run as a module
    except ImportError:
        return None
    return [sys.executable, "-m", "ruff"]


def test_ruff_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    r = subprocess.run([*ruff, "check", "--no-cache", *PATHS], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
