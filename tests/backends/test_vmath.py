"""Accuracy and special values of the vectorisable transcendental functions (vmath).

Errors are measured in ulps of the result type against NumPy evaluated in long double (for
float64 results) or float64 (for float32 results), on random bit patterns (every exponent) and
on uniform samples of the ranges where each function is interesting.  The bounds asserted
here are the ones documented in ``tapegrad/backends/cpu/vmath/``.
"""

from __future__ import annotations

import math
import re

import numba
import numpy as np
import pytest

from tapegrad.backends.cpu import vmath
from tapegrad.backends.cpu.vmath import trig

NAMES = ["exp", "expm1", "log", "log1p", "sin", "cos", "tanh", "sinh", "cosh", "atan"]

# max error in ulps asserted per function (same bound for float32 and float64)
BOUND = {"exp": 1.0, "expm1": 1.5, "log": 1.0, "log1p": 1.0, "sin": 1.0, "cos": 1.0,
         "tanh": 2.0, "sinh": 2.0, "cosh": 1.5, "atan": 1.0}

REF = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "sin": np.sin,
       "cos": np.cos, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh, "atan": np.arctan}

RANGES = {
    "exp": [(-746.0, 710.0), (-1.0, 1.0), (-104.0, 89.0)],
    "expm1": [(-50.0, 710.0), (-1.0, 1.0), (-1e-5, 1e-5)],
    "log": [(0.0, 10.0), (0.5, 2.0), (1e-300, 1e-290)],
    "log1p": [(-1.0, 1.0), (-1e-5, 1e-5), (0.0, 1e6)],
    "sin": [(-10.0, 10.0), (-1e6, 1e6), (-1e22, 1e22)],
    "cos": [(-10.0, 10.0), (-1e6, 1e6), (-1e22, 1e22)],
    "tanh": [(-20.0, 20.0), (-1.0, 1.0), (-1e-3, 1e-3)],
    "sinh": [(-710.0, 710.0), (-2.0, 2.0), (-90.0, 90.0)],
    "cosh": [(-711.0, 711.0), (-2.0, 2.0), (-90.0, 90.0)],
    "atan": [(-3.0, 3.0), (-100.0, 100.0), (-1e-3, 1e-3)],
}

LONG_DOUBLE = np.finfo(np.longdouble).nmant >= 63

_LOOPS: dict[str, object] = {}


def _loop(name):
    """One compiled loop per function (plain, not parallel: also used to inspect the IR)."""
    if name not in _LOOPS:
        f = getattr(vmath, name)

        @numba.njit
        def loop(A, B):
            for i in range(A.shape[0]):
                B[i] = f(A[i])

        _LOOPS[name] = loop
    return _LOOPS[name]


def _apply(name, x):
    out = np.empty_like(x)
    _loop(name)(x, out)
    return out


def _ulp_errors(y, ref, dt):
    """|y - ref| in ulps of ``dt`` at ``ref`` (ref in a wider type); inf where a special value
    (nan, inf, overflow, the sign of a zero) is wrong."""
    nbits, emin = (53, -1074) if dt == np.float64 else (24, -149)
    with np.errstate(all="ignore"):
        yw = y.astype(ref.dtype)
        rounded = ref.astype(dt)          # inf where the true result overflows
    err = np.zeros(y.shape)
    special = np.isnan(yw) | np.isnan(ref) | np.isinf(yw) | np.isinf(rounded)
    same = (np.isnan(yw) & np.isnan(ref)) | (yw == rounded.astype(ref.dtype))
    err[special] = np.where(same[special], 0.0, np.inf)
    ok = ~special
    _, e = np.frexp(ref[ok])
    ulp = np.ldexp(np.ones(int(ok.sum()), dtype=ref.dtype), np.maximum(e - nbits, emin))
    err[ok] = (np.abs(yw[ok] - ref[ok]) / ulp).astype(np.float64)
    zero = ok & (rounded == 0) & (y == 0) & (np.signbit(y) != np.signbit(ref))
    err[zero] = np.inf
    return err


