"""Loading libnanolm.so, the C types the binding passes, and C errors as Python exceptions.

Everything the package computes is computed by the C library; this module only declares the
functions it calls (argument and result types) and turns an nl_status into an exception that
carries nl_last_error()'s message.

Where the library is looked for, first hit wins:
  1. $NANOLM_LIB (a path to libnanolm.so);
  2. next to an installed package: PREFIX/lib/libnanolm.so for a package in
     PREFIX/lib/python3*/dist-packages/nanolm (what `make install` lays out);
  3. a build folder of the source tree the package sits in (python/nanolm -> build/), or of the
     tree `pip install ./python` built it from;
  4. the system loader (ldconfig's paths, LD_LIBRARY_PATH), then /usr/local/lib and /usr/lib.
"""
import ctypes
import ctypes.util
import os
from pathlib import Path

import numpy as np

# ---- exceptions --------------------------------------------------------------------------------


class Error(Exception):
    """A failure reported by libnanolm: .status is the nl_status code, .status_name its name,
    str() the library's message (nl_last_error())."""

    def __init__(self, message, status=0, status_name=""):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class InvalidError(Error, ValueError):
    """NL_ERR_INVALID: a bad argument or input value (NaN, unknown name, bad shape)."""


class RangeError(Error, ValueError):
    """NL_ERR_RANGE: a value the target format cannot represent."""


class UnsupportedError(Error, ValueError):
    """NL_ERR_UNSUPPORTED: a valid request this build or scheme cannot do."""


class FileError(Error, OSError):
    """NL_ERR_IO: a file could not be opened, read or written."""


class FormatError(Error, OSError):
    """NL_ERR_FORMAT: a file is malformed (truncated, bad header, wrong dtype)."""


class NumericError(Error, FloatingPointError):
    """NL_ERR_NUMERIC: a computation produced NaN/inf where it must not."""


class CommError(Error, RuntimeError):
    """NL_ERR_COMM: a collective or peer failed."""


class NotImplementedExercise(Error, NotImplementedError):
    """NL_ERR_NOT_IMPLEMENTED: a course skeleton (exercises/) is not written yet."""


_STATUS_EXC = {1: InvalidError, 2: MemoryError, 3: FileError, 4: FormatError, 5: RangeError,
               6: UnsupportedError, 7: NumericError, 8: CommError, 9: NotImplementedExercise}

# ---- finding and loading the library --------------------------------------------------------


def _candidates():
    env = os.environ.get("NANOLM_LIB")
    if env:
        return [Path(env)], True
    here = Path(__file__).resolve().parent
    out = []
    # Installed: PREFIX/lib/python3[.X]/dist-packages/nanolm -> PREFIX/lib
    if here.parent.name in ("dist-packages", "site-packages") and len(here.parents) >= 3:
        libdir = here.parents[2]
        out += [libdir / "libnanolm.so"] + sorted(libdir.glob("*-linux-gnu/libnanolm.so"))
    # Source tree: REPO/python/nanolm -> REPO/build*/libnanolm.so; a pip-installed package knows
    # the tree it was built from (nanolm/_build_paths.py, written by python/setup.py).
    trees = [here.parents[1]]
    try:
        from ._build_paths import SOURCE_TREE
        trees.append(Path(SOURCE_TREE))
    except ImportError:
        pass
    for repo in trees:
        if (repo / "CMakeLists.txt").exists():
            out += [repo / "build" / "libnanolm.so"] + sorted(repo.glob("build*/libnanolm.so"))
    return out, False


def _load():
    paths, forced = _candidates()
    for p in paths:
        if p.exists():
            return ctypes.CDLL(str(p)), str(p)
    if forced:
        raise OSError(f"nanolm: NANOLM_LIB={paths[0]} does not exist")
    found = ctypes.util.find_library("nanolm")
    for name in ([found] if found else []) + ["libnanolm.so", "/usr/local/lib/libnanolm.so", "/usr/lib/libnanolm.so"]:
        try:
            return ctypes.CDLL(name), name
        except OSError:
            pass
    raise OSError("nanolm: libnanolm.so not found; build it (make) or install it (make install), "
                  "or set NANOLM_LIB=/path/to/libnanolm.so. Looked in: "
                  + ", ".join(str(p) for p in paths) + " and the system loader's paths")


