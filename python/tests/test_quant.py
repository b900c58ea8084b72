"""nanolm.quant: the course's worked numbers, agreement with the C library bit for bit, with the
CLI, and with PyTorch.

    pytest python/tests/test_quant.py                          # against the library
    NANOLM_IMPL=exercises pytest python/tests/test_quant.py    # against exercises/quant.py

The C side of every comparison goes through an entry point the binding does not use
(nl_quant_tensor, one code at a time with nl_qtensor_code), so with the reference these tests
check the binding's marshalling (shapes, axes, int4 nibbles), and with the exercises they hold
the student's numpy code to the C reference.
"""
import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, cli_json, torch_or_skip

import nanolm
from nanolm import _lib, quant
from nanolm._quant_lib import AFFINE, PER_BLOCK, PER_CHANNEL, PER_TENSOR, SYMMETRIC, QTensor, QuantSpec

COURSE = [0.3, -0.5, 0.12, 1.5]
OUTLIER = [0.3, -0.5, 0.12, 30.0]

# ---- the C reference through its generic entry point ---------------------------------------------------
_lib.fn("nl_quant_tensor", ctypes.c_int, _lib.c_float_p, _lib.i64, _lib.i64, ctypes.POINTER(QuantSpec),
        ctypes.POINTER(QTensor))
_lib.fn("nl_qtensor_code", ctypes.c_int32, ctypes.POINTER(QTensor), _lib.i64, _lib.i64)


def c_reference(x2d, kind, gran, bits, block=0, unsigned=False):
    """(codes (rows, cols) int32, scales, zero points or None, dequantized) of a (rows, cols)
    matrix from the C library: nl_quant_tensor, codes one by one, nl_quant_dequantize."""
    x2d = np.ascontiguousarray(x2d, dtype=np.float32)
    rows, cols = x2d.shape
    spec = QuantSpec(kind, gran, bits, block, 1 if unsigned else 0, 0, 0)
    qt = QTensor()
    _lib.check(_lib.lib.nl_quant_tensor(_lib.fptr(x2d), rows, cols, ctypes.byref(spec), ctypes.byref(qt)))
    try:
        codes = np.array([[_lib.lib.nl_qtensor_code(ctypes.byref(qt), r, c) for c in range(cols)]
                          for r in range(rows)], dtype=np.int32)
        scales = np.ctypeslib.as_array(qt.scales, shape=(qt.n_scales,)).copy()
        zps = np.ctypeslib.as_array(qt.zero_points, shape=(qt.n_scales,)).copy() if kind == AFFINE else None
        back = np.empty((rows, cols), np.float32)
        _lib.check(_lib.lib.nl_quant_dequantize(ctypes.byref(qt), _lib.fptr(back)))
        return codes, scales, zps, back
    finally:
        _lib.lib.nl_qtensor_free(ctypes.byref(qt))


def weights(rows=12, cols=96, seed=0):
    """N(0, 0.02) weights with an outlier row (x50), an all-zero row and exact .5 ties."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    w[3] *= 50
    w[5] = 0
    w[7, :8] = (np.arange(8) - 3.5) * np.float32(2.0 ** -7)
    w[7, 8] = 127 * 2.0 ** -7  # row absmax 127 * 2^-7: scale 2^-7, the .5 values are ties
    return w


def same(a, b):
    """Bit-for-bit equality of two arrays (values and shape; NaN never expected)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.array_equal(a, b), f"first difference at {np.argwhere(a != b)[:3].tolist()}: {a[a != b][:3]} vs {b[a != b][:3]}"


# ---- the course's worked numbers ---------------------------------------------------------------------

def test_course_example():
    q, scale = quant.quantize_symmetric(COURSE)
    assert round(float(scale), 6) == 0.011811
    assert np.asarray(q).tolist() == [25, -42, 10, 127]
    back = quant.dequantize_symmetric(q, scale)
    assert np.allclose(back, [0.295, -0.496, 0.118, 1.5], atol=6e-4)


def test_course_outlier():
    q, scale = quant.quantize_symmetric(OUTLIER)
    assert round(float(scale), 3) == 0.236
    assert np.asarray(q).tolist() == [1, -2, 1, 127]
    # every |x| <= 0.5 lands on one of 5 levels (-2..2) of the 255
    levels = np.unique(np.rint(np.linspace(-0.5, 0.5, 1001, dtype=np.float32) * (np.float32(1) / scale)))
    assert levels.tolist() == [-2, -1, 0, 1, 2]


def test_course_blocks_of_2():
    q, scale = quant.quantize_blockwise(OUTLIER, 2)
    assert np.asarray(q).tolist() == [76, -127, 1, 127]
    assert np.asarray(scale).shape == (2,)
    back = quant.dequantize_blockwise(q, scale, 2)
    assert abs(back[0] - 0.3) < 0.002 and abs(back[1] + 0.5) < 1e-6  # the outlier spoilt only its block