def _inputs(name, dt, n, seed):
    rng = np.random.default_rng(seed)
    if dt == np.float64:
        bits = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64).view(np.float64)
    else:
        bits = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int32).view(np.float32)
    parts = [bits]
    for lo, hi in RANGES[name]:
        parts.append(rng.uniform(lo, hi, n // 4).astype(dt))
    return np.concatenate(parts)


@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_accuracy(name, dt):
    if dt == np.float64 and not LONG_DOUBLE:
        pytest.skip("needs an extended-precision long double for the float64 reference")
    x = _inputs(name, dt, 1 << 17, seed=NAMES.index(name))
    y = _apply(name, x)
    assert y.dtype == dt
    with np.errstate(all="ignore"):
        ref = REF[name](x.astype(np.longdouble if dt == np.float64 else np.float64))
    err = _ulp_errors(y, ref, dt)
    i = int(np.argmax(err))
    assert err[i] <= BOUND[name], f"{name}({x[i]!r}) = {y[i]!r}: {err[i]:.3f} ulp"


INF, NAN = math.inf, math.nan
# (function, argument, exact expected result) for both float types; None = type-dependent
SPECIAL = {
    "exp": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (1000.0, INF),
            (-1000.0, 0.0)],
    "expm1": [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -1.0), (NAN, NAN), (1000.0, INF),
              (-1000.0, -1.0)],
    "log": [(0.0, -INF), (-0.0, -INF), (INF, INF), (-INF, NAN), (NAN, NAN), (-1.0, NAN),
            (1.0, 0.0)],
    "log1p": [(0.0, 0.0), (-0.0, -0.0), (-1.0, -INF), (-2.0, NAN), (INF, INF), (-INF, NAN),
              (NAN, NAN)],
    "sin": [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN)],
    "cos": [(0.0, 1.0), (-0.0, 1.0), (INF, NAN), (-INF, NAN), (NAN, NAN)],
    "tanh": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (1000.0, 1.0),
             (-1000.0, -1.0)],
    "sinh": [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN), (1000.0, INF),
             (-1000.0, -INF)],
    "cosh": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, INF), (NAN, NAN), (1000.0, INF),
             (-1000.0, INF)],
    "atan": [(0.0, 0.0), (-0.0, -0.0), (INF, math.pi / 2), (-INF, -math.pi / 2), (NAN, NAN),
             (1e300, math.pi / 2), (-1e300, -math.pi / 2)],
}


def _same(a, b):
    if math.isnan(b):
        return math.isnan(a)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["float32", "float64"])
def test_special_values(dt):
    tiny = np.finfo(dt).smallest_subnormal
    bad = []
    for name, cases in SPECIAL.items():
        cases = list(cases)
        # odd functions that are ~x near 0 return subnormal arguments unchanged
        if name in ("expm1", "log1p", "sin", "tanh", "sinh", "atan"):
            cases += [(float(tiny), float(tiny)), (-float(tiny), -float(tiny))]
        if name in ("exp", "cos", "cosh"):
            cases += [(float(tiny), 1.0), (-float(tiny), 1.0)]
        with np.errstate(over="ignore"):
            x = np.array([c[0] for c in cases], dtype=dt)
        y = _apply(name, x)
        for xi, yi, (_, want) in zip(x, y, cases):
            want = float(dt(want))
            if not _same(float(yi), want):
                bad.append(f"{name}({xi!r}) = {yi!r}, want {want!r}")
    assert not bad, bad


def test_overflow_and_underflow_thresholds():
    # results next to the largest finite value and in the subnormal range are right too
    for dt in (np.float32, np.float64):
        if dt == np.float64 and not LONG_DOUBLE:
            continue
        fi = np.finfo(dt)
        top = math.log(float(fi.max))
        low = math.log(float(fi.smallest_subnormal))
        x = np.concatenate([np.linspace(top - 1.0, top + 1.0, 2001),
                            np.linspace(low - 2.0, low + 40.0, 4001)]).astype(dt)
        wide = np.longdouble if dt == np.float64 else np.float64
        for name, ref in (("exp", np.exp), ("expm1", np.expm1)):
            with np.errstate(all="ignore"):
                err = _ulp_errors(_apply(name, x), ref(x.astype(wide)), dt)
            assert err.max() <= BOUND[name], (name, dt, x[int(np.argmax(err))])
        xs = np.concatenate([x, -x])
        for name, ref in (("sinh", np.sinh), ("cosh", np.cosh)):
            with np.errstate(all="ignore"):
                err = _ulp_errors(_apply(name, xs), ref(xs.astype(wide)), dt)
            assert err.max() <= BOUND[name], (name, dt, xs[int(np.argmax(err))])


