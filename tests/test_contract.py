"""The contract, drawn at random (issue 17): no internal error, no silent wrong answer.

Hypothesis draws bad and edge inputs across the families the issue lists and checks, for every
call, that exactly one of these happened:

- a typed error naming the argument (``glaref.GlarefError`` whose message starts "<arg>:"; the
  audit's ``AuditUsageError``/``AuditEnvironmentError``; a kernel's failure as the
  ``AssertionError`` of ``check_kernel``; on the CLI exit 2 or 3 with a one-line reason);
- a correct finite result: float64 arrays of the right shapes, the Numba path equal to the
  NumPy reference within ``tol("trust_multichunk")`` of each element's term scale (so memory the
  oracle did not write cannot pass), and the Numba path bit-identical on a second call;
- a non-finite result with exactly one ``glaref.NonFiniteWarning`` that says why (the overflow's
  likely cause, or the non-finite inputs accepted with ``allow_nonfinite=True``), and no other
  warning (numpy's own overflow warnings are replaced by it on both paths).

Anything else (another exception type, a traceback out of ``glaref.cli.main``, a non-finite
value without its warning, a wrong kernel that passes, a correct one that fails) fails the test.

Families: oracle calls (shapes and ranks, dtypes and containers, NaN/inf and overflowing values,
layouts, lenient arguments) on ``forward``, ``vjp``, ``dlog_alpha_identity`` and ``scales``;
kernels of every wrong kind through ``check_kernel``; CLI flags through ``main``. The default
suite draws a bounded number of examples (deterministic); ``-m slow`` draws many more. After
the module, the cases drawn and their outcomes by kind are printed per family.
"""

from __future__ import annotations

import collections
import contextlib
import io
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import glaref
import glaref.strategies as gst
from glaref import GlarefError, NonFiniteWarning
from glaref._audit._metrics import underflow_floor
from glaref._inputs import _KIND, ARRAYS, Dims
from glaref.regimes import make_inputs
from glaref.tolerances import tol

NAMED = ARRAYS + ("scale", "layout", "impl", "allow_nonfinite", "cu_seqlens")
FUNCS = ("forward", "vjp", "dlog_alpha_identity", "scales")
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

# bounded in the default suite (seconds), a wide sweep under -m slow; deadline and derandomize
# come from the conftest profile (derandomized on CI)
DEFAULT = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])


# ---------------------------------------------------------------- the oracle family

STRUCTURAL = ("ndim+", "ndim-", "size", "scalar", "float", "list", "none", "int32", "bool",
              "complex", "float16", "float32", "bfloat16", "uint8", "object", "str", "masked",
              "masked_clear", "torch")
VALUES = ("nan", "inf", "-inf", "huge", "grow", "grow_one", "neg_inf_gate", "zeros")


@st.composite
def problems(draw):
    """A drawn call: function, sizes, per-argument mutations, layout, scale, flags. Valid
    choices are drawn more often than invalid ones, so that value-level cases (overflow, NaN,
    empty sizes) are reached past the argument checks."""
    # the base problem: a regime's inputs at a drawn size (glaref.strategies), or sizes with a zero
    if draw(st.sampled_from([True] * 3 + [False])):
        d = draw(gst.dims(max_heads_per_group=2, max_seq=40, max_dk=4, max_dv=4))
        # packed sequences (B = 1, N sequences with cu_seqlens) now and then
        packed = draw(st.sampled_from([None] * 3 + [1, 3]))
        if packed:
            d = Dims(1, d.G, d.H, d.T, d.dk, d.dv)
        base = ("regime", draw(gst.regimes()), d, draw(gst.seeds()), packed)
    else:
        d = dict(B=draw(st.sampled_from([1, 2, 0])), G=draw(st.sampled_from([1, 2, 0])),
                 T=draw(st.sampled_from([0, 1, 5, 33])), dk=draw(st.sampled_from([1, 3, 0])),
                 dv=draw(st.sampled_from([1, 2, 0])))
        d["H"] = d["G"] * draw(st.sampled_from([1, 2, 0]))
        base = ("sizes", Dims(**d), None, draw(gst.seeds()), None)
    kind = st.sampled_from(VALUES * 3 + STRUCTURAL)
    mutations = draw(st.lists(st.tuples(st.sampled_from(ARRAYS), kind), max_size=3))
    scale_kind = draw(st.sampled_from(["plain"] * 10 + ["huge"] * 2 + ["bad"]))
    scale = draw({"plain": st.sampled_from([1.0, 0.5, -2.0, 0.0, 1e-300, 0.125, 3]),
                  "huge": st.floats(-1e308, 1e308, allow_nan=False),
                  "bad": st.sampled_from(["0.5", True, 1 + 2j, 10**400, float("nan"), float("inf"),
                                          np.ones(2), np.float32(0.25), np.array(2.0), None])}[scale_kind])
    return dict(
        func=draw(st.sampled_from(FUNCS)), base=base, mutations=mutations,
        gate=draw(st.sampled_from(["scalar"] * 3 + ["vector"])),
        bad_seqlens=draw(st.sampled_from([None] * 6 + ["reversed", "float", "short", "shifted"])),
        exponent=draw(st.integers(150, 308)),
        grow=draw(st.floats(1.0, 800.0)),
        layout=draw(st.sampled_from(["bhtd"] * 8 + ["bthd"] * 8 + ["swapped", "tbhd", 3])),
        scale=scale,
        allow_nonfinite=draw(st.sampled_from([False] * 8 + [True] * 8 + ["no", 0, None])),
        impl=draw(st.sampled_from(["both"] * 10 + ["cuda"])),
        h0_none=draw(st.booleans()), dh_T_none=draw(st.booleans()),
        # finite inputs whose results overflow float64, the examples and their kin
        blowup=draw(st.sampled_from([None] * 4 + ["gates", "kv", "scale", "cotangents"])),
    )


