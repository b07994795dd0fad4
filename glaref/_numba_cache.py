"""Where glaref's compiled Numba code lives, and the note printed while it is first compiled.

Compiled once per machine, not once per environment: glaref's functions are cached in a per-user
folder shared by every checkout and virtual environment, keyed by the content of their source
file (not by where it is installed, nor by its modification time), so that a fresh CI container
whose cache folder is restored, or a second venv on the same machine, loads the code instead of
compiling it again. The folder is, first that applies:

    $GLAREF_CACHE_DIR/numba                    glaref's own override
    $NUMBA_CACHE_DIR/glaref                    Numba's, respected when set
    the user's cache folder + /glaref/numba    $XDG_CACHE_HOME or ~/.cache (Linux),
                                               ~/Library/Caches (macOS), %LOCALAPPDATA% (Windows)

with one subfolder per source file content, Python and Numba version, so that two versions of
glaref on one machine do not overwrite each other's entries. Numba's own index checks the
machine (CPU name and features) as well, so one folder serves a mixed fleet. When the folder
cannot be written, Numba's default places apply (the package's ``__pycache__``, then Numba's
user-wide folder), as with a plain ``cache=True``.

The cache uses Numba's locator classes (``numba.core.caching``), an internal interface; if a
Numba release changes it, ``jit`` falls back to ``cache=True``.

While a function named in ``note_compile`` compiles (not when it loads from the cache), one line
goes to stderr, so the first call never waits in silence.
"""

from __future__ import annotations

import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
from numba import njit
from numba.core import event

ENV = "GLAREF_CACHE_DIR"


def cache_dir() -> Path:
    """The folder of glaref's compiled Numba code (see the module docstring)."""
    own = os.environ.get(ENV)
    if own:
        return Path(own).expanduser() / "numba"
    numba_dir = os.environ.get("NUMBA_CACHE_DIR")
    if numba_dir:
        return Path(numba_dir).expanduser() / "glaref"
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "glaref" / "numba"


_HASHES: dict[str, str] = {}


def _source_hash(py_file: str) -> str:
    if py_file not in _HASHES:
        with open(py_file, "rb") as f:
            _HASHES[py_file] = hashlib.sha256(f.read()).hexdigest()
    return _HASHES[py_file]


try:
    from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator
except ImportError:  # pragma: no cover - a Numba without these internals: plain cache=True
    _Cache = None
else:
    class _Locator(_CacheLocator):
        """The per-user folder, one subfolder per (source content, Python, Numba); the source
        stamp is the file's content hash, so a copy of the same file elsewhere finds the entries."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            stem = Path(py_file).stem
            tag = (f"{stem}-{_source_hash(py_file)[:16]}-py{sys.version_info[0]}{sys.version_info[1]}"
                   f"-numba{numba.__version__}")
            self._cache_path = str(cache_dir() / tag)

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return _source_hash(self._py_file)

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            if not os.path.exists(py_file):
                return None
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:   # not writable: Numba's own locators are tried next
                return None
            return self

    class _Impl(CompileResultCacheImpl):
        _locator_classes = [_Locator, *CompileResultCacheImpl._locator_classes]

    class _Cache(FunctionCache):
        _impl_class = _Impl


def jit(signature=None, **options):
    """``numba.njit(**options)`` with the on-disk cache in ``cache_dir()`` (fastmath is the
    caller's to state; glaref's oracles pass ``fastmath=False``). With a ``signature`` (a Numba
    signature string) the function is compiled for it alone, when it is decorated (or loaded
    from the cache), and every call converts its arguments to it, as with ``numba.njit(sig)``:
    one compiled version where each layout of the arguments would otherwise be compiled anew."""
    def wrap(func):
        d = njit(cache=_Cache is None, **options)(func)
        if _Cache is not None:
            try:
                d._cache = _Cache(func)
            except (OSError, RuntimeError):   # pragma: no cover - no locator can write anywhere
                d.enable_caching()
        if signature is not None:
            d.compile(signature)
            d.disable_compile()
        return d
    return wrap


def run_workers(worker, n_workers: int, *args) -> None:
    """worker(w, n_workers, *args) for w = 0 .. n_workers - 1: worker 0 on this thread, the others
    on one thread each. A worker takes the items w, w + n_workers, ... of independent work and
    runs them through compiled code that releases the GIL (``nogil=True``), so that each item
    runs the same code whatever the number of threads; cheaper to compile than a ``prange``
    loop (Numba's parallel lowering). Numba's compiler lock makes a function that two workers
    meet uncompiled compile (or load from the cache) once."""
    if n_workers == 1:
        worker(0, 1, *args)
        return
    with ThreadPoolExecutor(max_workers=n_workers - 1) as pool:
        rest = [pool.submit(worker, w, n_workers, *args) for w in range(1, n_workers)]
        worker(0, n_workers, *args)
        for f in rest:
            f.result()


_NOTES: dict[object, tuple[object, float]] = {}


def note_compile(dispatcher, what, seconds: float) -> None:
    """Print one line on stderr when ``dispatcher`` compiles (a cache miss): ``what`` (a string,
    or a function of the argument types that returns one) is being compiled, about ``seconds``
    (the CPU time measured on a 2-core x86-64 machine: the wall time on an idle one)."""
    _NOTES[dispatcher] = (what, seconds)


class _Listener(event.Listener):
    def on_start(self, ev):
        d = ev.data.get("dispatcher")
        note = _NOTES.get(d)
        if note is not None:
            what, seconds = note
            if callable(what):
                what = what(ev.data.get("args"))
            where = getattr(getattr(d, "_cache", None), "cache_path", None) or "memory only"
            print(f"glaref: compiling {what}, once per machine: ~{seconds:.0f} s (cached in "
                  f"{where})", file=sys.stderr, flush=True)

    def on_end(self, ev):
        pass


event.register("numba:compile", _Listener())
