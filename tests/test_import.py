"""`import glaref` pulls in nothing heavy until used (checked in fresh processes)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import blocked_imports

HEAVY = ("numba", "jax", "jaxlib", "torch", "glaref.gla._numba", "matplotlib", "mpmath", "scipy")

_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import glaref
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "heavy": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def _probe(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_is_light():
    # What `import glaref` loads is checked here; how long it takes is a figure of
    # tools/first_hour.py (import_s), never a timed unit test (a shared CI core can deschedule it).
    r = _probe(_PROBE)
    assert r["heavy"] == [], f"import glaref loaded {r['heavy']}"


_BLOCKED = blocked_imports("numba", "jax", "jaxlib", "torch", "ml_dtypes", "matplotlib",
                           "mpmath") + r"""
import numpy as np
import glaref
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 1, 4, 2)); v = rng.standard_normal((1, 2, 4, 3))
la = -rng.random((1, 2, 4))
o, h_T = glaref.forward(q, q, v, la, impl="numpy")
g = glaref.vjp(q, q, v, la, None, v, impl="numpy")
try:
    glaref.forward(q, q, v, la, impl="numba")
    numba_error = None
except ImportError as e:
    numba_error = str(e)
import json
print(json.dumps({"o": list(o.shape), "dh0": list(g.h0.shape), "numba_error": numba_error}))
"""


def test_numpy_oracle_works_without_numba_jax_or_torch():
    r = _probe(_BLOCKED)
    assert r["o"] == [1, 2, 4, 3] and r["dh0"] == [1, 2, 2, 3]
    # without numba, impl="numba" fails with an ImportError at the call, not at import glaref
    assert r["numba_error"] is not None and "numba" in r["numba_error"]