# x, sin(x) as hi + lo, cos(x) as hi + lo (computed with mpmath at 1400 bits); arguments next
# to multiples of pi/2 and the hardest known one, 6381956970095103 * 2**797
HARD64 = [
    ("0x1.6ac5b262ca1ffp+849", "0x1.0000000000000p+0", "-0x1.2b089ea1e692bp-123",
     "-0x1.14ae72e6ba22fp-61", "0x1.73eef1477d90ep-118"),
    ("0x1.6ac5b262ca1ffp+849", "0x1.0000000000000p+0", "-0x1.2b089ea1e692bp-123",
     "-0x1.14ae72e6ba22fp-61", "0x1.73eef1477d90ep-118"),
    ("0x1.0f0cf064dd592p+73", "-0x1.b453ab76bf397p-1", "-0x1.f453790772648p-58",
     "0x1.0be2cef01c8f4p-1", "-0x1.b2d1bc8018c4fp-55"),
    ("0x1.fffffffffffffp+1023", "0x1.452fc98b34e97p-8", "-0x1.27bb193d960dfp-62",
     "-0x1.fffe62ecfab75p-1", "-0x1.e038d934070f1p-56"),
    ("0x1.921fb54442d18p+0", "0x1.0000000000000p+0", "-0x1.377ce858a5d48p-109",
     "0x1.1a62633145c07p-54", "-0x1.f1976b7ed8fbcp-110"),
    ("0x1.921fb54442d18p+1", "0x1.1a62633145c07p-53", "-0x1.f1976b7ed8fbdp-109",
     "-0x1.0000000000000p+0", "0x1.377ce858a5d48p-107"),
    ("0x1.2d97c7f3321d2p+2", "-0x1.0000000000000p+0", "0x1.5e6c8563ba8f1p-106",
     "-0x1.a79394c9e8a0ap-53", "-0x1.456737b06ea19p-107"),
    ("0x1.921fb54442d18p+2", "-0x1.1a62633145c07p-52", "0x1.f1976b7ed8fbfp-108",
     "0x1.0000000000000p+0", "-0x1.377ce858a5d48p-105"),
    ("0x1.6300000000000p+8", "-0x1.f9bd0307d1de3p-16", "0x1.894874d2528d2p-70",
     "-0x1.fffffffc18e4cp-1", "0x1.862265016699cp-57"),
    ("0x1.9639000000000p+16", "-0x1.40efdf1eb8de7p-16", "0x1.f636eaa54141cp-70",
     "0x1.fffffffe6da77p-1", "0x1.7035e9b2fcdecp-57"),
    ("0x1.7e43c8800759cp+996", "-0x1.a2c16b010e385p-1", "-0x1.b900a1f54ecd2p-55",
     "-0x1.2699022adc4c1p-1", "0x1.edd5594b5c574p-56"),
    ("0x1.921fb54442d18p-1", "0x1.6a09e667f3bccp-1", "0x1.7a7fb8d4bd43fp-55",
     "0x1.6a09e667f3bcdp-1", "-0x1.ec4c7696139d5p-56"),
    ("0x1.921fb54442d19p-1", "0x1.6a09e667f3bcdp-1", "0x1.3a4e169292f60p-57",
     "0x1.6a09e667f3bccp-1", "0x1.ae2fbf2875bdep-58"),
    ("0x1.2d97c7f3321d2p+1", "0x1.6a09e667f3bcdp-1", "0x1.3267a12a5e3d6p-56",
     "-0x1.6a09e667f3bccp-1", "0x1.4da530b7ba971p-59"),
    ("0x1.921fb54442d18p+0", "0x1.0000000000000p+0", "-0x1.377ce858a5d48p-109",
     "0x1.1a62633145c07p-54", "-0x1.f1976b7ed8fbcp-110"),
    ("0x1.921fb54442d18p+1", "0x1.1a62633145c07p-53", "-0x1.f1976b7ed8fbdp-109",
     "-0x1.0000000000000p+0", "0x1.377ce858a5d48p-107"),
    ("0x1.2d97c7f3321d2p+2", "-0x1.0000000000000p+0", "0x1.5e6c8563ba8f1p-106",
     "-0x1.a79394c9e8a0ap-53", "-0x1.456737b06ea19p-107"),
    ("0x1.921fb54442d18p+2", "-0x1.1a62633145c07p-52", "0x1.f1976b7ed8fbfp-108",
     "0x1.0000000000000p+0", "-0x1.377ce858a5d48p-105"),
    ("0x1.f6a7a2955385ep+2", "0x1.0000000000000p+0", "-0x1.e6b32b0a831c0p-105",
     "0x1.60fafbfd97309p-52", "-0x1.9b7f5197a3cecp-106"),
    ("0x1.5fdbbe9bba775p+3", "-0x1.0000000000000p+0", "0x1.dcf743c7bded6p-104",
     "-0x1.ee2c2d963a10cp-52", "-0x1.326e07c4088c9p-109"),
    ("0x1.1475cc9eedf01p+4", "-0x1.0000000000000p+0", "0x1.8aab790a66904p-101",
     "0x1.3ddc5bce200bbp-50", "0x1.15860679cd4a0p-104"),
    ("0x1.3a28c59d5433bp+7", "0x1.1b19140c0c0d5p-50", "0x1.2f92fec6610dap-109",
     "0x1.0000000000000p+0", "-0x1.391074c78e91bp-101"),
    ("0x1.88b2f704a940ap+10", "0x1.2c3beb21e1e21p-44", "0x1.217b77be66c4ap-98",
     "0x1.0000000000000p+0", "-0x1.601c7d1da2ff3p-89"),
    ("0x1.4022ba40fde9fp+17", "0x1.d9f0c02c1c0a4p-37", "0x1.f880cd99cdf68p-91",
     "0x1.0000000000000p+0", "-0x1.b6b5c445f14a6p-74"),
    ("0x1.7d28c6654f7e8p+60", "0x1.bf0bce210e882p-1", "-0x1.7f9fb79680139p-55",
     "0x1.f32ca5e10d0f1p-2", "-0x1.fb344b9dbe480p-56"),
    ("0x1.3d89304a03353p+59", "-0x1.0768f1a9aae1bp-1", "-0x1.9a81c471ec600p-56",
     "0x1.b70b238ee3eb3p-1", "-0x1.378f09e82ccb2p-55"),
    ("0x1.36ac8b92873b8p+56", "-0x1.f2669f7974205p-4", "0x1.9a16613612bc6p-60",
     "-0x1.fc320e3c7cdefp-1", "-0x1.683f45d33c1b0p-56"),
    ("0x1.4a410544ae4aep+60", "-0x1.c5cfa338af0e9p-1", "-0x1.aa96efa45572ap-57",
     "0x1.da20f0beedd8bp-2", "-0x1.1cb5666ed95e3p-61"),
    ("0x1.2ed0c455d62ffp+57", "0x1.9b98d0de1bbedp-1", "-0x1.dd780c6f16a1cp-56",
     "0x1.3084ec40b0d80p-1", "0x1.626a469ebb691p-56"),
    ("0x1.d4b4b7b836a7cp+59", "0x1.71b02b55dd2d7p-3", "0x1.0597dadb8386ep-58",
     "0x1.f796db48b5598p-1", "0x1.a38f3652df9bdp-55"),
    ("0x1.6dd04f3d0eaaap+60", "-0x1.c2e642f0447bdp-1", "-0x1.3f57b5abbee22p-57",
     "-0x1.e51cf395d05adp-2", "-0x1.854fee0685049p-56"),
    ("0x1.59574eddb0967p+58", "-0x1.12e1dc4aa4e07p-1", "0x1.fbb3267781e18p-55",
     "-0x1.aff411f59b466p-1", "0x1.561e63248c029p-55"),
    ("0x1.7cccaeeee72e1p+296", "-0x1.5128e0f39632fp-2", "0x1.5f39786993445p-57",
     "0x1.e373728c663d7p-1", "-0x1.5e60032db40fep-55"),
    ("0x1.8ee66ed0b8b8bp+296", "0x1.2982b69a9e6edp-4", "-0x1.3eeac1b9fc35ep-58",
     "-0x1.fea5ca6452424p-1", "0x1.25cd0ec3144cbp-55"),
    ("0x1.acb75b69c4605p+297", "0x1.fe90c7f3a952ep-2", "-0x1.0feb745758779p-57",
     "0x1.bbd17daae6011p-1", "0x1.8e648ff9ddae2p-55"),
    ("0x1.124841fb88ecap+300", "0x1.da60fd47433d6p-1", "-0x1.acc346ea0223ap-56",
     "0x1.8145b7a2f6caep-2", "-0x1.094c7e6335401p-58"),
    ("0x1.1e54d6f961fbbp+300", "-0x1.c75660d80d899p-1", "0x1.53d6d943b15d2p-59",
     "-0x1.d43d128e9485ep-2", "-0x1.6debcc5a3d2a8p-57"),
    ("0x1.3888430bbc2f7p+300", "-0x1.a48536a239385p-1", "-0x1.07dfd82e15a3dp-55",
     "0x1.2412ae7ce1fd0p-1", "-0x1.aa4349711c6ffp-55"),
    ("0x1.2156a660b5993p+298", "0x1.167e99e151036p-2", "0x1.43cf2150cab81p-56",
     "-0x1.ecb36f9dc4b88p-1", "0x1.83b7962b4bf3dp-57"),
    ("0x1.143d41ee5fb63p+299", "0x1.c35b57e1e593fp-1", "-0x1.e4de05499aba5p-55",
     "-0x1.e368aabb497b9p-2", "-0x1.d32089b8d4217p-57"),
]
# float32 x, sin(x), cos(x) (float64 values of the exact results)
HARD32 = [
    ("0x1.fffffe0000000p+127", "-0x1.0b33665089575p-1", "0x1.b4bf2c79bdfcep-1"),
    ("0x1.f37c8a0000000p+95", "0x1.0000000000000p+0", "-0x1.bbdd52a58eafbp-30"),
    ("0x1.921fb60000000p+0", "0x1.ffffffffffff7p-1", "-0x1.777a5cf72ceccp-25"),
    ("0x1.921fb60000000p+1", "-0x1.777a5cf72cec6p-24", "-0x1.fffffffffffdep-1"),
    ("0x1.2d97c80000000p+2", "-0x1.fffffffffffffp-1", "0x1.99bc5b961b1adp-27"),
    ("0x1.921fb60000000p+2", "0x1.777a5cf72ceadp-23", "0x1.fffffffffff76p-1"),
    ("0x1.f6a7a20000000p+2", "0x1.fffffffffffa9p-1", "0x1.2aa70bcb07d6dp-23"),
    ("0x1.5fdbbe0000000p+3", "-0x1.ffffffffffe85p-1", "-0x1.3774eea7b8abfp-22"),
    ("0x1.1475cc0000000p+4", "-0x1.ffffffffff9d5p-1", "-0x1.3ddbe0161108bp-21"),
    ("0x1.3a28c60000000p+7", "0x1.8aaf314233c0cp-19", "0x1.fffffffff67e0p-1"),
    ("0x1.88b2f80000000p+10", "0x1.f6ad7ec455c49p-15", "0x1.fffffff093cc7p-1"),
    ("0x1.be1b2e0000000p+6", "-0x1.fffffffff2d41p-1", "0x1.d08bbf2231db0p-19"),
    ("0x1.393a020000000p+13", "0x1.fffffd845177bp-1", "0x1.9367575f24448p-12"),
    ("0x1.686ee60000000p+39", "0x1.694545b98dd80p-2", "-0x1.df13be4c36a34p-1"),
    ("0x1.e7d9f80000000p+39", "-0x1.b1a39b26c4bdcp-1", "0x1.10371ab28de87p-1"),
    ("0x1.dd061a0000000p+36", "-0x1.dd6aa4de6b8abp-1", "0x1.71f57f68a2f5dp-2"),
    ("0x1.9beb680000000p+39", "0x1.09f6163cb9bbep-1", "-0x1.b580aff405d26p-1"),
    ("0x1.0a855c0000000p+38", "0x1.5499e3b9f79e2p-2", "0x1.e2d8f66103753p-1"),
    ("0x1.13b27a0000000p+39", "0x1.c96ad804af823p-1", "0x1.cc0ede8a74f25p-2"),
    ("0x1.5326620000000p+119", "-0x1.e983b41880868p-2", "0x1.c1b56c0a5147fp-1"),
    ("0x1.f368a60000000p+116", "0x1.fbfc8c6e6c8a6p-1", "0x1.ffdb288a26b68p-4"),
    ("0x1.3d50480000000p+120", "0x1.f4d6a01eae6dap-4", "0x1.fc287841a81eep-1"),
    ("0x1.118aea0000000p+119", "0x1.884c029d169c4p-1", "0x1.49026296d416ap-1"),
    ("0x1.8f73180000000p+119", "0x1.ed527f1096c0ap-2", "-0x1.c0aad002573a2p-1"),
    ("0x1.ba6b5e0000000p+116", "0x1.877a16e997208p-2", "-0x1.d91b73d2ad366p-1"),
]


