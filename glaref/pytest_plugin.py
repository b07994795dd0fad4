"""glaref's pytest plugin (registered through the ``pytest11`` entry point when glaref is installed).

    def test_my_kernel(glaref_check):
        glaref_check(my_kernel, chunk_size=64)

Fixture ``glaref_check``: :func:`glaref.testing.check_kernel` with the command-line options
``--glaref-regimes`` (default: check_kernel's own, standard, strong_decay and near_one) and
``--glaref-dtype`` (default "float32") as its defaults; arguments given in the call win. Marker
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
                    help="comma-separated input regimes (glaref.regimes.REGIMES) the glaref_check "
                         "fixture audits kernels on (default: check_kernel's, standard, "
                         "strong_decay and near_one)")
    group.addoption("--glaref-dtype", default="float32", metavar="DTYPE",
                    help="input dtype the glaref_check fixture feeds kernels (default: float32)")


def pytest_configure(config):
    config.addinivalue_line("markers", "glaref: tests that audit a kernel against the glaref oracle")
    # a bad option is one usage error for the whole run, not a long traceback in every test
    regimes = config.getoption("glaref_regimes", default=None)
    dtype = config.getoption("glaref_dtype", default="float32")
    if regimes is not None or dtype != "float32":
        from glaref._inputs import DTYPES
        from glaref.regimes import REGIMES

        names = [r.strip() for r in str(regimes or "standard").split(",") if r.strip()]
        bad = [r for r in names if r not in REGIMES]
        if bad or not names:
            raise pytest.UsageError(f"--glaref-regimes: got {regimes!r}, expected comma-separated "
                                    f"names from {sorted(REGIMES)}")
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
