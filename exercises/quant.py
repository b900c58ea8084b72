"""Course exercise (week 14), Python: the quantizers of nanolm/quant.py, in numpy.

Run the tests against this file from the repository root:

    NANOLM_IMPL=exercises pytest python/tests/test_quant.py -v

With NANOLM_IMPL=exercises, nanolm.quant takes the six functions below from this file instead of
the library's; every test that needs one fails with NotImplementedError naming it. When they pass,
your functions give the same codes and scales as the C reference (src/numerics/quant.c) bit for
bit, and PyTorch's quantize_per_tensor / quantize_per_channel codes. Without NANOLM_IMPL the same
tests run against the library.

The rules the reference follows (and the tests hold you to):
  * Inputs: np.asarray(x, dtype=np.float32); all arithmetic in float32 (np.float32 scalars).
  * Bad input raises ValueError: NaN or inf anywhere (name the first bad index), bits outside
    2..8, block_size < 1.
  * Rounding: q = np.rint(x * (np.float32(1) / scale)), i.e. multiply by the inverse scale and
    round half to even, as PyTorch does (dividing by scale gives other codes for some inputs);
    then clip to the code range.
  * A group (the tensor, a channel, a block) that is all zeros gets scale 1 and codes 0.
  * Codes are int8 (uint8 for unsigned affine codes); scales float32.
  * axis=None: one scale for the whole array (a float32 scalar). axis=a: one scale per index along
    axis a (PyTorch's quantize_per_channel axis), a 1-D array of x.shape[a] scales.
"""
import numpy as np


def quantize_symmetric(x, bits=8, axis=None):
    """Absmax: qmax = 2^(bits-1) - 1, scale = max|x| / qmax (per tensor, or per index along axis),
    q = clip(rint(x * (1/scale)), -qmax, qmax). Returns (q, scale).
    Course check: (0.3, -0.5, 0.12, 1.5) -> scale 0.011811, q = (25, -42, 10, 127)."""
    raise NotImplementedError("exercise: write quantize_symmetric in exercises/quant.py "
                              "(absmax per tensor / per channel)")


def dequantize_symmetric(q, scale, axis=None):
    """x ~ q * scale (scale broadcast along axis when given). Returns float32."""
    raise NotImplementedError("exercise: write dequantize_symmetric in exercises/quant.py (x ~ q * scale)")


def quantize_affine(x, bits=8, axis=None, unsigned=False):
    """PyTorch's MinMaxObserver rule, in float32, per tensor or per index along axis:
    qmin, qmax = (0, 2^bits - 1) if unsigned else (-2^(bits-1), 2^(bits-1) - 1);
    lo = min(min(x), 0), hi = max(max(x), 0); scale = max((hi - lo) / (qmax - qmin), float32 eps);
    zero_point = clip(qmin - rint(lo / scale), qmin, qmax) (an int);
    q = clip(zero_point + rint(x * (1/scale)), qmin, qmax): the zero point is added after rounding.
    Returns (q, scale, zero_point)."""
    raise NotImplementedError("exercise: write quantize_affine in exercises/quant.py "
                              "(zero point, MinMaxObserver rule)")


def dequantize_affine(q, scale, zero_point, axis=None):
    """x ~ (q - zero_point) * scale. Returns float32."""
    raise NotImplementedError("exercise: write dequantize_affine in exercises/quant.py "
                              "(x ~ (q - zero_point) * scale)")


def quantize_blockwise(x, block_size, bits=8):
    """Absmax per block of block_size consecutive values along the last axis; the last block of a
    row may be shorter. Returns (q, scale) with scale of shape x.shape[:-1] + (n_blocks,).
    Course check: (0.3, -0.5, 0.12, 30) in blocks of 2 -> q = (76, -127, 1, 127)."""
    raise NotImplementedError("exercise: write quantize_blockwise in exercises/quant.py "
                              "(absmax per block of a row)")


def dequantize_blockwise(q, scale, block_size):
    """x ~ q * (the scale of its block). Returns float32."""
    raise NotImplementedError("exercise: write dequantize_blockwise in exercises/quant.py "
                              "(x ~ q * scale of the block)")
