"""``glaref report merge A.json B.json ... -o ALL.json``: join the reports of an audit's shards.

An audit run as ``glaref audit ... --shard I/N`` for I = 0 .. N-1 (one process each, on any
machines: docs/shards.md) writes N reports whose configurations agree but for ``shard``. Their
rows, put back in the order of the unsharded plan (problem by problem, then mode, then kernel),
make the unsharded report: equal to it but for the timings (``tools/compare_audit.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .._errors import AuditUsageError
from ._args import FAMILIES, Rows, family
from ._report import JsonWriter, check_output

__all__ = ["merge"]


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise AuditUsageError(f"report: cannot read {path!r} as a glaref audit report ({exc})") \
            from None
    if not isinstance(doc, dict) or not {"device", "config", "results"} <= set(doc):
        raise AuditUsageError(f"report: {path!r} is not a glaref audit report (expected the keys "
                              "device, config, results)")
    return doc


def _order(config: dict[str, Any]):
    """A function giving each record its place in the unsharded audit's order."""
    # the recurrence's regimes derive the sizes (a report without the key is the scalar gate's)
    name = config.get("recurrence", "scalar_gate")
    if name not in FAMILIES:
        raise AuditUsageError(f"report: recurrence {name!r} is not one of {tuple(FAMILIES)}")
    fam = family(name)
    plan = Rows({k: tuple(v) for k, v in config["configs"].items()}, list(config["seq_lens"]),
                list(config["modes"]), list(config["regimes"]), int(config["seed"]), 1.0,
                None if config.get("cu_seqlens") is None else 1, "numpy", family=fam).plan()
    where = {(regime, cname, d.B, d.G, d.H, d.T, d.dk, d.dv): i for i, (regime, cname, d) in
             enumerate(plan)}
    modes, impls = list(config["modes"]), list(config["impls"])

    def key(r: dict[str, Any]) -> tuple[int, int, int]:
        problem = where[(r["regime"], r["config"], r["batch"], r["groups"], r["heads"], r["seq"],
                         r["dk"], r["dv"])]
        return problem, modes.index(r["mode"]) if r["mode"] in modes else 0, impls.index(r["impl"])

    return key


def merge(paths: list[str], out: str) -> dict[str, Any]:
    """Join the shard reports ``paths`` into ``out`` (written as ``glaref audit --json`` writes);
    returns the joined report.

    Raises
    ------
    glaref.AuditUsageError
        A file that is not a report, reports of different audits, or shards missing or given
        twice (each of 0 .. N-1 exactly once).
    """
    if not paths:
        raise AuditUsageError("report: got no file, expected the shards' JSON reports")
    out = check_output(out, "-o")
    docs = [_load(p) for p in paths]
    configs = [{k: v for k, v in d["config"].items() if k != "shard"} for d in docs]
    for p, c in zip(paths[1:], configs[1:]):
        if c != configs[0]:
            diff = sorted(k for k in set(c) | set(configs[0]) if c.get(k) != configs[0].get(k))
            raise AuditUsageError(f"report: {p!r} is another audit than {paths[0]!r} (its "
                                  f"configuration differs in {', '.join(diff)})")
    shards = [d["config"].get("shard") for d in docs]
    counts = {s.split("/")[1] if s else None for s in shards}
    n = int(next(iter(counts))) if len(counts) == 1 and None not in counts else None
    if n is None or sorted(shards) != sorted(f"{i}/{n}" for i in range(n)):
        raise AuditUsageError(f"report: got shards {shards}, expected each of 0/N .. N-1/N "
                              "exactly once")
    results = [r for d in docs for r in d["results"]]
    results.sort(key=_order(configs[0]))
    joined = {"device": docs[0]["device"], "config": configs[0]}
    writer = JsonWriter(out, joined)
    writer.doc["results"] = results
    writer.write()
    return {**joined, "results": results}


def main_merge(paths: list[str], out: str) -> str:
    """The CLI's line for a merge done."""
    doc = merge(paths, out)
    return (f"merged {len(paths)} shard(s), {len(doc['results'])} rows, into "
            f"{os.path.relpath(out)}")
