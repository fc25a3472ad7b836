"""atan: reduced around c in {0, 1/2, 1, 3/2, inf} (see the package's docstring)."""

from __future__ import annotations

from tapegrad.backends.cpu.vmath.bits import (
    _F,
    _ONE_F,
    _TWO_F,
    _ZERO_F,
    _div,
    _h,
    _mad,
    _sel,
    _sign_of64,
    _xorsign32,
    _xorsign64,
)
from tapegrad.backends.numba_cache import njit

# ---------------------------------------------------------------------------------------------
# atan: atan(|x|) = atan(c) + atan(t), t = (|x| - c) / (1 + c|x|), c in {0, 1/2, 1, 3/2, inf}

_A64 = tuple(_h(s) for s in (
    "-0x1.5555555555554p-2", "0x1.99999999988bcp-3", "-0x1.24924923b44f3p-3",
    "0x1.c71c71385342bp-4", "-0x1.745cffa4b03a8p-4", "0x1.3b116689cab8bp-4",
    "-0x1.10ed58e713870p-4", "0x1.df0edb433d901p-5", "-0x1.9c6f6212347ddp-5",
    "0x1.35ff1fbca6de0p-5", "-0x1.1fc46f02d8144p-6"))
_A64_0, _A64_1, _A64_2, _A64_3, _A64_4, _A64_5, _A64_6, _A64_7, _A64_8, _A64_9, _A64_10 = _A64
_A32_0, _A32_1, _A32_2, _A32_3, _A32_4 = (_F(_h(s)) for s in (
    "-0x1.5555539da334ep-2", "0x1.99960dd1263cep-3", "-0x1.23fab5be49b4dp-3",
    "0x1.b50dc16088537p-4", "-0x1.fd97b88640935p-5"))

_ATAN_HALF_HI, _ATAN_HALF_LO = _h("0x1.dac670561bb4fp-2"), _h("0x1.a2b7f222f65e2p-56")
_ATAN_ONE_HI, _ATAN_ONE_LO = _h("0x1.921fb54442d18p-1"), _h("0x1.1a62633145c07p-55")
_ATAN_3H_HI, _ATAN_3H_LO = _h("0x1.f730bd281f69bp-1"), _h("0x1.007887af0cbbdp-56")
_ATAN_INF_HI, _ATAN_INF_LO = _h("0x1.921fb54442d18p+0"), _h("0x1.1a62633145c07p-54")
_ATAN_HALF_HI_F, _ATAN_HALF_LO_F = _F(_h("0x1.dac67p-2")), _F(_h("0x1.586ed4p-28"))
_ATAN_ONE_HI_F, _ATAN_ONE_LO_F = _F(_h("0x1.921fb6p-1")), _F(_h("-0x1.777a5cp-26"))
_ATAN_3H_HI_F, _ATAN_3H_LO_F = _F(_h("0x1.f730bep-1")), _F(_h("-0x1.afc12cp-26"))
_ATAN_INF_HI_F, _ATAN_INF_LO_F = _F(_h("0x1.921fb6p+0")), _F(_h("-0x1.777a5cp-25"))


@njit(forceinline=True)
def _atan64(x):
    a = abs(x)
    r1 = a < 0.4375
    r2 = a < 0.6875
    r3 = a < 1.1875
    r4 = a < 2.4375
    # t = (a - c) / (1 + c a) for c = 0, 1/2, 1, 3/2; -1/a for c = inf
    num = _sel(r3, a - 1.0, _sel(r4, a - 1.5, -1.0))
    num = _sel(r1, a, _sel(r2, 2.0 * a - 1.0, num))
    den = _sel(r3, a + 1.0, _sel(r4, 1.0 + 1.5 * a, a))
    den = _sel(r1, 1.0, _sel(r2, 2.0 + a, den))
    bh = _sel(r3, _ATAN_ONE_HI, _sel(r4, _ATAN_3H_HI, _ATAN_INF_HI))
    bh = _sel(r1, 0.0, _sel(r2, _ATAN_HALF_HI, bh))
    bl = _sel(r3, _ATAN_ONE_LO, _sel(r4, _ATAN_3H_LO, _ATAN_INF_LO))
    bl = _sel(r1, 0.0, _sel(r2, _ATAN_HALF_LO, bl))
    t = _div(num, den)
    z = t * t
    p = _mad(_A64_10, z, _A64_9)
    p = _mad(p, z, _A64_8)
    p = _mad(p, z, _A64_7)
    p = _mad(p, z, _A64_6)
    p = _mad(p, z, _A64_5)
    p = _mad(p, z, _A64_4)
    p = _mad(p, z, _A64_3)
    p = _mad(p, z, _A64_2)
    p = _mad(p, z, _A64_1)
    p = _mad(p, z, _A64_0)
    y = bh + (t + (t * z * p + bl))
    return _xorsign64(y, _sign_of64(x))     # nan propagates through t


@njit(forceinline=True)
def _atan32(x):
    a = abs(x)
    r1 = a < _F(0.4375)
    r2 = a < _F(0.6875)
    r3 = a < _F(1.1875)
    r4 = a < _F(2.4375)
    num = _sel(r3, a - _ONE_F, _sel(r4, a - _F(1.5), _F(-1.0)))
    num = _sel(r1, a, _sel(r2, _TWO_F * a - _ONE_F, num))
    den = _sel(r3, a + _ONE_F, _sel(r4, _ONE_F + _F(1.5) * a, a))
    den = _sel(r1, _ONE_F, _sel(r2, _TWO_F + a, den))
    bh = _sel(r3, _ATAN_ONE_HI_F, _sel(r4, _ATAN_3H_HI_F, _ATAN_INF_HI_F))
    bh = _sel(r1, _ZERO_F, _sel(r2, _ATAN_HALF_HI_F, bh))
    bl = _sel(r3, _ATAN_ONE_LO_F, _sel(r4, _ATAN_3H_LO_F, _ATAN_INF_LO_F))
    bl = _sel(r1, _ZERO_F, _sel(r2, _ATAN_HALF_LO_F, bl))
    t = _div(num, den)
    z = t * t
    p = _mad(_A32_4, z, _A32_3)
    p = _mad(p, z, _A32_2)
    p = _mad(p, z, _A32_1)
    p = _mad(p, z, _A32_0)
    y = bh + (t + (t * z * p + bl))
    return _xorsign32(y, x)
