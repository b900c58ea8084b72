"""nanolm: Python binding of libnanolm (scaling laws, number formats and quantization, parallelism
plans, the NanoLM transformer). A thin ctypes layer: every number comes from the C library.

    import nanolm
    nanolm.quant.quantize_symmetric([0.3, -0.5, 0.12, 1.5])     # codes 25, -42, 10, 127
    nanolm.formats.cast([257.0], "bf16")                          # 256
    m = nanolm.Model.load("model.safetensors"); m.generate("To be")
    tok = nanolm.Tokenizer.load("hf-model-folder"); tok.encode("Hello world")
    nanolm.plan.plan_train(model="llama3-8b", gpus=8)

Errors from the library raise nanolm.Error subclasses carrying nl_last_error()'s message:
ValueError for bad input (InvalidError, RangeError, UnsupportedError), OSError for files
(FileError, FormatError), MemoryError, NotImplementedError for an unwritten course exercise.
"""
from ._lib import (CommError, Error, FileError, FormatError, InvalidError, NotImplementedExercise,  # noqa: F401
                   NumericError, RangeError, UnsupportedError, blas_kernels, last_error)
from ._lib import path as library_path  # noqa: F401
from .model import Model  # noqa: F401
from .tokenizer import Tokenizer  # noqa: F401
from . import formats, plan, quant  # noqa: F401

__version__ = "0.1.0"
__all__ = ["Model", "Tokenizer", "formats", "plan", "quant", "Error", "InvalidError", "RangeError", "UnsupportedError",
           "FileError", "FormatError", "NumericError", "CommError", "NotImplementedExercise", "library_path",
           "blas_kernels"]