def _canonical(base, gate):
    """The base problem's canonical float64 arrays (do and dh_T included) and its cu_seqlens."""
    kind, a, b, seed, packed = base
    if kind == "regime":
        cu = glaref.regimes.random_cu_seqlens(b.T, packed, seed) if packed else None
        p = make_inputs(a, b, seed, gate=gate, cu_seqlens=cu)
        return {n: getattr(p, n) for n in ARRAYS}, p.cu_seqlens
    B, G, H, T, dk, dv = a.B, a.G, a.H, a.T, a.dk, a.dv
    rng = np.random.default_rng(seed)
    gates = (B, H, T, dk) if gate == "vector" else (B, H, T)
    return {"q": rng.standard_normal((B, G, T, dk)), "k": rng.standard_normal((B, G, T, dk)),
            "v": rng.standard_normal((B, H, T, dv)), "log_alpha": -rng.random(gates),
            "h0": rng.standard_normal((B, H, dk, dv)), "do": rng.standard_normal((B, H, T, dv)),
            "dh_T": rng.standard_normal((B, H, dk, dv))}, None




def _mutate(a, kind, name, spec, rng):
    """One drawn change of one argument (a float64 array in the call's layout; a value that an
    earlier change already turned into something else is left alone)."""
    if kind == "none":
        return None
    if not isinstance(a, np.ndarray) or a.dtype != np.float64 or isinstance(a, np.ma.MaskedArray):
        return a
    if kind == "ndim+":
        return a[..., None]
    if kind == "ndim-":
        return a[..., 0] if a.shape[-1] else np.zeros(a.shape[:-1])
    if kind == "size":
        return np.concatenate([a, a[..., :1] if a.shape[-1] else np.zeros(a.shape[:-1] + (1,))], -1)
    if kind == "scalar":
        return np.float64(0.5)
    if kind == "float":
        return 0.5
    if kind == "list":
        return a.tolist()
    if kind == "none":
        return None
    if kind in ("int32", "bool", "complex", "float16", "float32", "uint8"):
        with np.errstate(all="ignore"):
            return a.astype({"complex": np.complex128}.get(kind, kind))
    if kind == "bfloat16":
        import ml_dtypes
        return a.astype(ml_dtypes.bfloat16)
    if kind == "object":
        return a.astype(object)
    if kind == "str":
        return a.astype(str)
    if kind in ("masked", "masked_clear"):
        m = np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
        if kind == "masked" and a.size:
            m[np.unravel_index(rng.integers(a.size), a.shape)] = np.ma.masked
        return m
    if kind == "torch":
        try:
            import torch
        except ImportError:
            return a
        return torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16)
    if not (isinstance(a, np.ndarray) and a.dtype == np.float64):
        return a                    # a value change applies to float64 arrays only
    a = a.copy()
    if kind in ("nan", "inf", "-inf") and a.size:
        a[np.unravel_index(rng.integers(a.size), a.shape)] = float(kind)
    elif kind == "huge":
        a = a * 10.0 ** spec["exponent"]
    elif kind == "grow" and name == "log_alpha":
        a[...] = spec["grow"]
    elif kind == "grow_one" and name == "log_alpha" and a.size:
        a[np.unravel_index(rng.integers(a.size), a.shape)] = spec["grow"]
    elif kind == "neg_inf_gate" and name == "log_alpha" and a.size:
        a[np.unravel_index(rng.integers(a.size), a.shape)] = -np.inf
    elif kind == "zeros":
        a[...] = 0.0
    return a