def test_dequantize_symmetric_course_codes():
    s = np.float32(1.5) / np.float32(127)
    same(quant.dequantize_symmetric(np.array([25, -42, 10, 127], np.int8), s),
         np.array([25, -42, 10, 127], np.float32) * s)


def test_dequantize_blockwise_course_codes():
    s2 = np.array([0.5, 30.0], np.float32) / np.float32(127)
    same(quant.dequantize_blockwise(np.array([76, -127, 1, 127], np.int8), s2, 2),
         np.array([76 * s2[0], -127 * s2[0], 1 * s2[1], 127 * s2[1]], np.float32))


def test_dequantize_affine_codes():
    back = quant.dequantize_affine(np.array([0, 64, 255], np.uint8), np.float32(0.5), 64)
    same(back, np.array([-32.0, 0.0, 95.5], np.float32))


def test_matches_cli_demo():
    """The same three steps as `nanolm quant demo --json`, codes and scales bit for bit."""
    steps = cli_json("quant", "demo")["steps"]
    assert len(steps) == 3
    for st in steps:
        x = np.array(st["x"], np.float32)
        if st["block"]:
            q, s = quant.quantize_blockwise(x, st["block"])
        else:
            q, s = quant.quantize_symmetric(x)
        assert np.asarray(q).tolist() == st["q"], st["step"]
        same(np.atleast_1d(np.asarray(s, np.float32)), np.array(st["scales"], np.float32))
        same(np.asarray(x.dtype.type(0)) + (quant.dequantize_blockwise(q, s, st["block"]) if st["block"]
                                            else quant.dequantize_symmetric(q, s)),
             np.array(st["dequantized"], np.float32))


# ---- bit for bit with the C library ------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4, 3])
def test_symmetric_per_tensor_bit_for_bit(bits):
    w = weights()
    q, s = quant.quantize_symmetric(w, bits=bits)
    codes, scales, _, back = c_reference(w, SYMMETRIC, PER_TENSOR, bits)
    assert np.asarray(q).dtype == np.int8
    same(q, codes.astype(np.int8))
    same(np.float32(s), scales[0])
    same(quant.dequantize_symmetric(q, s), back)


@pytest.mark.parametrize("bits", [8, 4])
def test_symmetric_per_channel_bit_for_bit(bits):
    w = weights()
    q, s = quant.quantize_symmetric(w, bits=bits, axis=0)
    codes, scales, _, back = c_reference(w, SYMMETRIC, PER_CHANNEL, bits)
    same(q, codes.astype(np.int8))
    same(s, scales)
    assert s[5] == 1.0 and not np.asarray(q)[5].any()  # the all-zero row: scale 1, codes 0
    same(quant.dequantize_symmetric(q, s, axis=0), back)
    # axis=1: one scale per column, as the C per-row scheme on the transpose
    q1, s1 = quant.quantize_symmetric(w, bits=bits, axis=1)
    codes_t, scales_t, _, back_t = c_reference(w.T, SYMMETRIC, PER_CHANNEL, bits)
    same(q1, codes_t.T.astype(np.int8))
    same(s1, scales_t)
    same(quant.dequantize_symmetric(q1, s1, axis=1), back_t.T)


