"""nanolm.quant: the course's quant.py (week 14) over libnanolm.

    quantize_symmetric(x, bits=8, axis=None)   -> (q, scale)               x ~ q * scale
    quantize_affine(x, bits=8, axis=None, unsigned=False) -> (q, scale, zero_point)
    quantize_blockwise(x, block_size, bits=8)  -> (q, scale, block_size)
    dequantize_symmetric / dequantize_affine / dequantize_blockwise
    QuantizedLinear(weight, bias=None)         int8 weights, one scale per output channel
    QuantizedLinear.from_torch(linear)         from a torch.nn.Linear
    quantize_model(model), model_size_bytes(model)   a nanolm.Model or a torch.nn.Module

With NANOLM_IMPL=exercises in the environment the six (de)quantize functions are the student's,
from exercises/quant.py (see docs/exercises.md); everything else stays the library's.
"""
import ctypes
import importlib.util
import os
from pathlib import Path

import numpy as np

from . import _lib, _quant_lib
from ._lib import as_f32, check, fn, fptr, i64, lib
from ._quant_lib import Affine, Blockwise, QuantSpec, Symmetric  # noqa: F401
from .model import Model

_COURSE = ("quantize_symmetric", "dequantize_symmetric", "quantize_affine", "dequantize_affine",
           "quantize_blockwise", "dequantize_blockwise")


def _exercise_module():
    """exercises/quant.py: $NANOLM_EXERCISES/quant.py, else the source tree this package sits in,
    else ./exercises/quant.py (the repository root as the working directory)."""
    here = Path(__file__).resolve().parent
    cands = []
    if os.environ.get("NANOLM_EXERCISES"):
        cands.append(Path(os.environ["NANOLM_EXERCISES"]) / "quant.py")
    cands += [here.parents[1] / "exercises" / "quant.py", Path.cwd() / "exercises" / "quant.py"]
    for p in cands:
        if p.exists():
            spec = importlib.util.spec_from_file_location("nanolm_exercises_quant", p)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod, p
    raise ImportError("NANOLM_IMPL=exercises but exercises/quant.py was not found in: "
                      + ", ".join(str(p) for p in cands) + " (run from the repository root or set NANOLM_EXERCISES)")


IMPL = os.environ.get("NANOLM_IMPL", "src") or "src"
if IMPL == "src":
    _impl = _quant_lib
    IMPL_PATH = _lib.path
elif IMPL == "exercises":
    _impl, IMPL_PATH = _exercise_module()
else:
    raise ImportError(f"NANOLM_IMPL must be 'src' or 'exercises', not {IMPL!r}")

quantize_symmetric = _impl.quantize_symmetric
dequantize_symmetric = _impl.dequantize_symmetric
quantize_affine = _impl.quantize_affine
dequantize_affine = _impl.dequantize_affine
quantize_blockwise = _impl.quantize_blockwise
dequantize_blockwise = _impl.dequantize_blockwise

# ---- QuantizedLinear (src/numerics/qlinear.c) -------------------------------------------------------


class _QLinear(ctypes.Structure):
    _fields_ = [("in_features", i64), ("out_features", i64), ("k_pad", i64), ("w", _lib.c_int8_p),
                ("w_scale", _lib.c_float_p), ("w_sum", _lib.c_int32_p), ("mode", ctypes.c_int), ("path", ctypes.c_int)]


_QLP = ctypes.POINTER(_QLinear)
fn("nl_qlinear_init", ctypes.c_int, _QLP, _lib.c_float_p, i64, i64, ctypes.c_int)
fn("nl_qlinear_free", None, _QLP)
fn("nl_qlinear_forward", ctypes.c_int, _QLP, _lib.c_float_p, i64, _lib.c_float_p)
fn("nl_qlinear_bytes", ctypes.c_size_t, _QLP)
fn("nl_quant_spec_parse", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(QuantSpec))
fn("nl_qmodel_quantize", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(QuantSpec), ctypes.c_int)

_MODES = {"w8a8": 0, "weight-only": 1}


def _mode(mode):
    if mode not in _MODES:
        raise _lib.InvalidError(f"mode must be 'w8a8' or 'weight-only', got {mode!r}", 1, "invalid argument")
    return _MODES[mode]