def _mutated(a, kind, name, spec, rng):
    with np.errstate(all="ignore"):         # the drawn overflow is the point (huge, float16)
        return _mutate(a, kind, name, spec, rng)


def _build(spec):
    rng = np.random.default_rng(spec["base"][3])
    can, cu = _canonical(spec["base"], spec["gate"])
    if cu is not None and spec["bad_seqlens"]:
        cu = {"reversed": cu[::-1], "float": cu.astype(float), "short": cu[:-1],
              "shifted": cu + 1}[spec["bad_seqlens"]]
    layout = spec["layout"]
    arrays_in = "bthd" if layout in ("bthd", "swapped") else "bhtd"
    passed = {"swapped": "bhtd"}.get(layout, layout)
    if spec["layout"] == "swapped" and rng.random() < 0.5:
        arrays_in, passed = "bhtd", "bthd"
    args = {}
    for name, a in can.items():
        args[name] = np.swapaxes(a, 1, 2) if arrays_in == "bthd" and _KIND[name] != "state" else a
    if spec["h0_none"]:
        args["h0"] = None
    if spec["dh_T_none"]:
        args["dh_T"] = None
    blow = spec["blowup"]
    big = 10.0 ** spec["exponent"]
    with np.errstate(over="ignore"):
        _blow_up(args, blow, big, spec)
    for name, kind in spec["mutations"]:
        args[name] = _mutated(args[name], kind, name, spec, rng)
    return args, passed, cu


def _blow_up(args, blow, big, spec):
    if blow == "gates":
        args["log_alpha"] = np.full_like(args["log_alpha"], 60.0 + spec["grow"])
    elif blow == "kv":
        args["k"], args["v"] = args["k"] * big, args["v"] * big
    elif blow == "cotangents":
        args["do"] = args["do"] * big
        args["dh_T"] = None if args["dh_T"] is None else args["dh_T"] * big


def _call(func, args, impl, layout, scale, allow_nonfinite, cu):
    kw = dict(scale=scale, layout=layout, impl=impl, allow_nonfinite=allow_nonfinite,
              cu_seqlens=cu)
    a = args
    if func == "forward":
        return glaref.forward(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], **kw)
    if func == "vjp":
        return glaref.vjp(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], a["do"], a["dh_T"], **kw)
    if func == "dlog_alpha_identity":
        return glaref.dlog_alpha_identity(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], a["do"],
                                          a["dh_T"], **kw)
    return glaref.scales(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], a["do"], a["dh_T"], **kw)


def _outputs(func, result) -> dict[str, np.ndarray]:
    if func == "forward":
        return dict(zip(("o", "h_T"), result))
    if func == "vjp":
        return result._asdict()
    if func == "dlog_alpha_identity":
        return {"log_alpha_identity": result}
    return {n: x for n, x in result._asdict().items() if x is not None}


