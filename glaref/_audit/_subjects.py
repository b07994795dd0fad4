"""The kernels under audit ("subjects"): built-in names, ``package.module:function``,
``path/to/file.py:function`` or a Python callable.

A kernel is a callable ``(q, k, v, log_alpha, h0) -> o`` or ``-> (o, h_T)`` taking JAX arrays in
one layout ("bhtd" or "bthd"); for the gated delta rule (``--recurrence delta``) it takes its
family's inputs, ``(q, k, v, beta, log_alpha, h0)``, and the built-in names are
``glaref.delta.kernels``' scan and chunked. On scale: the oracle always applies ``scale``. A kernel whose
signature has a ``scale`` parameter receives it; any other kernel is expected to apply that scale
itself (a user kernel with a fixed 1/sqrt(dk), say, is audited with ``--scale``). The built-in
kernels take ``scale``. Built-in kernels are audited with ``return_final_state=True``, so h_T and
the effect of its cotangent are checked too.

What the verdict knows of a kernel's structure (glaref._audit._verdict): the built-in ``chunked`` is
judged with its chunk length (the ``chunk_size`` default, 64) and ``scan`` with 1; both promise
float32 accumulation for narrower inputs (glaref.kernels docstring), so they are judged with
``accumulate_dtype="float32"``. A user kernel is judged with the ``chunk_size`` and
``accumulate_dtype`` the caller gives (``--chunk-size``, ``--accumulate-dtype``), by default None:
unknown chunking, and float32 accumulation for narrower inputs (``glaref.gla._judge.DEFAULT_ACCUMULATE``).
How a kernel computes dlog_alpha (``--dlog-alpha-form``): the built-in chunked kernel uses the
reverse-cumsum identity with scalar gates and the direct form with vector gates, the scan the
direct form (``glaref.kernels.dlog_alpha_form``); a user kernel's is unknown unless given, and is
then judged as the identity (the less accurate form, so that either passes).

Vector gates need nothing of a kernel's signature: log_alpha simply has rank 4. Packed sequences
(the audit's ``cu_seqlens``) do: a kernel is given the offsets as the keyword ``cu_seqlens`` (a
concrete int64 NumPy array of N + 1 offsets, B = 1; h0 and h_T are (N, H, dk, dv)), so a user
kernel audited on packed sequences must have a ``cu_seqlens`` parameter (or ``**kwargs``), as
flash-linear-attention's kernels do; the built-in kernels have one.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, replace
from typing import Callable

from .._errors import AuditEnvironmentError, AuditUsageError
from ._claims import Claims
from ._family import Family
from ._frameworks import accepts
from ._presets import BUILTIN_IMPLS


@dataclass(frozen=True)
class Subject:
    name: str            # the "impl" of the records
    fn: Callable         # (q, k, v, log_alpha, h0) -> o | (o, h_T), arrays in the audit's layout
    claims: Claims       # what the verdict knows of it (glaref._audit._claims): the caller's, or a
    #                      built-in kernel's own chunk size, accumulate dtype and forms


def _precision_arg(precision: str):
    if precision == "default":
        return None
    import jax
    return getattr(jax.lax.Precision, precision.upper())


def _builtin(name: str, claims: Claims, precision: str, scale: float, family: Family) -> Subject:
    """The recurrence family's built-in JAX kernel ``name`` (``Family.kernels``, imported here:
    the lazy jax boundary), judged with its own claims (``Family.builtin_claims``)."""
    try:
        kernels = importlib.import_module(family.kernels)
    except ImportError as exc:
        raise AuditEnvironmentError(f"impl {name!r}: the built-in kernels could not be imported "
                                    f"({exc}); pip install 'glaref[jax]'", argument="impl") from None
    fn = getattr(kernels, name)
    kw = {"layout": claims.layout, "precision": _precision_arg(precision),
          "return_final_state": True, "scale": scale}
    return Subject(name, functools.partial(fn, **kw), family.builtin_claims(kernels, name, claims))


def _load_file(path: str):
    if not os.path.isfile(path):
        raise AuditUsageError(f"impl: got file {path!r}, which does not exist", argument="impl")
    # a stable, unique module name per file, so two files called kernel.py do not collide
    tag = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    modname = f"_glaref_user_kernel_{tag}"
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise AuditUsageError(f"impl: got file {path!r}, which Python cannot load as a module",
                              argument="impl")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    # the file's directory first on sys.path while it loads, so that it imports its sibling
    # modules however glaref was started (pytest does the same for test files)
    directory = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[modname]
        raise AuditUsageError(f"impl: importing {path!r} failed: {_raised(exc)}", argument="impl") from None
    finally:
        if sys.path and sys.path[0] == directory:
            del sys.path[0]
        elif directory in sys.path:
            sys.path.remove(directory)
    return module


def _raised(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _defined(module) -> str:
    """What a module defines that could be a kernel, for a message: the callables of its
    ``__all__`` when it has one (a package re-exporting its kernels), else its public callables
    defined in it (not those it imported)."""
    public = getattr(module, "__all__", None)
    if isinstance(public, (list, tuple)):
        names = sorted(n for n in public if isinstance(n, str) and callable(getattr(module, n, None)))
    else:
        names = sorted(n for n, x in vars(module).items() if callable(x) and not n.startswith("_")
                       and getattr(x, "__module__", None) == module.__name__)
    return ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") if names else "none"


def _user(spec: str, claims: Claims, scale: float) -> Subject:
    if ":" not in spec:
        raise AuditUsageError(f"impl: got {spec!r}, expected one of {BUILTIN_IMPLS}, "
                              "package.module:function or path/to/file.py:function", argument="impl")
    target, _, func = spec.rpartition(":")
    if not target or not func:
        raise AuditUsageError(f"impl: got {spec!r}, expected package.module:function or "
                              "path/to/file.py:function", argument="impl")
    if target.endswith(".py") or os.sep in target or "/" in target:
        module = _load_file(target)
    else:
        try:
            module = importlib.import_module(target)
        except (Exception, SystemExit) as exc:
            raise AuditUsageError(f"impl: could not import module {target!r}: "
                                  f"{_raised(exc)}", argument="impl") from None
    try:
        fn = getattr(module, func)
    except AttributeError:
        raise AuditUsageError(f"impl: module {target!r} has no attribute {func!r}; the callables "
                              f"it defines: {_defined(module)}", argument="impl") from None
    if not callable(fn):
        raise AuditUsageError(f"impl: {spec!r} names {fn!r:.60} (type {type(fn).__name__}), "
                              "expected a callable", argument="impl")
    if accepts(fn, "scale"):
        fn = functools.partial(fn, scale=scale)
    return Subject(spec, fn, claims)


def resolve(impl, *, claims: Claims, compute_dtype: str, precision: str, scale: float,
            family: Family, packed: bool = False) -> Subject:
    """A JAX Subject from a built-in name, a 'module:function' / 'file.py:function' spec or a
    callable, judged with the caller's ``claims`` (a built-in kernel completes them with its own
    chunk size, accumulate dtype and forms, which for dlog_alpha_form depend on the gate kind),
    resolved at ``compute_dtype`` (``Claims.resolved``). ``packed``: the audit runs packed
    sequences, so the kernel must take ``cu_seqlens``. ``family``: the recurrence whose built-in
    kernels the names are."""
    subject = _resolve(impl, claims, precision, scale, family)
    _check_packed(subject, packed)
    return replace(subject, claims=subject.claims.resolved(compute_dtype))


def framework_subject(kernel: Callable, claims: Claims, *, packed: bool) -> Subject:
    """A torch or NumPy kernel as a Subject (``glaref._audit._frameworks.run_kernel`` passes it the
    scale), judged with ``claims`` resolved at their compute dtype (None: the inputs' dtype)."""
    subject = Subject(kernel_name(kernel), kernel, claims.resolved(claims.compute_dtype or
                                                                   claims.dtype))
    _check_packed(subject, packed)
    return subject


def _check_packed(subject: Subject, packed: bool) -> None:
    if packed and not accepts(subject.fn, "cu_seqlens"):
        raise AuditUsageError(f"impl {subject.name!r}: packed sequences are given to a kernel as "
                              "the keyword cu_seqlens=, which its signature does not take", argument="impl")


def kernel_name(kernel) -> str:
    """How records name a callable kernel."""
    return getattr(kernel, "__qualname__", None) or getattr(kernel, "__name__", None) or repr(kernel)


def _resolve(impl, claims: Claims, precision: str, scale: float, family: Family) -> Subject:
    if isinstance(impl, Subject):
        return impl
    if callable(impl):
        fn = functools.partial(impl, scale=scale) if accepts(impl, "scale") else impl
        return Subject(kernel_name(impl), fn, claims)
    if not isinstance(impl, str) or not impl:
        raise AuditUsageError(f"impl: got {impl!r}, expected a kernel name, spec or callable",
                              argument="impl")
    if impl in BUILTIN_IMPLS:
        return _builtin(impl, claims, precision, scale, family)
    return _user(impl, claims, scale)