def test_sin_cos_hard_arguments():
    x = np.array([float.fromhex(r[0]) for r in HARD64])
    for name, col in (("sin", 1), ("cos", 3)):
        y = _apply(name, x)
        for xi, yi, r in zip(x, y, HARD64):
            ref = float.fromhex(r[col])
            lo = float.fromhex(r[col + 1])
            err = abs((float(yi) - ref) - lo) / math.ulp(ref)
            assert err <= 1.0, f"{name}({xi!r}) = {yi!r}: {err:.3f} ulp"
    x = np.array([float.fromhex(r[0]) for r in HARD32], dtype=np.float32)
    for name, col in (("sin", 1), ("cos", 2)):
        y = _apply(name, x)
        want = np.array([float.fromhex(r[col]) for r in HARD32]).astype(np.float32)
        assert np.array_equal(y, want), (name, x[y != want], y[y != want], want[y != want])


def test_two_over_pi_bits():
    # the Payne-Hanek table comes from pi by Machin's formula; check its first 256 bits
    assert trig._TOP >> (trig._TWO_OVER_PI_BITS - 256) == int(
        "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561", 16)


def test_scalar_call_from_python():
    assert vmath.exp(1) == pytest.approx(math.e, rel=1e-15)          # integers: float64


def _loop_ir(name, dt):
    loop = _loop(name)
    x = np.linspace(0.5, 1.5, 64).astype(dt)
    loop(x, np.empty_like(x))
    sig = [s for s in loop.signatures if s[0].dtype == numba.from_dtype(np.dtype(dt))][0]
    return loop.inspect_llvm(sig)


