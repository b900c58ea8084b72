"""The course's quantizers bound to libnanolm (src/numerics/quant.c). nanolm.quant exports these,
or with NANOLM_IMPL=exercises the student's versions from exercises/quant.py; the tests hold
the latter to these.

Shapes: "per tensor" (axis=None) is one scale for the whole array. axis=a gives one scale per
index along axis a (PyTorch's quantize_per_channel axis): the array is viewed as (shape[a], rest),
a copy only when a is not the leading axis. Blockwise works along the last axis: (rows, cols) =
(prod(shape[:-1]), shape[-1]), one scale per run of block_size values of a row.
"""
import ctypes
from typing import NamedTuple

import numpy as np

from . import _lib
from ._lib import as_f32, as_int, check, check_scales, fn, fptr, i64, lib

_I32 = (-(1 << 31), (1 << 31) - 1)

SYMMETRIC, AFFINE, MX = 0, 1, 2
PER_TENSOR, PER_CHANNEL, PER_BLOCK = 0, 1, 2


class QuantSpec(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("gran", ctypes.c_int), ("bits", ctypes.c_int), ("block", i64),
                ("is_unsigned", ctypes.c_int), ("mx_elem", ctypes.c_int), ("mx_ties", ctypes.c_int)]


class QTensor(ctypes.Structure):
    _fields_ = [("spec", QuantSpec), ("rows", i64), ("cols", i64), ("group_cols", i64),
                ("groups_per_row", i64), ("n_scales", i64), ("row_bytes", i64),
                ("codes", _lib.c_uint8_p), ("scales", _lib.c_float_p), ("zero_points", _lib.c_int32_p),
                ("scale_e8m0", _lib.c_uint8_p)]


_QT = ctypes.POINTER(QTensor)
fn("nl_quant_symmetric", ctypes.c_int, _lib.c_float_p, i64, i64, ctypes.c_int, ctypes.c_int, _QT)
fn("nl_quant_blockwise", ctypes.c_int, _lib.c_float_p, i64, i64, ctypes.c_int, i64, _QT)
fn("nl_quant_affine", ctypes.c_int, _lib.c_float_p, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int, _QT)
fn("nl_quant_dequantize", ctypes.c_int, _QT, _lib.c_float_p)
fn("nl_qtensor_alloc", ctypes.c_int, _QT, ctypes.POINTER(QuantSpec), i64, i64)
fn("nl_qtensor_free", None, _QT)
fn("nl_qtensor_bytes", ctypes.c_size_t, _QT)
fn("nl_quant_pack_int4", None, _lib.c_int8_p, ctypes.c_size_t, _lib.c_uint8_p)
fn("nl_quant_unpack_int4", None, _lib.c_uint8_p, ctypes.c_size_t, _lib.c_int8_p)
fn("nl_quant_spec_nibbles", ctypes.c_int, ctypes.POINTER(QuantSpec))


class Symmetric(NamedTuple):
    """quantize_symmetric's result: int8 codes q (the input's shape) and the grid step scale
    (a float32 scalar per tensor, or one per index along axis); x ~ q * scale."""
    q: np.ndarray
    scale: object


class Affine(NamedTuple):
    """quantize_affine's result: codes q (int8, or uint8 when unsigned), scale and zero_point;
    x ~ (q - zero_point) * scale."""
    q: np.ndarray
    scale: object
    zero_point: object


class Blockwise(NamedTuple):
    """quantize_blockwise's result: int8 codes q and one scale per block, shape
    x.shape[:-1] + (ceil(x.shape[-1] / block_size),)."""
    q: np.ndarray
    scale: np.ndarray


# ---- shapes --------------------------------------------------------------------------------------

