"""Counts that keep glaref's vocabulary defined once (issue 14): run before and after a clean-up.

    python3 tools/code_stats.py [--longest N] [PATH ...]      (default: glaref tests tools examples)

Prints, from the syntax trees of the Python files under the paths (never running them):
- the N longest functions (and methods) of the package, in lines (``def`` to its last line);
- every literal spelling of the output/input name tuples: a tuple or list of string constants
  equal, as a set, to the forward outputs (o, h_T), the gradients (q, k, v, log_alpha, h0), both,
  or the inputs with cotangents (q, k, v, log_alpha, h0, do, dh_T);
- every layout-kind table: a dict literal from those names to "qk", "v", "gate" or "state";
- every definition of the names that should exist once (functions and module-level assignments
  listed in ``WATCHED``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

FORWARD = {"o", "h_T"}
GRADS = {"q", "k", "v", "log_alpha", "h0"}
INPUTS = GRADS | {"do", "dh_T"}
TUPLES = {frozenset(FORWARD): "forward names", frozenset(GRADS): "gradient names",
          frozenset(FORWARD | GRADS): "output names", frozenset(INPUTS): "input names"}
KIND_VALUES = {"qk", "v", "gate", "state"}
# names that should be defined once: functions (def) and module-level constants (assignment)
WATCHED = ("OUTPUTS", "NAMES", "FORWARD", "GRADS", "GRAD_NAMES", "OUTPUT_NAMES", "SEED_CONFIGS",
           "_KIND", "_KINDS", "KIND", "rel_err", "round_to", "round_to_dtype", "check_scale",
           "dlog_alpha_identity", "suffix_sums", "DEFAULT_ACCUMULATE", "compute_dtype")


def _files(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def _strings(node: ast.AST) -> list[str] | None:
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node.lineno, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def stats(paths: list[str]) -> dict:
    longest, tuples, kinds, defs = [], [], [], defaultdict(list)
    for f in _files(paths):
        if f.resolve() == Path(__file__).resolve():
            continue                    # this script spells the names it looks for
        tree = ast.parse(f.read_text(), filename=str(f))
        if f.parts[0] == "glaref":
            longest += [(n, f"{f}:{line}", length) for n, line, length in _functions(tree)]
        for node in ast.walk(tree):
            s = _strings(node)
            if s is not None and len(s) == len(set(s)) and frozenset(s) in TUPLES:
                tuples.append((f"{f}:{node.lineno}", TUPLES[frozenset(s)]))
            if isinstance(node, ast.Dict) and node.keys and all(
                    isinstance(k, ast.Constant) and k.value in FORWARD | INPUTS for k in node.keys) \
                    and all(isinstance(v, ast.Constant) and v.value in KIND_VALUES
                            for v in node.values):
                kinds.append(f"{f}:{node.lineno}")
        for node in tree.body:
            targets = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                targets = [node.name]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            for t in targets:
                if t in WATCHED:
                    defs[t].append(f"{f}:{node.lineno}")
    longest.sort(key=lambda r: -r[2])
    return {"longest": longest, "tuples": tuples, "kinds": kinds, "defs": dict(defs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=["glaref", "tests", "tools", "examples"])
    ap.add_argument("--longest", type=int, default=5, help="how many longest functions (glaref/)")
    a = ap.parse_args(argv)
    s = stats(a.paths)
    print(f"## {a.longest} longest functions in glaref/ (lines)")
    for name, where, n in s["longest"][:a.longest]:
        print(f"  {n:4d}  {name}  ({where})")
    print(f"## literal name tuples: {len(s['tuples'])}")
    for where, what in s["tuples"]:
        print(f"  {where}  {what}")
    print(f"## layout-kind tables: {len(s['kinds'])}")
    for where in s["kinds"]:
        print(f"  {where}")
    print("## definitions of watched names (module level)")
    for name in WATCHED:
        places = s["defs"].get(name, [])
        print(f"  {name}: {len(places)}" + ("  " + ", ".join(places) if places else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
