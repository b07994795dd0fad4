"""The three outcomes on the faces: a correct design the field ships that errs more than the most
accurate designs is "less accurate" (a pass with its x_best, the design that explains it and a
warning in the testing API), and a failure only under ``strict``.

The kernel is flash-linear-attention's chunk form (decays from chunk-local float32 cumulative
sums over 64 steps, tests/zoo.py ``field_zoo``): at T = 1000 its final state errs 14x the
segment-sum references (measured), within the chunk-cumsum design's own error.
"""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

import glaref  # noqa: E402
from glaref.testing import LessAccurateWarning, check_kernel  # noqa: E402

import zoo  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.jax

KERNEL = zoo.field_zoo()["cumsum64_autodiff"][0]
ROW = dict(configs="1,1,2,64,64", seqs=[1000], modes=["fwd_bwd"], regimes="standard")


@pytest.fixture(scope="module")
def rec():
    """The field design's one audited row, with the CLI's defaults."""
    (r,) = glaref.audit([KERNEL], ROW["configs"], ROW["seqs"], ROW["modes"],
                        regimes=ROW["regimes"], repeats=0)
    return r


def test_a_field_design_is_less_accurate_not_failed_and_fails_under_strict(rec):
    assert rec["ok"] is True and rec["outcome"] == "less_accurate", rec["verdict"]
    assert rec["outcomes"]["h_T"] == "less_accurate" and rec["x_best"]["h_T"] > 6
    assert rec["envelope_ratio"]["h_T"] <= 6
    assert rec["verdict"].startswith("less accurate h_T:"), rec["verdict"]
    assert any("chunk-local cumulative sums over 64 steps" in n for n in rec["notes"]), rec["notes"]
    assert glaref.audit([KERNEL], ROW["configs"], ROW["seqs"], ROW["modes"],
                        regimes=ROW["regimes"], repeats=0, strict=True)[0]["ok"] is False


def test_check_kernel_warns_on_a_less_accurate_design_and_fails_it_under_strict():
    with pytest.warns(LessAccurateWarning, match=r"(?s)1 of 1 rows less accurate.*h_T: less accurate"):
        check_kernel(KERNEL, framework="jax", **ROW)
    with pytest.raises(AssertionError, match="FAIL h_T:strict"):
        check_kernel(KERNEL, framework="jax", strict=True, **ROW)


def test_the_cli_takes_strict_and_decay_form(capsys):
    from glaref.cli import main

    args = ["audit", "--impl", f"{zoo.__file__}:cumsum_decays", "--config", "1,1,2,8,8",
            "--seq", "40", "--mode", "fwd", "--repeats", "0", "--regime", "standard",
            "--chunk-size", "16", "--decay-form", "chunk_cumsum", "--strict", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().out
    assert main(args[:-4] + ["--decay-form", "nope"]) == 2
    assert "--decay-form" in capsys.readouterr().err


def test_the_plot_marks_less_accurate_outputs_apart_from_ok_and_failed_ones(rec, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from glaref._audit._report import plot

    # the same row twice more at other T: once with dq failed (FAIL beside less accurate), once
    # with h_T's less accurate outcome a failure under strict (still marked less accurate)
    failed = {**rec, "seq": 2000, "ok": False, "outcome": "fail",
              "outcomes": {**rec["outcomes"], "q": "fail"}, "failed_tier": {"q": "calibrated"}}
    strict = {**rec, "seq": 4000, "ok": False, "failed_tier": {"h_T": "strict"}}
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: saved.append(fig))
    plot([rec, failed, strict], "unused.png")
    (fig,) = saved
    panels = {ax.get_title(): ax for ax in fig.axes}

    def marked(title, marker):
        return sorted(x for ln in panels[title].get_lines() if ln.get_marker() == marker
                      and ln.get_linestyle() in ("None", "", " ") for x in ln.get_xdata())

    less = [n for n, o in rec["outcomes"].items() if o == "less_accurate"]
    assert "h_T" in less, rec["outcomes"]
    assert marked("rel_err h_T", "D") == [1000, 2000, 4000]
    assert marked("rel_err h_T", "x") == []
    assert marked("rel_err q (gradient)", "x") == [2000]
    for title, name in (("rel_err o", "o"), ("rel_err v (gradient)", "v"),
                        ("rel_err h0 (gradient)", "h0")):
        if name not in less:                                      # ok: no mark at all
            assert marked(title, "D") == marked(title, "x") == [], title
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "verdict failed" in labels and "less accurate (within the field's designs)" in labels