@pytest.mark.parametrize("name", NAMES)
def test_loops_vectorise(name):
    """The loop compiles to vector code with no calls other than the refcounts around it."""
    for dt, width in ((np.float32, "float"), (np.float64, "double")):
        ir = _loop_ir(name, dt)
        body = ir[ir.index("define"):]
        body = body[:body.index("\n}\n")]
        calls = re.findall(r"call [^@]*@([\w.$]+)", body)
        calls = [c for c in calls if not c.startswith(("NRT_", "llvm."))]
        assert not calls, (name, dt, calls)
        assert re.search(r"<(4|8|16) x (float|double)>", body), (name, dt)
        if name not in ("sin", "cos"):       # these reduce float32 arguments in float64
            assert "double" not in body or width == "double", (name, "float32 code uses double")


# a function and its derivative of one argument, as a tangent computes them (expm1' = exp,
# sinh' = cosh, cosh' = sinh): what they share is computed once
PAIRS = [("expm1", "exp"), ("sinh", "cosh"), ("cosh", "sinh")]


def _polynomial_steps(dt, *functions):
    """The multiply-adds (polynomial steps) in a function returning the sum of ``functions``
    of its argument, once LLVM has optimised it."""
    f, g = (*functions, None)[:2]
    if g is None:
        def one(x):
            return f(x)
    else:
        def one(x):
            return f(x) + g(x)

    compiled = numba.njit(one)
    compiled(dt(0.5))
    return len(re.findall(r"call \w+ @llvm\.fmuladd", compiled.inspect_llvm(compiled.signatures[0])))


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_a_function_and_its_derivative_share_their_work(pair):
    """The derivative adds no polynomial step of its own (cosh' adds sinh's near 0 only)."""
    f, g = (getattr(vmath, name) for name in pair)
    for dt in (np.float32, np.float64):
        extra = 0
        if pair == ("cosh", "sinh"):
            extra = _polynomial_steps(dt, vmath.sinh) - _polynomial_steps(dt, vmath.cosh)
        alone = _polynomial_steps(dt, f)
        assert alone > 0 and extra >= 0
        assert _polynomial_steps(dt, f, g) == alone + extra, (pair, dt)