def _rows_cols(shape, axis):
    """(rows, cols, axis) of the (rows, cols) view the C side sees, axis normalised."""
    n = int(np.prod(shape)) if len(shape) else 1
    if axis is None:
        return 1, n, None
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"nanolm: axis must be an int or None, got {axis!r}")
    nd = max(len(shape), 1)
    if not -nd <= axis < nd:
        raise _lib.InvalidError(f"axis {axis} is out of range for an array of {len(shape)} dimensions", 1,
                                "invalid argument")
    axis = int(axis) % nd
    rows = shape[axis] if len(shape) else 1
    return rows, (n // rows if rows else 0), axis


def _to_rows(x, axis):
    """x as a contiguous (rows, cols) float32 matrix with the channel axis first."""
    if axis is None or x.ndim == 0:
        return x.reshape(1, -1)
    if axis != 0:
        x = np.ascontiguousarray(np.moveaxis(x, axis, 0))
    return x.reshape(x.shape[0], -1)


def _from_rows(m, shape, axis):
    if axis is None or len(shape) == 0:
        return m.reshape(shape)
    moved = (shape[axis],) + tuple(s for i, s in enumerate(shape) if i != axis)
    return np.moveaxis(m.reshape(moved), 0, axis)


# ---- codes out of / into an nl_qtensor -------------------------------------------------------------

def _codes(qt, unsigned=False):
    rows, cols, rb = qt.rows, qt.cols, qt.row_bytes
    raw = np.ctypeslib.as_array(qt.codes, shape=(rows * rb,)).reshape(rows, rb) if rows * rb else \
        np.zeros((rows, rb), np.uint8)
    if lib.nl_quant_spec_nibbles(ctypes.byref(qt.spec)):
        out = np.empty((rows, cols), np.int8)
        for r in range(rows):
            row = np.ascontiguousarray(raw[r])
            lib.nl_quant_unpack_int4(row.ctypes.data_as(_lib.c_uint8_p), cols,
                                     out[r].ctypes.data_as(_lib.c_int8_p))
        return (out.view(np.uint8) & 0xF) if unsigned else out
    return raw[:, :cols].copy().view(np.uint8 if unsigned else np.int8)


def _scales(qt):
    return np.ctypeslib.as_array(qt.scales, shape=(qt.n_scales,)).copy()


def _run(what, call):
    qt = QTensor()
    try:
        check(call(ctypes.byref(qt)), what)
        return qt
    except BaseException:
        lib.nl_qtensor_free(ctypes.byref(qt))
        raise


def _dequantize(spec, q2, scales, zps, what):
    """Fills an nl_qtensor with codes q2 (rows, cols) and the given scales and runs
    nl_quant_dequantize."""
    rows, cols = q2.shape
    qt = QTensor()
    check(lib.nl_qtensor_alloc(ctypes.byref(qt), ctypes.byref(spec), rows, cols), what)
    try:
        if scales.size != qt.n_scales:
            raise _lib.InvalidError(f"{what}: {scales.size} scales for {qt.n_scales} groups of a "
                                    f"({rows}, {cols}) array", 1, "invalid argument")
        codes = np.ctypeslib.as_array(qt.codes, shape=(rows * qt.row_bytes,)).reshape(rows, qt.row_bytes) \
            if rows * qt.row_bytes else None
        if codes is not None:
            codes[:, :cols] = q2.view(np.uint8) if q2.dtype.itemsize == 1 else q2.astype(np.uint8)
        np.ctypeslib.as_array(qt.scales, shape=(qt.n_scales,))[:] = scales.reshape(-1)
        if zps is not None:
            np.ctypeslib.as_array(qt.zero_points, shape=(qt.n_scales,))[:] = zps.reshape(-1)
        out = np.empty((rows, cols), np.float32)
        check(lib.nl_quant_dequantize(ctypes.byref(qt), fptr(out)), what)
        return out
    finally:
        lib.nl_qtensor_free(ctypes.byref(qt))


def _codes_in(q, lo, hi, dtype, what):
    a = _lib.to_numpy(q)
    if a.dtype.kind not in "iu":
        raise TypeError(f"nanolm: {what}: codes must be integers, got dtype {a.dtype}")
    if a.size and (a.min() < lo or a.max() > hi):
        raise _lib.InvalidError(f"{what}: codes must be in [{lo}, {hi}], got [{a.min()}, {a.max()}]", 1,
                                "invalid argument")
    return np.ascontiguousarray(a, dtype=dtype)


def _scales_in(scale, what):
    """Scales as float32: real numbers only (a complex or string scale is a TypeError)."""
    a = _lib.to_numpy(scale)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"nanolm: {what}: scale must hold real numbers, got dtype {a.dtype}")
    return np.asarray(a, np.float32)


def _scale_out(s, axis):
    return s[0] if axis is None else s


# ---- the course's functions ------------------------------------------------------------------------

def quantize_symmetric(x, bits=8, axis=None):
    """Absmax quantization: scale = max|x| / (2^(bits-1) - 1) per tensor (axis=None) or per
    index along `axis`; q = round_half_even(x * (1/scale)). C: nl_quant_symmetric."""
    x = as_f32(x)
    rows, cols, axis = _rows_cols(x.shape, axis)
    m = _to_rows(x, axis)
    bits = as_int(bits, "quantize_symmetric: bits", *_I32)
    qt = _run("quantize_symmetric", lambda p: lib.nl_quant_symmetric(fptr(m), rows, cols, bits,
                                                                     0 if axis is None else 1, p))
    try:
        return Symmetric(_from_rows(_codes(qt), x.shape, axis), _scale_out(_scales(qt), axis))
    finally:
        lib.nl_qtensor_free(ctypes.byref(qt))