lib, path = _load()

c_float_p = ctypes.POINTER(ctypes.c_float)
c_int8_p = ctypes.POINTER(ctypes.c_int8)
c_uint8_p = ctypes.POINTER(ctypes.c_uint8)
c_int32_p = ctypes.POINTER(ctypes.c_int32)
i64 = ctypes.c_int64


def fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


fn("nl_last_error", ctypes.c_char_p)
fn("nl_clear_error", None)
fn("nl_status_name", ctypes.c_char_p, ctypes.c_int)
fn("nl_free", None, ctypes.c_void_p)
fn("nl_blas_core", ctypes.c_char_p)


def blas_kernels():
    """The kernels OpenBLAS runs in this process ("SkylakeX", "Haswell", ...). The nanolm CLI
    names AVX-512 / AVX2 ones where OpenBLAS falls back to "Prescott" on a CPU it does not know
    (nl_runtime_reexec); a Python process keeps OpenBLAS's choice unless OPENBLAS_CORETYPE was set
    before the library loaded."""
    return lib.nl_blas_core().decode()


def last_error():
    """nl_last_error() of this thread, as str."""
    return lib.nl_last_error().decode("utf-8", "replace")


def check(status, what=""):
    """Raises the exception of a non-zero nl_status with the library's message."""
    if status == 0:
        return
    msg = last_error() or lib.nl_status_name(status).decode()
    if what:
        msg = f"{what}: {msg}"
    exc = _STATUS_EXC.get(status, Error)
    if exc is MemoryError:
        raise MemoryError(msg)
    raise exc(msg, status, lib.nl_status_name(status).decode())


# ---- array conversion ---------------------------------------------------------------------------


def to_numpy(x):
    """A torch tensor becomes its numpy view (CPU, detached); anything else goes to np.asarray."""
    if type(x).__module__.startswith("torch"):
        t = x.detach().cpu()
        try:
            return t.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): through fp32, exactly
            return t.float().numpy()
    return np.asarray(x)


def as_f32(x, what="x"):
    """The conversion rule for every float input: a float32 C-contiguous numpy array (or CPU
    torch tensor) is used as it is, without a copy; any other real dtype (float64, float16,
    integers, bool) or layout is converted with np.ascontiguousarray(x, dtype=np.float32)
    (round to nearest fp32); complex and object arrays are a TypeError."""
    a = to_numpy(x)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"nanolm: {what} must hold real numbers, got dtype {a.dtype}")
    if a.dtype == np.float32 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.float32)


def as_int(v, what, lo=-(1 << 63), hi=(1 << 63) - 1):
    """An integer argument checked before it reaches a C integer (which would truncate a float
    and wrap a negative or too large value silently): an int, a numpy integer or an integral
    float; bool, fractional, NaN and non-numbers are a TypeError, values outside [lo, hi] an
    InvalidError naming the argument."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, float, np.floating)):
        raise TypeError(f"nanolm: {what} must be an integer, got {v!r}")
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v) or not float(v).is_integer():
            raise TypeError(f"nanolm: {what} must be an integer, got {v!r}")
    v = int(v)
    if v < lo or v > hi:
        raise InvalidError(f"{what} must be in [{lo}, {hi}], got {v}", 1, "invalid argument")
    return v


def check_scales(s, what):
    """Scales handed to a dequantizer: positive and finite, as nl_quant_affine_codes requires
    (the codes' tensor is filled here, so the C check would not see them)."""
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        raise InvalidError(f"{what}: scale must be positive and finite, got {s.reshape(-1)[np.argmax(bad.reshape(-1))]:g}",
                           1, "invalid argument")
    return s


def fptr(a):
    return a.ctypes.data_as(c_float_p)


def cstr(s):
    return s.encode() if isinstance(s, str) else s
