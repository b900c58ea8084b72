"""nanolm.formats: number formats over libnanolm (src/numerics/formats.c).

    cast(x, "bf16" | "fp16" | "tf32" | "e4m3" | "e5m2" | "e3m2" | "e2m3" | "e2m1" | "e8m0" | "int8" | "int4",
         rounding="rne", overflow="default", seed=1)  -> float32 array of the values x becomes
    encode(x, fmt) -> codes (uint16 for bf16/fp16, uint8 for 8/6/4-bit formats, uint32 for fp32/tf32)
    decode(codes, fmt) -> float32
    info(fmt) -> dict (bits, max_finite, epsilon, ...), names() -> list of format names
"""
import ctypes

import numpy as np

from . import _lib
from ._lib import as_f32, check, cstr, fn, fptr, lib


class _FormatInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("bits", ctypes.c_int), ("exp_bits", ctypes.c_int), ("man_bits", ctypes.c_int), ("bias", ctypes.c_int),
                ("max_finite", ctypes.c_double), ("min_normal", ctypes.c_double), ("min_subnormal", ctypes.c_double),
                ("epsilon", ctypes.c_double), ("has_inf", ctypes.c_int), ("has_nan", ctypes.c_int),
                ("has_sign", ctypes.c_int), ("saturate_by_default", ctypes.c_int), ("max_code", ctypes.c_uint32),
                ("inf_code", ctypes.c_uint32), ("nan_code", ctypes.c_uint32), ("inf_encoding", ctypes.c_char_p),
                ("nan_encoding", ctypes.c_char_p)]


fn("nl_fmt_from_name", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
fn("nl_fmt_info", ctypes.POINTER(_FormatInfo), ctypes.c_int)
fn("nl_fmt_names", ctypes.c_char_p)
fn("nl_fmt_round_array", ctypes.c_int, ctypes.c_int, _lib.c_float_p, ctypes.c_size_t)
fn("nl_fmt_encode_array", ctypes.c_int, ctypes.c_int, _lib.c_float_p, ctypes.c_size_t, ctypes.c_void_p)
fn("nl_fmt_decode_array", ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, _lib.c_float_p)
fn("nl_fmt_code_bytes", ctypes.c_size_t, ctypes.c_int)
fn("nl_fmt_encode", ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_uint32,
   ctypes.POINTER(ctypes.c_uint32))
fn("nl_fmt_decode", ctypes.c_float, ctypes.c_int, ctypes.c_uint32)
fn("nl_rng_u32", ctypes.c_uint32, ctypes.c_void_p)

# The names `nanolm formats cast --rounding/--overflow` accepts.
ROUNDING = {"rne": 0, "nearest-even": 0, "rtz": 1, "toward-zero": 1, "stochastic": 2, "away": 3, "nearest-away": 3}
OVERFLOW = {"default": 0, "saturate": 1, "ieee": 2}
_CODE_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _fmt(name):
    f = ctypes.c_int()
    check(lib.nl_fmt_from_name(cstr(str(name)), ctypes.byref(f)), "format")
    return f.value


def names():
    """The canonical format names."""
    return lib.nl_fmt_names().decode().replace(" ", "").split(",")


def info(fmt):
    """Properties of a format as a dict (nl_format_info): bits, exp_bits, man_bits, bias, max_finite,
    min_normal, min_subnormal, epsilon, has_inf, has_nan, ..."""
    p = lib.nl_fmt_info(_fmt(fmt)).contents
    d = {}
    for k, _ in _FormatInfo._fields_:
        v = getattr(p, k)
        d[k] = v.decode() if isinstance(v, bytes) else v
    return d


def cast(x, fmt, rounding="rne", overflow="default", seed=1):
    """The values of x rounded through format fmt, as float32 (same shape). rounding: rne (nearest,
    ties to even), rtz, away, stochastic (random bits from a generator seeded with `seed`); overflow:
    default (saturate for FP8/MX/int, IEEE for fp16/bf16/tf32), saturate, ieee. NaN stays NaN with
    rne/default; otherwise NaN into a format without NaN is a ValueError naming the index.
    C: nl_fmt_round_array (rne, default), else nl_fmt_encode + nl_fmt_decode per value."""
    f = _fmt(fmt)
    if rounding not in ROUNDING:
        raise _lib.InvalidError(f"cast: unknown rounding {rounding!r} (rne, rtz, away, stochastic)", 1,
                                "invalid argument")
    if overflow not in OVERFLOW:
        raise _lib.InvalidError(f"cast: unknown overflow {overflow!r} (default, saturate, ieee)", 1,
                                "invalid argument")
    a = as_f32(x)
    out = np.array(a, dtype=np.float32, copy=True, order="C")
    r, o = ROUNDING[rounding], OVERFLOW[overflow]
    if r == 0 and o == 0:
        check(lib.nl_fmt_round_array(f, fptr(out), out.size), "cast")
        return out
    flat = out.reshape(-1)
    rng = ctypes.create_string_buffer(32)
    lib.nl_rng_seed(rng, _lib.as_int(seed, "cast: seed", 0, (1 << 64) - 1))
    code = ctypes.c_uint32()
    for i in range(flat.size):
        rand = lib.nl_rng_u32(rng) if r == 2 else 0
        check(lib.nl_fmt_encode(f, float(flat[i]), r, o, rand, ctypes.byref(code)), f"cast: x[{i}]")
        flat[i] = lib.nl_fmt_decode(f, code.value)
    return out


def encode(x, fmt):
    """Codes of x in fmt (nearest-even, default overflow), packed as the library packs them: uint16 for
    bf16/fp16, uint8 for 8/6/4-bit formats (one per byte), uint32 for fp32/tf32. C: nl_fmt_encode_array."""
    f = _fmt(fmt)
    a = as_f32(x)
    codes = np.empty(a.shape, _CODE_DTYPE[lib.nl_fmt_code_bytes(f)])
    check(lib.nl_fmt_encode_array(f, fptr(a), a.size, codes.ctypes.data_as(ctypes.c_void_p)), "encode")
    return codes


def decode(codes, fmt):
    """float32 values of codes in fmt (exact). C: nl_fmt_decode_array."""
    f = _fmt(fmt)
    dt = _CODE_DTYPE[lib.nl_fmt_code_bytes(f)]
    c = _lib.to_numpy(codes)
    if c.dtype.kind not in "iu":
        raise TypeError(f"nanolm: decode: codes must be integers, got dtype {c.dtype}")
    top = (1 << (8 * np.dtype(dt).itemsize)) - 1
    if c.size and (c.min() < 0 or c.max() > top):
        raise _lib.InvalidError(f"decode: codes of {fmt} must be in [0, {top}], got [{c.min()}, {c.max()}]", 1,
                                "invalid argument")
    c = np.ascontiguousarray(c, dtype=dt)
    out = np.empty(c.shape, np.float32)
    check(lib.nl_fmt_decode_array(f, c.ctypes.data_as(ctypes.c_void_p), c.size, fptr(out)), "decode")
    return out