def _contract(call) -> tuple[str, dict[str, np.ndarray] | None]:
    """Run one call and classify it by the contract; any breach raises AssertionError."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = call()
        except GlarefError as exc:
            msg = str(exc)
            assert msg.split(":", 1)[0] in NAMED, f"typed error not naming an argument: {msg!r}"
            assert "\n" not in msg, msg
            return f"typed error ({type(exc).__name__})", None
    return "result", (out, caught)


def _check_result(func, out, caught) -> tuple[str, dict[str, np.ndarray]]:
    arrays = _outputs(func, out)
    for name, x in arrays.items():
        assert type(x) is np.ndarray and x.dtype == np.float64, (name, type(x), getattr(x, "dtype", None))
    said = [w for w in caught if issubclass(w.category, NonFiniteWarning)]
    other = [f"{w.category.__name__}: {w.message}" for w in caught
             if not issubclass(w.category, NonFiniteWarning)]
    assert not other, f"warnings other than NonFiniteWarning: {other}"
    if any(not np.isfinite(x).all() for x in arrays.values()):
        assert len(said) == 1, f"non-finite result with {len(said)} NonFiniteWarning(s)"
        msg = str(said[0].message)
        assert "Likely cause: " in msg or "allow_nonfinite=True" in msg, msg
        return "non-finite result, warned", arrays
    assert not said, [str(w.message) for w in said]
    return "finite result, checked", arrays


def _dims_of(args, layout, cu) -> Dims:
    """Sizes of the problem a call accepted."""
    from glaref import _inputs
    a = args
    return _inputs.canonicalize(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], layout=layout,
                                allow_nonfinite=True, cu_seqlens=cu).dims


def _agree(func, got, ref, args, layout, scale, cu):
    """The Numba results against the NumPy reference, element by element in units of the term
    scale (plus the underflow floor), where both are finite."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        a = args
        do = a["do"] if func != "forward" else None
        dh_T = a["dh_T"] if func != "forward" else None
        sc = glaref.scales(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], do, dh_T, scale=scale,
                           layout=layout, impl="numpy", allow_nonfinite=True,
                           cu_seqlens=cu)._asdict()
    dims = _dims_of(args, layout, cu)
    t = tol("trust_multichunk")
    for name, x in got.items():
        r = ref[name]
        assert x.shape == r.shape, (name, x.shape, r.shape)
        key = {"log_alpha_identity": "log_alpha_identity"}.get(name, name)
        s = np.abs(r) if func == "scales" else sc[key]
        ok = np.isfinite(x) & np.isfinite(r) & np.isfinite(s)
        with np.errstate(all="ignore"):
            bound = t * s + underflow_floor(key, "float64", dims)
            bad = ok & ~(np.abs(x - r) <= bound)
        assert not bad.any(), (f"{func} {name}: numba and numpy differ beyond the term scale at "
                               f"{np.argwhere(bad)[0].tolist()}: {x[bad][0]!r} vs {r[bad][0]!r}")


def _oracle_case(spec) -> str:
    args, layout, cu = _build(spec)
    impls = ("numba", "numpy") if spec["impl"] == "both" else (spec["impl"],)
    if spec["blowup"] == "scale":
        spec = {**spec, "scale": 1e308 * (-1) ** spec["base"][3]}
    kinds, results = [], {}
    for impl in impls:
        kind, payload = _contract(lambda: _call(spec["func"], args, impl, layout, spec["scale"],  # noqa: B023 - called in this iteration
                                                spec["allow_nonfinite"], cu))
        if payload is not None:
            kind, results[impl] = _check_result(spec["func"], *payload)
        kinds.append(kind)
    assert len(set(kinds)) == 1 or all(not k.startswith("typed") for k in kinds), \
        f"the two implementations disagree on refusing: {kinds}"
    if "numba" in results:
        # bit-identical on a second call: nothing read from memory the oracle did not write
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonFiniteWarning)
            again = _outputs(spec["func"], _call(spec["func"], args, "numba", layout, spec["scale"],
                                                 spec["allow_nonfinite"], cu))
        for name, x in results["numba"].items():
            assert np.array_equal(x, again[name], equal_nan=True), f"numba {name} changed between calls"
    if len(results) == 2:
        _agree(spec["func"], results["numba"], results["numpy"], args, layout, spec["scale"], cu)
    # one kind per case: both implementations' outcomes when they differ (e.g. one overflows on
    # the way to a value the other reaches)
    return " | ".join(sorted(set(kinds)))


@settings(max_examples=120, **DEFAULT)
@given(problems())
def test_oracle_contract(spec):
    COUNTS["oracle"][_oracle_case(spec)] += 1


@pytest.mark.slow
@settings(max_examples=3000, **DEFAULT)
@given(problems())
def test_oracle_contract_sweep(spec):
    COUNTS["oracle"][_oracle_case(spec)] += 1


# ---------------------------------------------------------------- kernels of every wrong kind

WRONG = ("shape", "transposed", "int32", "bool", "complex", "none", "three", "nan", "inf",
         "scaled", "raise_value", "raise_memory", "raise_notimplemented", "exit", "python_float")
RIGHT = ("o", "o_h_T", "list")