# -- pow (float32) -----------------------------------------------------------------------------

@numba.njit
def _pow_loop(X, Y, Z):
    for i in range(X.shape[0]):
        Z[i] = vmath.pow(X[i], Y[i])


def _f32_ulps(got, ref):
    """|got - ref| in float32 ulps of ref (ref in float64), for finite refs."""
    r32 = np.abs(ref.astype(np.float32))
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.where(np.isfinite(r32), r32, np.finfo(np.float32).max)).astype(np.float64)
    return np.abs(got.astype(np.float64) - ref) / ulp


def test_float32_pow_is_rounded_once():
    """Random bit patterns for the base, exponents from small integers to large fractions;
    against float64 pow (whose error is far below a float32 ulp): at most half an ulp and a
    hair, where libm's powf and NumPy's float32 power allow up to one."""
    rng = np.random.default_rng(5)
    n = 1 << 18
    x = np.concatenate([rng.integers(0, 2 ** 31 - 2 ** 23, n // 2, dtype=np.uint32).view(np.float32),
                        rng.uniform(0, 4, n // 2).astype(np.float32)])
    x = np.where(rng.random(n) < 0.25, -x, x)
    y = np.concatenate([rng.integers(-40, 40, n // 4).astype(np.float32),
                        rng.uniform(-3, 3, n // 4).astype(np.float32),
                        rng.uniform(-300, 300, n // 4).astype(np.float32),
                        rng.standard_normal(n // 4).astype(np.float32) * 1e-3])
    z = np.empty_like(x)
    _pow_loop(x, y, z)
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), y.astype(np.float64))
    finite = np.isfinite(ref) & (np.abs(ref) <= np.finfo(np.float32).max)
    err = _f32_ulps(z[finite], ref[finite])
    i = int(np.argmax(err))
    assert err[i] <= 0.501, f"pow({x[finite][i]!r}, {y[finite][i]!r}) = {z[finite][i]!r}"
    # where the result is nan or beyond float32, it is that too
    with np.errstate(all="ignore"):
        want = ref[~finite].astype(np.float32)
    np.testing.assert_array_equal(z[~finite], want)
    assert np.isnan(ref).sum() > 1000 and (np.abs(ref) > 3.5e38).sum() > 1000   # both seen


def _c_pow():
    """The C library's pow (C99 Annex F): Python's math.pow raises at pow(0, -1), and
    NumPy's power gives nan at pow(-inf, 0.5)."""
    import ctypes
    import ctypes.util
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.pow.restype = ctypes.c_double
    libm.pow.argtypes = [ctypes.c_double, ctypes.c_double]
    return libm.pow


def test_float32_pow_special_values_follow_c99():
    """Every pair of special and ordinary values, against the C library's pow (C99 Annex F,
    which CUDA's powf follows too)."""
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, INF, -INF, NAN,
              1e-45, -1e-45, 3.4e38, 1.0 / 3.0, 1e10, -1e10, 2.0 ** 24 + 2.0]
    x = np.array([a for a in values for _ in values], np.float32)
    y = np.array([b for _ in values for b in values], np.float32)
    z = np.empty_like(x)
    _pow_loop(x, y, z)
    c_pow = _c_pow()
    bad = []
    with np.errstate(over="ignore"):
        for a, b, got in zip(x, y, z):
            want = float(np.float32(c_pow(float(a), float(b))))
            if not _same(float(got), want):
                bad.append(f"pow({a!r}, {b!r}) = {got!r}, want {want!r}")
    assert not bad, bad


def test_float32_pow_loop_vectorises():
    x = np.linspace(0.5, 1.5, 64).astype(np.float32)
    _pow_loop(x, x, np.empty_like(x))
    ir = _pow_loop.inspect_llvm(_pow_loop.signatures[0])
    body = ir[ir.index("define"):]
    body = body[:body.index("\n}\n")]
    calls = [c for c in re.findall(r"call [^@]*@([\w.$]+)", body)
             if not c.startswith(("NRT_", "llvm."))]
    assert not calls, calls
    assert re.search(r"<(4|8|16) x (float|double)>", body)