def dequantize_symmetric(q, scale, axis=None):
    """x ~ q * scale (scale per tensor, or one per index along axis). C: nl_quant_dequantize."""
    q = _codes_in(q, -128, 127, np.int8, "dequantize_symmetric")
    rows, cols, axis = _rows_cols(q.shape, axis)
    spec = QuantSpec(SYMMETRIC, PER_TENSOR if axis is None else PER_CHANNEL, 8, 0, 0, 0, 0)
    s = check_scales(_scales_in(scale, "dequantize_symmetric"), "dequantize_symmetric")
    return _from_rows(_dequantize(spec, _to_rows(q, axis), s, None, "dequantize_symmetric"), q.shape, axis)


def quantize_affine(x, bits=8, axis=None, unsigned=False):
    """Affine quantization with a zero point (PyTorch's MinMaxObserver rule): the range [min, max]
    widened to include 0, scale = (max - min) / (qmax - qmin), zero_point = qmin - round(min / scale);
    codes signed -2^(b-1)..2^(b-1)-1, or 0..2^b-1 when unsigned. C: nl_quant_affine."""
    x = as_f32(x)
    rows, cols, axis = _rows_cols(x.shape, axis)
    m = _to_rows(x, axis)
    bits = as_int(bits, "quantize_affine: bits", *_I32)
    qt = _run("quantize_affine", lambda p: lib.nl_quant_affine(fptr(m), rows, cols, bits, 1 if unsigned else 0,
                                                               0 if axis is None else 1, p))
    try:
        zp = np.ctypeslib.as_array(qt.zero_points, shape=(qt.n_scales,)).copy()
        return Affine(_from_rows(_codes(qt, unsigned), x.shape, axis), _scale_out(_scales(qt), axis),
                      _scale_out(zp, axis))
    finally:
        lib.nl_qtensor_free(ctypes.byref(qt))


def dequantize_affine(q, scale, zero_point, axis=None):
    """x ~ (q - zero_point) * scale. uint8 codes are read as unsigned. C: nl_quant_dequantize."""
    a = _lib.to_numpy(q)
    unsigned = a.dtype == np.uint8
    q = _codes_in(a, 0 if unsigned else -128, 255 if unsigned else 127, np.uint8 if unsigned else np.int8,
                  "dequantize_affine")
    rows, cols, axis = _rows_cols(q.shape, axis)
    spec = QuantSpec(AFFINE, PER_TENSOR if axis is None else PER_CHANNEL, 8, 0, 1 if unsigned else 0, 0, 0)
    s = check_scales(_scales_in(scale, "dequantize_affine"), "dequantize_affine")
    zp = _lib.to_numpy(zero_point)
    if zp.dtype.kind not in "iu":
        raise TypeError(f"nanolm: dequantize_affine: zero_point must be integers, got dtype {zp.dtype}")
    if zp.size and (zp.min() < -(1 << 31) or zp.max() > (1 << 31) - 1):
        raise _lib.InvalidError(f"dequantize_affine: zero_point must fit int32, got [{zp.min()}, {zp.max()}]", 1,
                                "invalid argument")
    out = _dequantize(spec, _to_rows(q, axis), s, zp.astype(np.int32), "dequantize_affine")
    return _from_rows(out, q.shape, axis)


def quantize_blockwise(x, block_size, bits=8):
    """Absmax per block of block_size consecutive values along the last axis (the last block of a
    row may be shorter). C: nl_quant_blockwise."""
    x = as_f32(x)
    shape = x.shape if x.ndim else (1,)
    rows, cols = (int(np.prod(shape[:-1])), shape[-1])
    m = x.reshape(rows, cols)
    bits = as_int(bits, "quantize_blockwise: bits", *_I32)
    block_size = as_int(block_size, "quantize_blockwise: block_size")
    qt = _run("quantize_blockwise", lambda p: lib.nl_quant_blockwise(fptr(m), rows, cols, bits, block_size, p))
    try:
        return Blockwise(_codes(qt).reshape(x.shape), _scales(qt).reshape(shape[:-1] + (qt.groups_per_row,)))
    finally:
        lib.nl_qtensor_free(ctypes.byref(qt))


def dequantize_blockwise(q, scale, block_size):
    """x ~ q * scale of its block (blocks of block_size along the last axis). C: nl_quant_dequantize."""
    q = _codes_in(q, -128, 127, np.int8, "dequantize_blockwise")
    shape = q.shape if q.ndim else (1,)
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    spec = QuantSpec(SYMMETRIC, PER_BLOCK, 8, as_int(block_size, "dequantize_blockwise: block_size"), 0, 0, 0)
    s = check_scales(_scales_in(scale, "dequantize_blockwise"), "dequantize_blockwise")
    out = _dequantize(spec, q.reshape(rows, cols), s, None, "dequantize_blockwise")
    return out.reshape(q.shape)