def _kernel(kind: str, where: int, factor: float, layout: str):
    """A kernel of the drawn kind, built on the correct built-in scan."""
    import jax.numpy as jnp

    from glaref.kernels import scan

    def k(q, k, v, log_alpha, h0, scale):
        o, h_T = scan(q, k, v, log_alpha, h0, scale=scale, layout=layout, return_final_state=True)
        if kind in ("o", "scaled_ok"):
            return o
        if kind == "o_h_T":
            return o, h_T
        if kind == "list":
            return [o, h_T]
        if kind == "shape":
            return o[..., 1:]
        if kind == "transposed":
            return jnp.swapaxes(o, 1, 2)
        if kind in ("int32", "bool"):
            return o.astype(kind)
        if kind == "complex":
            return o + 1e3j
        if kind == "none":
            return None
        if kind == "three":
            return o, h_T, o
        if kind in ("nan", "inf"):
            flat = o.reshape(-1)
            return flat.at[where % flat.size].set(float(kind)).reshape(o.shape)
        if kind == "scaled":
            return o * factor
        if kind == "raise_value":
            raise ValueError("unsupported")
        if kind == "raise_memory":
            raise MemoryError("out of memory")
        if kind == "raise_notimplemented":
            raise NotImplementedError("no backward")
        if kind == "exit":
            import sys
            sys.exit(3)
        if kind == "python_float":
            return 1.0
        raise AssertionError(kind)

    k.__name__ = f"kernel_{kind}"
    return k


@st.composite
def kernel_cases(draw):
    return dict(kind=draw(st.sampled_from(WRONG + RIGHT)), T=draw(st.integers(1, 9)),
                where=draw(st.integers(0, 10**6)),
                # a relative error of 1e-3 .. 1: far beyond float32 rounding of these sums
                factor=1 + draw(st.sampled_from([-1, 1])) * 10 ** draw(st.floats(-3, 0)),
                mode=draw(st.sampled_from(["fwd", "fwd_bwd"])),
                layout=draw(st.sampled_from(["bhtd", "bthd"])))


def _kernel_case(case) -> str:
    pytest.importorskip("jax")
    from glaref._errors import AuditEnvironmentError, AuditUsageError
    from glaref.testing import check_kernel

    fn = _kernel(case["kind"], case["where"], case["factor"], case["layout"])
    try:
        recs = check_kernel(fn, configs="1,1,2,4,4", seqs=[case["T"]], modes=[case["mode"]],
                            layout=case["layout"], chunk_size=1, regimes="standard")
    except AssertionError as exc:
        assert case["kind"] in WRONG, f"a correct kernel ({case['kind']}) failed: {exc}"
        headline = ("kernel raised" if case["kind"].startswith("raise") or case["kind"] == "exit"
                    else "kernel disagrees with the glaref oracle")
        assert f"{headline} on 1 of 1 rows" in str(exc), str(exc)
        return "kernel failed with its figures"
    except (AuditUsageError, AuditEnvironmentError) as exc:   # pragma: no cover - not expected here
        raise AssertionError(f"usage/environment error for a valid call: {exc}") from exc
    assert case["kind"] in RIGHT, f"a wrong kernel ({case['kind']}) passed: {recs}"
    assert all(r["ok"] is True for r in recs)
    return "correct kernel passed"


@settings(max_examples=12, **DEFAULT)
@given(kernel_cases())
def test_kernel_contract(case):
    COUNTS["check_kernel"][_kernel_case(case)] += 1


@pytest.mark.slow
@settings(max_examples=150, **DEFAULT)
@given(kernel_cases())
def test_kernel_contract_sweep(case):
    COUNTS["check_kernel"][_kernel_case(case)] += 1


# ---------------------------------------------------------------- CLI flags

