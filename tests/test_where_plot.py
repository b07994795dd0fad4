"""The plot's panels of where the error is (glaref._audit._report): per failing output, its error
against t (the profile's per-step figures, glaref._audit._where), the allowed band and the chunk
boundaries. One panel drawn from a record made by hand (what it draws is read back from the
axes), and the whole plot of a real failing audit, whose panels are counted.
"""

from __future__ import annotations

import pytest

from glaref._audit import _report

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _record(time, band, chunk=4, seq=10):
    return {"impl": "user:kernel", "seq": seq, "regime": "strong_decay",
            "where": {"q": {"time": time, "time_band": band, "time_bin": 1, "chunk": chunk,
                            "chunk_inferred": False}}}


def test_a_where_panel_draws_the_error_the_band_and_the_chunk_boundaries():
    time = [1.0, 2.0, 0.5, 3.0, 80.0, 1.0, 2.0, 0.0, 4.0, 90.0]
    band = [5.0] * 10
    fig, ax = plt.subplots()
    try:
        _report._where_panel(ax, _record(time, band), "q")
        error, allowed = ax.get_lines()[:2]
        # the error per step, floored at 1e-3 so that an exact step shows on the log axis
        assert list(error.get_xdata()) == list(range(10))
        assert list(error.get_ydata()) == [1.0, 2.0, 0.5, 3.0, 80.0, 1.0, 2.0, 1e-3, 4.0, 90.0]
        assert list(allowed.get_ydata()) == band and allowed.get_linestyle() == ":"
        # chunk boundaries at the multiples of C = 4 below T = 10: two vertical lines
        verticals = [ln for ln in ax.get_lines()[2:] if len(set(ln.get_xdata())) == 1]
        assert sorted(ln.get_xdata()[0] for ln in verticals) == [4, 8]
        assert ax.get_yscale() == "log"
        assert ax.get_title() == "user:kernel T=10 strong_decay: q (gradient) per step (budget units)"
        assert "chunks of 4" in ax.get_xlabel()
    finally:
        plt.close(fig)


def test_a_binned_profile_is_drawn_at_the_bins_first_steps_without_a_band_or_chunks():
    r = _record([1.0, 7.0, 2.0], None, chunk=None, seq=3000)
    r["where"]["q"]["time_bin"] = 1000
    fig, ax = plt.subplots()
    try:
        _report._where_panel(ax, r, "q")
        lines = ax.get_lines()
        assert len(lines) == 1 and list(lines[0].get_xdata()) == [0, 1000, 2000]
        assert ax.get_xlabel() == "t"
    finally:
        plt.close(fig)


@pytest.mark.jax
@pytest.mark.slow
def test_the_plot_of_a_failing_audit_has_one_where_panel_per_failing_output(tmp_path,
                                                                            monkeypatch):
    import glaref

    import mutants

    recs = glaref.audit([mutants.MUTANTS["chunk_off_by_one"]], "1,1,2,8,8", [40], ["fwd_bwd"],
                        regimes=["standard"], chunk_size=16, repeats=0)
    failing = _report.failed_outputs(recs[0])
    assert failing, recs[0]["verdict"]
    drawn = []
    real = _report._where_panel
    monkeypatch.setattr(_report, "_where_panel",
                        lambda ax, r, n: (drawn.append(n), real(ax, r, n)))
    path = tmp_path / "where.png"
    _report.plot(recs, path)
    assert path.stat().st_size > 0
    # the failing outputs with a time axis (dh0 and h_T have none), each with its profile
    timed = [n for n in failing if n not in ("h_T", "h0")]
    assert timed and drawn == timed[:_report.MAX_WHERE_PANELS]
    assert all(len(recs[0]["where"][n]["time"]) == 40 for n in drawn)
