"""``glaref audit --shard I/N`` and ``glaref report merge``: three shards run concurrently (three
processes, as a scheduler would), merged, equal the unsharded audit's report but for timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from glaref.cli import main  # noqa: E402

pytestmark = pytest.mark.jax

ROOT = Path(__file__).resolve().parents[1]
KERNEL = f"{Path(__file__).resolve().parent / 'audit_kernels.py'}:scan_kernel_final"
# four problems (two regimes x two lengths) x two modes x two kernels: 16 rows
ARGS = ["audit", "--impl", f"chunked,{KERNEL}", "--config", "1,1,2,8,4", "--seq", "9,20",
        "--regime", "standard,strong_decay", "--repeats", "0", "--oracle", "numpy",
        "--no-progress"]

sys.path.insert(0, str(ROOT / "tools"))
from compare_audit import differences  # noqa: E402


@pytest.mark.slow     # four processes that each load jax and the oracle: 40 s to 3 min
def test_three_concurrent_shards_merge_into_the_unsharded_report(tmp_path, capsys):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-m", "glaref", *ARGS, "--shard", f"{i}/3",
                               "--json", str(tmp_path / f"s{i}.json")], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    assert main([*ARGS, "--json", str(tmp_path / "whole.json")]) == 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, out + err
    shards = [json.loads((tmp_path / f"s{i}.json").read_text()) for i in range(3)]
    assert [s["config"]["shard"] for s in shards] == ["0/3", "1/3", "2/3"]
    assert all(s["results"] for s in shards)
    capsys.readouterr()
    code = main(["report", "merge", *(str(tmp_path / f"s{i}.json") for i in (2, 0, 1)),
                 "-o", str(tmp_path / "all.json")])
    assert code == 0 and "merged 3 shard(s), 16 rows" in capsys.readouterr().out
    whole = json.loads((tmp_path / "whole.json").read_text())
    merged = json.loads((tmp_path / "all.json").read_text())
    assert "shard" not in whole["config"] and len(whole["results"]) == 16
    assert differences(whole, merged) == []
    # the JSON is written with the user's umask, as the plot is (never mkstemp's 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "all.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_merge_refuses_missing_or_foreign_shards(tmp_path, capsys):
    doc = {"device": {}, "config": {"configs": {}, "seq_lens": [9], "modes": ["fwd"],
                                    "regimes": ["standard"], "seed": 0, "impls": ["x"],
                                    "shard": "0/2"}, "results": []}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    doc["config"] = {**doc["config"], "seed": 1, "shard": "1/2"}
    (tmp_path / "b.json").write_text(json.dumps(doc))
    assert main(["report", "merge", str(tmp_path / "a.json"), "-o", str(tmp_path / "o.json")]) == 2
    assert "expected each of 0/N .. N-1/N exactly once" in capsys.readouterr().err
    assert main(["report", "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o",
                 str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "is another audit" in err and "differs in seed" in err, err
    assert main(["audit", "--shard", "3/3"]) == 2
    assert "--shard: got '3/3', expected I/N with 0 <= I < N" in capsys.readouterr().err