class QuantizedLinear:
    """y = x W^T (+ bias) with W (out_features, in_features) stored as int8 codes and one fp32
    scale per output channel (absmax). mode "w8a8": each row of x is quantized to int8 on the fly
    and the products summed in int32 (y = acc * s_x * s_w); "weight-only": int8 weights, fp32
    activations. C: nl_qlinear_init / nl_qlinear_forward."""

    def __init__(self, weight, bias=None, mode="w8a8"):
        w = as_f32(weight, "weight")
        if w.ndim != 2:
            raise _lib.InvalidError(f"QuantizedLinear: weight must be (out_features, in_features), got shape "
                                    f"{w.shape}", 1, "invalid argument")
        self._l = _QLinear()
        check(lib.nl_qlinear_init(ctypes.byref(self._l), fptr(w), w.shape[0], w.shape[1], _mode(mode)),
              "QuantizedLinear")
        self.mode = mode
        self.bias = None
        if bias is not None:
            self.bias = as_f32(bias, "bias").copy()
            if self.bias.shape != (w.shape[0],):
                raise _lib.InvalidError(f"QuantizedLinear: bias must have shape ({w.shape[0]},), got "
                                        f"{self.bias.shape}", 1, "invalid argument")

    @classmethod
    def from_torch(cls, linear, mode="w8a8"):
        """From a torch.nn.Linear (its weight and bias, read as fp32)."""
        w = linear.weight.detach().cpu().float().numpy()
        b = None if linear.bias is None else linear.bias.detach().cpu().float().numpy()
        return cls(w, b, mode=mode)

    @property
    def in_features(self):
        return int(self._l.in_features)

    @property
    def out_features(self):
        return int(self._l.out_features)

    @property
    def weight_q(self):
        """int8 codes (out_features, in_features) (a copy)."""
        n, k, kp = self.out_features, self.in_features, int(self._l.k_pad)
        return np.ctypeslib.as_array(self._l.w, shape=(n * kp,)).reshape(n, kp)[:, :k].copy()

    @property
    def weight_scale(self):
        """fp32 scale per output channel (out_features,) (a copy)."""
        return np.ctypeslib.as_array(self._l.w_scale, shape=(self.out_features,)).copy()

    @property
    def nbytes(self):
        """Bytes of the layer as stored: int8 codes + fp32 scales (nl_qlinear_bytes) + fp32 bias."""
        return int(lib.nl_qlinear_bytes(ctypes.byref(self._l))) + (0 if self.bias is None else self.bias.nbytes)

    def forward(self, x):
        """x (..., in_features) numpy or torch -> y (..., out_features) of the same kind (torch:
        same dtype and device as x; computed in fp32 on the CPU)."""
        is_torch = type(x).__module__.startswith("torch")
        a = as_f32(x)
        if a.ndim == 0 or a.shape[-1] != self.in_features:
            raise _lib.InvalidError(f"QuantizedLinear: x must end in in_features = {self.in_features}, got shape "
                                    f"{a.shape}", 1, "invalid argument")
        m = a.reshape(-1, self.in_features)
        y = np.empty((m.shape[0], self.out_features), np.float32)
        if m.shape[0]:
            check(lib.nl_qlinear_forward(ctypes.byref(self._l), fptr(m), m.shape[0], fptr(y)), "QuantizedLinear")
        if self.bias is not None:
            y += self.bias
        y = y.reshape(a.shape[:-1] + (self.out_features,))
        if is_torch:
            import torch
            return torch.from_numpy(y).to(dtype=x.dtype if x.is_floating_point() else torch.float32, device=x.device)
        return y

    __call__ = forward

    def __repr__(self):
        return (f"QuantizedLinear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, mode={self.mode!r})")

    def __del__(self):
        if getattr(self, "_l", None) is not None:
            lib.nl_qlinear_free(ctypes.byref(self._l))
            self._l = None


# ---- quantize_model / model_size_bytes ------------------------------------------------------------------

def _is_torch_module(model):
    try:
        import torch
    except ImportError:
        return False
    return isinstance(model, torch.nn.Module)


def _torch_wrapper():
    import torch

    class TorchQuantizedLinear(torch.nn.Module):
        """A torch.nn.Module around QuantizedLinear (inference only: no gradient)."""

        def __init__(self, ql):
            super().__init__()
            self.ql = ql
            self.in_features, self.out_features = ql.in_features, ql.out_features

        def forward(self, x):
            return self.ql.forward(x)

        def extra_repr(self):
            return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.ql.mode}"

    return TorchQuantizedLinear


def quantize_model(model, scheme="int8-channel", mode=None):
    """Quantizes the linear layers of a model in place and returns it.
    nanolm.Model: every transformer linear (q, k, v, o, gate, up, down) with `scheme` (any name of
    `nanolm quant model --scheme`: int8-channel, int4-b32, affine-uint8-channel, mxfp4, ...);
    mode "w8a8" (int8-channel only, the default there) or "weight-only" (the default otherwise).
    Embeddings, norms and the classifier stay fp32. C: nl_qmodel_quantize.
    torch.nn.Module: every nn.Linear becomes a QuantizedLinear (int8-channel only)."""
    if isinstance(model, Model):
        spec = QuantSpec()
        check(lib.nl_quant_spec_parse(_lib.cstr(scheme), ctypes.byref(spec)), "quantize_model")
        if mode is None:
            mode = "w8a8" if scheme == "int8-channel" else "weight-only"
        md = _mode(mode)
        m = model._alive()
        if model._qm is not None:
            lib.nl_qmodel_free(model._qm)
            model._qm = None
            model.scheme = None
        qm = ctypes.create_string_buffer(1 << 16)
        check(lib.nl_qmodel_quantize(qm, m, ctypes.byref(spec), md), "quantize_model")
        model._qm = qm
        model.scheme = scheme
        return model
    if _is_torch_module(model):
        import torch
        if scheme != "int8-channel":
            raise _lib.UnsupportedError(f"quantize_model: a torch module's nn.Linear layers are quantized with "
                                        f"int8-channel (QuantizedLinear), not {scheme!r}", 6, "unsupported")
        wrap = _torch_wrapper()
        for name, mod in list(model.named_modules()):
            for cname, child in list(mod.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(mod, cname, wrap(QuantizedLinear.from_torch(child, mode=mode or "w8a8")))
        return model
    raise TypeError(f"quantize_model: expected a nanolm.Model or a torch.nn.Module, got {type(model).__name__}")


def model_size_bytes(model):
    """Exact bytes of a model's parameters as stored. nanolm.Model: nl_qmodel_size_bytes (quantized
    linear weights as codes + scales + zero points once quantized, else fp32; a tied classifier
    counted once). torch.nn.Module: parameters and buffers at their element size, plus each
    QuantizedLinear's codes, scales and bias."""
    if isinstance(model, Model):
        return model.size_bytes()
    if _is_torch_module(model):
        seen, total = set(), 0
        for t in list(model.parameters()) + list(model.buffers()):
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        for mod in model.modules():
            if isinstance(getattr(mod, "ql", None), QuantizedLinear):
                total += mod.ql.nbytes
        return total
    raise TypeError(f"model_size_bytes: expected a nanolm.Model or a torch.nn.Module, got {type(model).__name__}")
