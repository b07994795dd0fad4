"""The field's designs at the seed's sizes (-m slow): never FAIL with the CLI's defaults, ok with
their whole design declared.

tests/zoo.py ``field_zoo``: flash-linear-attention's chunk form (decays from chunk-local
cumulative sums; dlog_alpha by the identity and by autodiff) at C = 16, 32, 64 undeclared and
128, 256 declared, and Mamba2's chunk scan at C = 256 declared, judged by ``zoo.judge_field`` (the
audit's rule) on the seed's four configs at T = 512 and 2048 and g1h1_d128 at T = 8192, batch cut
to 1 and heads to at most 8 (``zoo.seed_cases``), float32, under standard and strong decay (where
the chunk-local cumulative sums lose the most: docs/budgets.md, section 9). Minutes per case on
two cores; the report is docs/reports/field_zoo_seed_cpu.txt (``tools/sensitivity.py
--field-only``, the same judging function).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax", reason="the field's designs are JAX kernels")

from glaref import regimes  # noqa: E402
from glaref._inputs import Dims  # noqa: E402
from glaref.gla import _judge  # noqa: E402

import zoo  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = [pytest.mark.jax, pytest.mark.slow]

REGIMES = ("standard", "strong_decay")


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("name,cfg,T", [pytest.param(n, c, T, id=f"{n}-T{T}")
                                        for n, c, T in zoo.seed_cases()])
def test_the_fields_designs_at_seed_sizes_never_fail(name, cfg, T, regime):
    B, G, H, dk, dv = cfg
    p = regimes.make_inputs(regime, Dims(B, G, H, T, dk, dv), 0)
    r = lambda x: np.asarray(x).astype(np.float32).astype(np.float64)   # noqa: E731
    p = p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha), h0=r(p.h0),
                   do=r(p.do), dh_T=r(p.dh_T))
    rows = zoo.judge_field(_judge.Truth(p, 1.0, "numba"), "float32",
                           dict(final=True, grads=True, compute_dtype="float32"))
    assert {r["kernel"] for r in rows} == set(zoo.field_zoo())
    bad = zoo.field_false_alarms(rows)
    assert not bad, [f"{r['kernel']} declared={r['declared']}: {r['reason']}" for r in bad]
