"""``glaref oracles generate | verify``: the command-line face of glaref/gla/_golden.py.

    glaref oracles generate [--out DIR]           # write oracles/ (the cases and manifest.json)
    glaref oracles verify [--dir DIR] [--strict]  # recompute every case, check hashes and values

Exit codes: 0 done / every case matches, 1 a mismatch (each printed, naming the case and the
array), 2 usage error (an unknown --case, a --dir without manifest.json: valid names listed),
3 environment error (mpmath missing).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from . import golden
from .gla import _golden as gb


def add_parser(sub) -> None:
    """Add the ``oracles`` command to the CLI's subparsers ``sub``."""
    o = sub.add_parser(
        "oracles", help="golden vectors (oracles/): generate or verify",
        description="Golden vectors: float64 truth of canonical cases stored as .npz files with a "
        "manifest (oracles/README.md documents the format), readable without glaref.")
    acts = o.add_subparsers(dest="oracles_action", metavar="action", parser_class=type(o))
    g = acts.add_parser("generate", help="write every case and manifest.json",
                        description="Write every case (.npz, byte-for-byte deterministic on one "
                        "platform) and manifest.json. mpmath figures are carried over while the "
                        "arrays they measure are unchanged, else computed at 50 digits (needs mpmath).")
    _options(g, ("--out", "folder to write (default: the repository's oracles/)", {"metavar": "DIR"}),
             ("--no-mpmath", "leave the mpmath figures out (a quick regeneration check; the "
              "manifest then differs from the shipped one)"),
             ("--recompute-mpmath", "compute the mpmath figures even for unchanged files"))
    v = acts.add_parser("verify", help="recompute every case; check hashes and values",
                        description="Check each file's sha256 against the manifest, recompute "
                        "every case with this glaref and compare every array (inputs bit for bit, "
                        "values within tolerance) and the manifest's fields. Exit 1 on any "
                        "mismatch, naming the case and the array.")
    _options(v, ("--dir", "folder to check (default: the repository's oracles/, else the installed "
                  "copy)", {"metavar": "DIR"}),
             ("--strict", "also require the recomputed files to be bit-identical (holds on the "
              "platform that generated them; elsewhere another BLAS may change the last bits of "
              "float64 values, which the default comparison allows for)"),
             ("--mpmath", "also recompute the 50-digit mpmath figures (minutes)"),
             ("--case", "only this case (repeatable)", {"action": "append", "metavar": "NAME"}))


def _options(parser, *options) -> None:
    """``parser.add_argument(flag, help=text, **keywords)`` for each (flag, text[, keywords]); an
    option without keywords is a switch (``action="store_true"``)."""
    for flag, text, *keywords in options:
        parser.add_argument(flag, help=text, **(keywords[0] if keywords else {"action": "store_true"}))


def _err(msg: str) -> None:
    print(f"glaref oracles: error: {msg}", file=sys.stderr)


def _usage_error(ns: argparse.Namespace, folder: Path) -> str | None:
    """What is wrong with verify's --dir or --case (a typo, not a data failure), or None."""
    if ns.dir and not (folder / golden.MANIFEST).is_file():
        what = "is not a folder" if not folder.is_dir() else f"holds no {golden.MANIFEST}"
        return (f"--dir: got {ns.dir!r}, which {what}; expected a folder of golden vectors (the "
                f"repository's oracles/, or one written by `glaref oracles generate --out`)")
    if ns.case:
        try:
            known = list(golden.manifest(folder)["cases"])
        except golden.OracleFileError:    # an unreadable manifest is verify's to report
            known = list(gb.all_cases())
        bad = [n for n in ns.case if n not in known]
        if bad:
            return (f"--case: got {', '.join(map(repr, bad))}, expected names of the cases in "
                    f"{folder}: {', '.join(known)}")
    return None


def _has_mpmath() -> bool:
    return importlib.util.find_spec("mpmath") is not None


def run(ns: argparse.Namespace) -> int:
    progress = (lambda m: print(m, file=sys.stderr, flush=True)) if sys.stderr.isatty() else None
    if ns.oracles_action == "generate":
        if not ns.no_mpmath and not _has_mpmath():
            _err("generate needs mpmath for the manifest's 50-digit figures (pip install "
                 "mpmath, or pass --no-mpmath)")
            return 3
        out = ns.out or gb.folder_default()
        doc = gb.generate(out, mpmath=not ns.no_mpmath, recompute_mpmath=ns.recompute_mpmath,
                          progress=progress)
        print(f"wrote {len(doc['cases'])} cases, {doc['total_bytes']} bytes, and "
              f"manifest.json to {out}")
        return 0
    if ns.oracles_action == "verify":
        if ns.mpmath and not _has_mpmath():
            _err("--mpmath needs mpmath (pip install mpmath)")
            return 3
        folder = Path(ns.dir) if ns.dir else gb.folder_default()
        usage = _usage_error(ns, folder)
        if usage:
            _err(usage)
            return 2
        problems, notes = gb.verify(folder, strict=ns.strict, mpmath=ns.mpmath, names=ns.case,
                                    progress=progress)
        for line in notes:
            print(f"note: {line}")
        for line in problems:
            print(f"MISMATCH {line}")
        if problems:
            print(f"FAIL: {len(problems)} mismatch(es) in {folder}")
            return 1
        print(f"OK: every case in {folder} matches this glaref"
              + (" bit for bit" if ns.strict else ""))
        return 0
    _err("an action is required (generate or verify)")
    return 2