def _flag_values(tmp):
    from pathlib import Path
    kernels = Path(__file__).resolve().parent / "audit_kernels.py"
    return {
        "--seed": ["0", "3", "-1", "x", "1.5", ""],
        "--seq": ["5", "0", "-3", "2.5", "x", "5,7", "1000000000000", "1" + "0" * 30, ""],
        "--config": ["1,1,2,4,4", "1,2,3,4,x", "1,2,3", "nope", "0,1,1,1,1", "1,2,4,4,4",
                     "100000000000,1,1,8,8", "g1h2_dk16_dv48,nope"],
        "--chunk-size": ["0", "1", "x", "-2", "16"],
        "--mode": ["fwd", "fwd_bwd", "bwd", "fwd,fwd_bwd", ""],
        "--dtype": ["float32", "int8", "float64", "bfloat16"],
        "--layout": ["bhtd", "bthd", "tbhd"],
        "--scale": ["1", "x", "1e400", "nan", "0.5", "1e308"],
        "--json": [str(tmp), "/proc/version", str(tmp / "r.json"), str(tmp / "a" / "b" / "r.json")],
        "--plot": [str(tmp), "r.txt", "noext", str(tmp / "p.png")],
        "--impl": [f"{kernels}:scan_kernel", "chunked", "nope", f"{kernels}:not_a_kernel",
                   f"{kernels}:exiting_kernel", f"{kernels}:complex_kernel", "missing.py:f",
                   f"{kernels}:wrong_kernel", f"{kernels}:memory_error_kernel"],
        "--repeats": ["0", "1", "-1", "x"],
        "--preset": ["quick", "nope"],
        "--regime": ["standard", "nope", "zero_inputs", ""],
        "--oracle": ["numpy", "numba", "nope"],
        "--precision": ["default", "x"],
        "--accumulate-dtype": ["float32", "int8"],
        "--backend": ["cpu", "tpu"],
        "--no-such-flag": [None],
        "--exit-zero": [None],
    }


FLAG_NAMES = ("--seed", "--seq", "--config", "--chunk-size", "--mode", "--dtype", "--layout",
              "--scale", "--json", "--plot", "--impl", "--repeats", "--preset", "--regime",
              "--oracle", "--precision", "--accumulate-dtype", "--backend", "--no-such-flag",
              "--exit-zero")


@st.composite
def cli_cases(draw):
    flags = draw(st.lists(st.sampled_from(FLAG_NAMES), max_size=4, unique=True))
    return [(f, draw(st.integers(0, 50))) for f in flags]


def _cli_case(drawn, tmp) -> str:
    pytest.importorskip("jax")
    from glaref.cli import main

    values = _flag_values(tmp)
    argv = ["audit"]
    for flag, i in drawn:
        pool = values[flag]
        v = pool[i % len(pool)]
        argv += [flag] if v is None else [flag, v]
    # keep a valid run small: a tiny config, one length, the NumPy oracle, no timing
    given_flags = {f for f, _ in drawn}
    for flag, v in (("--config", "1,1,2,4,4"), ("--seq", "5"), ("--oracle", "numpy"),
                    ("--repeats", "0"), ("--mode", "fwd"), ("--impl", values["--impl"][0])):
        if flag not in given_flags:
            argv += [flag, v]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code = main(argv + ["--no-progress"])
        except BaseException as exc:  # a traceback on the command line
            raise AssertionError(f"glaref {' '.join(argv)}: {type(exc).__name__}: {exc}") from exc
    out, err = out.getvalue(), err.getvalue()
    assert code in (0, 1, 2, 3), (argv, code)
    if code == 2 or (code == 3 and not out):
        last = err.strip().splitlines()[-1]
        assert last.startswith(("glaref audit: error: ", "glaref: error: ")), (argv, err)
        assert "Traceback" not in err and out == "", (argv, out, err)
    else:
        last = out.strip().splitlines()[-1]
        assert last.startswith(("OK: ", "FAIL: ", "INCOMPLETE: ", "plot written",
                                "report written")), (argv, out)
    return f"exit {code}"


@settings(max_examples=25, **DEFAULT)
@given(cli_cases())
def test_cli_contract(tmp_path_factory, drawn):
    COUNTS["cli"][_cli_case(drawn, tmp_path_factory.mktemp("cli"))] += 1


@pytest.mark.slow
@settings(max_examples=300, **DEFAULT)
@given(cli_cases())
def test_cli_contract_sweep(tmp_path_factory, drawn):
    COUNTS["cli"][_cli_case(drawn, tmp_path_factory.mktemp("cli"))] += 1


# ---------------------------------------------------------------- the counts

@pytest.fixture(scope="module", autouse=True)
def outcome_counts(request):
    """After this module: the cases drawn and their outcomes by kind, per family, on the
    terminal (whichever of the bounded tests and the -m slow sweeps ran)."""
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print()
        for family, counter in COUNTS.items():
            print(f"contract {family}: {sum(counter.values())} cases: "
                  + "; ".join(f"{k}: {n}" for k, n in counter.most_common()))
