"""The binding refuses what the C API refuses, before a value reaches a C integer or a buffer:
fractional or bool sizes (ctypes would truncate them), negative seeds and codes (they would wrap),
NaN and non-positive scales written straight into a quantized tensor, wrong dtypes."""
import math

import numpy as np
import pytest

import conftest  # noqa: F401  (puts python/ on the path)
import nanolm
from nanolm import formats, quant
from nanolm._quant_lib import dequantize_affine, dequantize_blockwise, dequantize_symmetric, quantize_blockwise, \
    quantize_symmetric

X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: quantize_symmetric(X, bits=8.5), TypeError, "bits must be an integer"),
    (lambda: quantize_symmetric(X, bits=True), TypeError, "bits must be an integer"),
    (lambda: quantize_symmetric(X, bits=(1 << 32) + 8), ValueError, "bits must be in"),
    (lambda: quantize_blockwise(X, block_size=4.5), TypeError, "block_size must be an integer"),
    (lambda: quantize_blockwise(X, block_size=float("nan")), TypeError, "block_size must be an integer"),
    (lambda: dequantize_blockwise(np.zeros((4, 16), np.int8), np.ones((4, 4)), block_size=2.5), TypeError,
     "block_size must be an integer"),
    (lambda: dequantize_symmetric(np.zeros((4, 16), np.int8), float("nan")), ValueError,
     "scale must be positive and finite, got nan"),
    (lambda: dequantize_symmetric(np.zeros((4, 16), np.int8), -2.0), ValueError,
     "scale must be positive and finite, got -2"),
    (lambda: dequantize_symmetric(np.zeros((4, 16), np.int8), 1 + 2j), TypeError, "real numbers"),
    (lambda: dequantize_blockwise(np.zeros((4, 16), np.int8), np.full((4, 4), np.inf), 4), ValueError,
     "scale must be positive and finite, got inf"),
    (lambda: dequantize_affine(np.zeros((4, 16), np.int8), 0.5, 3.7), TypeError, "zero_point must be integers"),
    (lambda: formats.cast(X, "e4m3", rounding="stochastic", seed=-1), ValueError, "seed must be in [0,"),
    (lambda: formats.cast(X, "e4m3", rounding="stochastic", seed=1.5), TypeError, "seed must be an integer"),
    (lambda: formats.decode(np.array([-1, 3]), "e4m3"), ValueError, "codes of e4m3 must be in [0, 255]"),
    (lambda: formats.decode(np.array([70000]), "bf16"), ValueError, "codes of bf16 must be in [0, 65535]"),
])
def test_refused_with_a_message(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert words in str(e.value)


def test_good_values_still_pass():
    """Integral floats and numpy integers are integers; the scales a quantizer returns dequantize."""
    q, s = quantize_symmetric(X, bits=np.int64(8))
    assert np.allclose(dequantize_symmetric(q, s), X, atol=float(s))
    q2, s2 = quantize_blockwise(X, block_size=8.0)
    assert np.allclose(dequantize_blockwise(q2, s2, 8), X, atol=float(s2.max()))
    assert formats.decode(np.array([0, 255], np.int64), "e4m3").shape == (2,)
    assert quant.IMPL in ("src", "exercises")


def test_model_sizes_checked(tmp_path):
    """Model.generate / eval_loss: sizes and seeds are checked before they reach C."""
    path = conftest.ROOT / "tests/ref/interop.safetensors"
    m = nanolm.Model.load(path)
    with pytest.raises(TypeError, match="batch must be an integer"):
        m.eval_loss(np.arange(200) % m.vocab_size, batch=2.5, seq=8)
    with pytest.raises(ValueError, match="batch must be in"):
        m.eval_loss(np.arange(200) % m.vocab_size, batch=-1, seq=8)
    with pytest.raises(ValueError, match="max_windows must be in"):
        m.eval_loss(np.arange(200) % m.vocab_size, batch=1, seq=8, max_windows=-3)
    assert math.isfinite(m.eval_loss(np.arange(200) % m.vocab_size, batch=1, seq=8))
    m.close()
