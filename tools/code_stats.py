"""Counts that keep glaref's vocabulary defined once (issue 14): run before and after a clean-up.

    python3 tools/code_stats.py [--longest N] [PATH ...]      (default: glaref tests tools examples)

Prints, from the syntax trees of the Python files under the paths (never running them):
- the N longest functions (and methods) of the package, in lines (``def`` to its last line);
- every literal spelling of the output/input name tuples: a tuple or list of string constants
  equal, as a set, to the forward outputs (o, h_T), the gradients (q, k, v, log_alpha, h0), both,
  or the inputs with cotangents (q, k, v, log_alpha, h0, do, dh_T);
- every layout-kind table: a dict literal from those names to "qk", "v", "gate" or "state";
- every definition of the names that should exist once (functions and module-level assignments
  listed in ``WATCHED``);
- the parameters of functions: every public entry point (a function named in a public module's
  ``__all__``) with more than ``PUBLIC_MOST`` and every private function on the judging path
  (``JUDGING``) with more than ``PRIVATE_MOST`` (``self``/``cls`` not counted; ``*args`` and
  ``**kwargs`` one each);
- imports of glaref's own modules inside functions;
- where each argument is refused: the functions that raise an error naming it (its
  ``argument=``, or a ``ClaimError``'s first argument), arguments refused in more than one
  function first.
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


PUBLIC_MOST, PRIVATE_MOST = 12, 8
# the judging path: the audit engine, the verdict, the designs, the claims and the testing face
# (the files it named before the judging modules moved into glaref/_audit/, so that the figures
# stay comparable: _frameworks, _metrics, _probes, _sensitivity and _where are not on it)
JUDGING = tuple(f"glaref/_audit/{m}.py" for m in (
    "__init__", "_args", "_device", "_engine", "_family", "_merge", "_messages", "_presets",
    "_records", "_report", "_runners", "_subjects", "_timing", "_verdict", "_designs", "_claims")
) + ("glaref/gla/_judge.py", "glaref/gla/_designs.py", "glaref/testing.py")


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


def _n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    named = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def _exported(tree: ast.Module) -> set[str]:
    """The names in a module's ``__all__`` (a literal list or tuple)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            return set(_strings(node.value) or ())
    return set()


def _public_module(f: Path) -> bool:
    return f.parts[0] == "glaref" and not any(p.startswith("_") and p != "__init__.py"
                                              for p in f.parts[1:])


def public_names(paths: list[str]) -> set[str]:
    """Every name a public module of glaref exports (its ``__all__``): the public entry points,
    wherever they are defined (``glaref.audit`` lives in ``glaref._audit._engine``)."""
    names: set[str] = set()
    for f in _files(paths):
        if _public_module(f):
            names |= _exported(ast.parse(f.read_text(), filename=str(f)))
    return names


def parameters(f: Path, tree: ast.Module, exported: set[str]) -> tuple[list, list]:
    """(public entry points with more than PUBLIC_MOST parameters, private judging-path functions
    with more than PRIVATE_MOST), each as (name, where, count); ``exported``: the public names."""
    public, private = [], []
    judging = any(str(f).startswith(j) for j in JUDGING)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        n, where = _n_params(node), f"{f}:{node.lineno}"
        if node.name in exported and n > PUBLIC_MOST:
            public.append((node.name, where, n))
        elif judging and node.name not in exported and n > PRIVATE_MOST:
            private.append((node.name, where, n))
    return public, private


def inner_imports(f: Path, tree: ast.Module) -> list[str]:
    """Imports of glaref's own modules inside a function (relative, or of ``glaref``)."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            own = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "")
                                                          .split(".")[0] == "glaref")) or \
                (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "glaref"
                                                      for a in node.names))
            if own:
                out.append(f"{f}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(out), key=lambda x: (x.split(":")[0], int(x.split(":")[1])))


def refusals(f: Path, tree: ast.Module) -> dict[str, set[str]]:
    """{argument: {file:function}}: the functions of ``f`` that raise an error about the argument
    (a constant ``argument=`` keyword, or ``ClaimError("name", ...)``)."""
    out: dict[str, set[str]] = defaultdict(set)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
                continue
            call, name = node.exc, None
            for kw in call.keywords:
                if kw.arg == "argument" and isinstance(kw.value, ast.Constant):
                    name = kw.value.value
            if isinstance(call.func, ast.Name) and call.func.id == "ClaimError" and call.args \
                    and isinstance(call.args[0], ast.Constant):
                name = call.args[0].value
            if isinstance(name, str):
                out[name].add(f"{f}:{fn.name}")
    return out


def stats(paths: list[str]) -> dict:
    longest, tuples, kinds, defs = [], [], [], defaultdict(list)
    public, private, inner = [], [], []
    refused: dict[str, set[str]] = defaultdict(set)
    exported = public_names([p for p in paths if Path(p).parts[:1] == ("glaref",)])
    for f in _files(paths):
        if f.resolve() == Path(__file__).resolve():
            continue                    # this script spells the names it looks for
        tree = ast.parse(f.read_text(), filename=str(f))
        if f.parts[0] == "glaref":
            longest += [(n, f"{f}:{line}", length) for n, line, length in _functions(tree)]
            pub, priv = parameters(f, tree, exported)
            public, private = public + pub, private + priv
            inner += inner_imports(f, tree)
            for name, places in refusals(f, tree).items():
                refused[name] |= places
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
    return {"longest": longest, "tuples": tuples, "kinds": kinds, "defs": dict(defs),
            "public": public, "private": private, "inner": inner, "refused": dict(refused)}


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
    print(f"## public entry points with more than {PUBLIC_MOST} parameters: {len(s['public'])}")
    for name, where, n in s["public"]:
        print(f"  {n:3d}  {name}  ({where})")
    print(f"## private functions on the judging path with more than {PRIVATE_MOST} parameters: "
          f"{len(s['private'])}")
    for name, where, n in s["private"]:
        print(f"  {n:3d}  {name}  ({where})")
    print(f"## imports of glaref's modules inside functions: {len(s['inner'])}")
    for line in s["inner"]:
        print(f"  {line}")
    refused = sorted(s["refused"].items(), key=lambda kv: (-len(kv[1]), kv[0]))
    print(f"## arguments refused in more than one function: "
          f"{sum(len(p) > 1 for _, p in refused)} of {len(refused)}")
    for name, places in refused:
        print(f"  {name}: {len(places)}  " + ", ".join(sorted(places)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
