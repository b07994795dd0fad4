"""glaref's pytest plugin (registered through the ``pytest11`` entry point when glaref is installed).

    def test_my_kernel(glaref_check):
        glaref_check(my_kernel, chunk_size=64)

Fixture ``glaref_check``: :func:`glaref.testing.check_kernel` with the command-line options
``--glaref-regimes`` (default: check_kernel's own, those of the kernel's recurrence) and
``--glaref-dtype`` (default "float32") as its defaults; arguments given in the call win. A gated
delta rule kernel is checked with ``glaref_check(kernel, recurrence="delta")``, and
``--glaref-regimes`` takes the names of either recurrence's regimes (``glaref.regimes.REGIMES``,
``glaref.delta.regimes.REGIMES``), each test's check refusing those not of its own. Marker
``glaref``: tests that audit a kernel against the glaref oracle (``pytest -m glaref`` selects
them).

Loading the plugin costs nothing: it imports neither jax nor numba (only pytest and glaref's
numpy-only package root); the fixture imports ``glaref.testing`` (and the engine imports jax)
only when a test uses it.
"""

from __future__ import annotations

import functools

import pytest

__all__ = ["glaref_check", "pytest_addoption", "pytest_configure"]


def pytest_addoption(parser):
    group = parser.getgroup("glaref", "glaref: kernels checked against the float64 oracle")
    group.addoption("--glaref-regimes", default=None, metavar="NAMES",
                    help="comma-separated input regimes the glaref_check fixture audits kernels "
                         "on (glaref.regimes.REGIMES; for recurrence='delta' kernels "
                         "glaref.delta.regimes.REGIMES; default: check_kernel's, those of the "
                         "kernel's recurrence)")
    group.addoption("--glaref-dtype", default="float32", metavar="DTYPE",
                    help="input dtype the glaref_check fixture feeds kernels (default: float32)")


def pytest_configure(config):
    config.addinivalue_line("markers", "glaref: tests that audit a kernel against the glaref oracle")
    # a bad option is one usage error for the whole run, not a long traceback in every test
    regimes = config.getoption("glaref_regimes", default=None)
    dtype = config.getoption("glaref_dtype", default="float32")
    if regimes is not None or dtype != "float32":
        from glaref._inputs import DTYPES
        from glaref.delta.regimes import REGIMES as DELTA_REGIMES
        from glaref.regimes import REGIMES

        known = sorted(set(REGIMES) | set(DELTA_REGIMES))
        names = [r.strip() for r in str(regimes or "standard").split(",") if r.strip()]
        bad = [r for r in names if r not in known]
        if bad or not names:
            raise pytest.UsageError(f"--glaref-regimes: got {regimes!r}, expected comma-separated "
                                    f"names from {known}")
        if dtype not in DTYPES:
            raise pytest.UsageError(f"--glaref-dtype: got {dtype!r}, expected one of {DTYPES}")


@pytest.fixture
def glaref_check(request):
    """glaref.testing.check_kernel with --glaref-regimes and --glaref-dtype as defaults."""
    from glaref.testing import check_kernel

    defaults = {"dtype": request.config.getoption("glaref_dtype")}
    regimes = request.config.getoption("glaref_regimes")
    if regimes is not None:
        defaults["regimes"] = regimes
    return functools.partial(check_kernel, **defaults)