@pytest.mark.parametrize("block,bits", [(32, 8), (7, 8), (16, 4)])
def test_blockwise_bit_for_bit(block, bits):
    w = weights()
    q, s = quant.quantize_blockwise(w, block, bits=bits)
    codes, scales, _, back = c_reference(w, SYMMETRIC, PER_BLOCK, bits, block=block)
    same(q, codes.astype(np.int8))
    same(s, scales.reshape(w.shape[0], -(-w.shape[1] // block)))
    same(quant.dequantize_blockwise(q, s, block), back)


@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.parametrize("axis", [None, 0])
def test_affine_bit_for_bit(unsigned, axis):
    w = weights()
    w[9] = np.abs(w[9]) + 0.25  # an all-positive row: the range widens to include 0
    q, s, zp = quant.quantize_affine(w, axis=axis, unsigned=unsigned)
    codes, scales, zps, back = c_reference(w, AFFINE, PER_TENSOR if axis is None else PER_CHANNEL, 8,
                                           unsigned=unsigned)
    assert np.asarray(q).dtype == (np.uint8 if unsigned else np.int8)
    same(np.asarray(q).astype(np.int32), codes)
    same(np.atleast_1d(np.asarray(s, np.float32)), scales)
    same(np.atleast_1d(np.asarray(zp)).astype(np.int32), zps)
    same(quant.dequantize_affine(q, s, zp, axis=axis), back)
    # 0.0 is exactly representable: its code dequantizes to 0
    z = np.zeros_like(w)
    z[:, 1:] = w[:, 1:]
    qz, sz, zpz = quant.quantize_affine(z, axis=axis, unsigned=unsigned)
    assert not quant.dequantize_affine(qz, sz, zpz, axis=axis)[:, 0].any()


def test_outlier_hurts_per_tensor_most():
    """The course's check by hand: an outlier row spoils per tensor more than per channel or per block."""
    w = weights()
    err = {}
    q, s = quant.quantize_symmetric(w)
    err["tensor"] = np.mean((quant.dequantize_symmetric(q, s) - w) ** 2)
    q, s = quant.quantize_symmetric(w, axis=0)
    err["channel"] = np.mean((quant.dequantize_symmetric(q, s, axis=0) - w) ** 2)
    q, s = quant.quantize_blockwise(w, 32)
    err["block"] = np.mean((quant.dequantize_blockwise(q, s, 32) - w) ** 2)
    assert err["tensor"] > 10 * err["channel"] and err["tensor"] > 10 * err["block"], err


# ---- inputs: the conversion rule and bad values ---------------------------------------------------------------

def test_inputs_any_real_dtype_and_layout():
    w = weights()
    q32, s32 = quant.quantize_symmetric(w, axis=0)
    for x in (w.astype(np.float64), w.tolist(), np.asfortranarray(w)):
        q, s = quant.quantize_symmetric(x, axis=0)
        same(q, q32)
        same(s, s32)
    wide = np.repeat(w, 2, axis=1)  # a strided view w'[:, ::2] == w
    q, s = quant.quantize_symmetric(wide[:, ::2], axis=0)
    same(q, q32)
    q, s = quant.quantize_symmetric(np.arange(-3, 5))  # integers
    assert np.asarray(q).tolist() == [-95, -64, -32, 0, 32, 64, 95, 127]


def test_float32_contiguous_input_is_not_copied():
    w = weights()
    assert _lib.as_f32(w) is w
    assert _lib.as_f32(w[2:5]).base is not None  # a contiguous slice stays a view
    assert _lib.as_f32(w[:, ::2]).flags.c_contiguous  # a strided one is copied
    with pytest.raises(TypeError):
        _lib.as_f32(np.array([1j]))


def test_bad_input_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="index 1"):
        quant.quantize_symmetric([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="index 2"):
        quant.quantize_blockwise([1.0, 2.0, float("inf")], 2)
    with pytest.raises(ValueError, match="index 0"):
        quant.quantize_affine([float("-inf"), 1.0])
    with pytest.raises(ValueError, match="bits"):
        quant.quantize_symmetric([1.0], bits=9)
    with pytest.raises(ValueError, match="bits"):
        quant.quantize_affine([1.0], bits=1)
    with pytest.raises(ValueError, match="block"):
        quant.quantize_blockwise([1.0, 2.0], 0)


def test_library_errors_are_nanolm_errors():
    """The library's own functions raise nanolm.Error subclasses with nl_last_error()'s message."""
    from nanolm import _quant_lib
    with pytest.raises(nanolm.InvalidError) as e:
        _quant_lib.quantize_symmetric([1.0, float("nan")])
    assert isinstance(e.value, ValueError) and e.value.status == 1
    assert "non-finite value nan at index 1" in str(e.value)


# ---- QuantizedLinear ---------------------------------------------------------------------------------------------

def test_quantized_linear_w8a8():
    rng = np.random.default_rng(1)
    w = weights(16, 96)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    ql = quant.QuantizedLinear(w)
    assert (ql.in_features, ql.out_features) == (96, 16)
    qw, sw = quant.quantize_symmetric(w, axis=0)  # int8 and a scale per output channel
    same(ql.weight_q, qw)
    same(ql.weight_scale, sw)
    assert ql.nbytes == 16 * 96 + 16 * 4
    y = ql(x)
    # W8A8: each row of x quantized by absmax, int32 sums, y = acc * (s_x * s_w)
    qx, sx = quant.quantize_symmetric(x, axis=0)
    acc = np.asarray(qx, np.int32) @ np.asarray(qw, np.int32).T
    same(y, acc.astype(np.float32) * (np.asarray(sx)[:, None] * np.asarray(sw)[None, :]))
    ref = x @ w.T
    assert np.max(np.abs(y - ref)) < 0.02 * np.max(np.abs(ref))


def test_quantized_linear_weight_only_bias_and_shapes():
    rng = np.random.default_rng(2)
    w, b = weights(8, 40), rng.standard_normal(8).astype(np.float32)
    ql = quant.QuantizedLinear(w, bias=b, mode="weight-only")
    x = rng.standard_normal((2, 3, 40)).astype(np.float32)
    y = ql(x)
    assert y.shape == (2, 3, 8)
    deq = quant.dequantize_symmetric(ql.weight_q, ql.weight_scale, axis=0)
    assert np.allclose(y, x @ deq.T + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="in_features"):
        ql(np.zeros((2, 41), np.float32))
    with pytest.raises(ValueError, match="mode"):
        quant.QuantizedLinear(w, mode="fp8")
    with pytest.raises(ValueError):
        quant.QuantizedLinear(np.full((2, 3), np.nan, np.float32))


# ---- PyTorch ------------------------------------------------------------------------------------------------------

def test_observer_matches_pytorch_fixture():
    """Affine scale and zero point against PyTorch's MinMaxObserver / PerChannelMinMaxObserver on
    100,000 values (tests/ref/quant_fixture.*, written by tests/ref/make_quant_fixture.py)."""
    meta = json.loads((ROOT / "tests/ref/quant_fixture.json").read_text())
    x = np.fromfile(ROOT / "tests/ref/quant_fixture.bin", dtype="<f4", count=meta["n"])
    q, s, zp = quant.quantize_affine(x, unsigned=True)
    assert np.float32(s) == np.float32(meta["observer"]["scale"])
    assert int(zp) == meta["observer"]["zero_point"]
    xc = x.reshape(meta["rows"], meta["cols"]).copy()
    xc[1::2] = np.abs(xc[1::2]) + np.float32(0.25)
    q, s, zp = quant.quantize_affine(xc, axis=0, unsigned=True)
    same(np.asarray(s, np.float32), np.array(meta["observer_per_channel"]["scales"], np.float32))
    same(np.asarray(zp).astype(np.int64), np.array(meta["observer_per_channel"]["zero_points"]))


def test_symmetric_matches_torch_quantize_per_tensor_and_channel():
    torch = torch_or_skip()
    w = weights(24, 200, seed=3)
    q, s = quant.quantize_symmetric(w)
    tq = torch.quantize_per_tensor(torch.from_numpy(w), float(s), 0, torch.qint8).int_repr().numpy()
    same(q, tq)
    for axis in (0, 1):
        q, s = quant.quantize_symmetric(w, axis=axis)
        s64 = torch.from_numpy(np.asarray(s, np.float64))
        tq = torch.quantize_per_channel(torch.from_numpy(w), s64, torch.zeros(len(s), dtype=torch.int64), axis,
                                        torch.qint8).int_repr().numpy()
        same(q, tq)


def test_affine_matches_torch_observer_and_codes():
    torch = torch_or_skip()
    w = weights(24, 200, seed=4)
    xt = torch.from_numpy(w)
    for unsigned, dt in ((True, torch.quint8), (False, torch.qint8)):
        obs = torch.ao.quantization.MinMaxObserver(dtype=dt, qscheme=torch.per_tensor_affine)
        obs(xt)
        ts, tz = obs.calculate_qparams()
        q, s, zp = quant.quantize_affine(w, unsigned=unsigned)
        assert np.float32(s) == np.float32(ts.item()) and int(zp) == int(tz.item())
        same(np.asarray(q), torch.quantize_per_tensor(xt, ts.item(), int(tz.item()), dt).int_repr().numpy())
        obsc = torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=0, dtype=dt, qscheme=torch.per_channel_affine)
        obsc(xt)
        tsc, tzc = obsc.calculate_qparams()
        q, s, zp = quant.quantize_affine(w, axis=0, unsigned=unsigned)
        same(np.asarray(s, np.float32), tsc.numpy().astype(np.float32))
        same(np.asarray(zp).astype(np.int64), tzc.numpy().astype(np.int64))
        same(np.asarray(q), torch.quantize_per_channel(xt, tsc, tzc, 0, dt).int_repr().numpy())


def test_quantized_linear_from_torch_and_torch_model():
    torch = torch_or_skip()
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    ql = quant.QuantizedLinear.from_torch(lin)
    x = torch.randn(4, 64)
    y = ql(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == (4, 32)
    ref = lin(x).detach()
    assert float((y - ref).abs().max()) < 0.02 * float(ref.abs().max())
    y16 = ql(x.to(torch.bfloat16))  # a dtype numpy lacks goes through fp32; the result keeps x's dtype
    assert y16.dtype == torch.bfloat16 and y16.shape == (4, 32)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    before = quant.model_size_bytes(model)
    assert before == 4 * sum(p.numel() for p in model.parameters())
    ref = model(x).detach()
    quant.quantize_model(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    after = quant.model_size_bytes(model)
    # int8 codes + fp32 scale per output channel + fp32 bias
    assert after == (64 * 128 + 128 * 4 + 128 * 4) + (128 * 32 + 32 * 4 + 32 * 4)
    assert before / after > 3.5
    y = model(x)
    assert float((y - ref).abs().max()) < 0.05 * float(ref.abs().max())
