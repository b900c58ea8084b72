"""nanolm.Model: a NanoLM checkpoint (safetensors, quantized safetensors, or llama2.c .bin) loaded by
libnanolm, with generate() and eval_loss().

    m = nanolm.Model.load("model.safetensors")          # byte tokenizer from the checkpoint
    m = nanolm.Model.load("stories260K.bin", tokenizer="tok512.bin")
    m.generate("Once upon a time", steps=64, temperature=0)
    m.eval_loss("text.txt")                               # mean nats/token, as `nanolm eval`

The C structs are opaque here: the binding reads only the leading fields of nl_model (the arch
and sizes) and hands the rest to the library by pointer.
"""
import ctypes
import os

import numpy as np

from . import _lib
from ._lib import check, cstr, fn, i64, lib

_PAD = 1 << 16  # bytes reserved for a C struct the binding only passes by pointer


class Arch(ctypes.Structure):
    """nl_arch (include/nanolm/arch.h)."""
    _fields_ = [("name", ctypes.c_char * 64), ("vocab_size", i64), ("dim", i64), ("n_layers", i64),
                ("n_heads", i64), ("n_kv_heads", i64), ("hidden_dim", i64), ("seq_len", i64),
                ("rope_theta", ctypes.c_double), ("norm_eps", ctypes.c_double), ("tied_embeddings", ctypes.c_int),
                ("n_experts", i64), ("n_shared_experts", i64), ("top_k", i64), ("expert_hidden_dim", i64),
                ("first_moe_layer", i64), ("head_dim", i64), ("q_lora_rank", i64), ("kv_lora_rank", i64),
                ("qk_rope_head_dim", i64), ("v_head_dim", i64), ("qkv_bias", ctypes.c_int),
                ("rope_scaling_factor", ctypes.c_double), ("rope_low_freq_factor", ctypes.c_double),
                ("rope_high_freq_factor", ctypes.c_double), ("rope_original_max_pos", i64)]


fn("nl_arch_sizeof", ctypes.c_size_t)
fn("nl_arch_last_offset", ctypes.c_size_t)
if (ctypes.sizeof(Arch) != lib.nl_arch_sizeof() or
        Arch.rope_original_max_pos.offset != lib.nl_arch_last_offset()):
    raise ImportError("nanolm: python/nanolm/model.py's Arch does not match nl_arch in include/nanolm/arch.h "
                      f"({ctypes.sizeof(Arch)} vs {lib.nl_arch_sizeof()} bytes): update the binding")


class _ModelHead(ctypes.Structure):
    """The leading fields of nl_model (include/nanolm/model.h)."""
    _fields_ = [("arch", Arch), ("C", i64), ("L", i64), ("NH", i64), ("KVH", i64), ("hd", i64), ("H", i64),
                ("V", i64), ("QKV", i64), ("n_params", ctypes.c_size_t), ("params", _lib.c_float_p)]


class _TokHead(ctypes.Structure):
    """The leading fields of nl_tokenizer (include/nanolm/tokenizer.h)."""
    _fields_ = [("kind", ctypes.c_int), ("vocab_size", ctypes.c_int), ("bos_id", ctypes.c_int),
                ("eos_id", ctypes.c_int)]


_P = ctypes.c_void_p
_int_p = ctypes.POINTER(ctypes.c_int)
fn("nl_ckpt_load_model", ctypes.c_int, ctypes.c_char_p, _P, ctypes.c_char_p)
fn("nl_model_free", None, _P)
fn("nl_qmodel_is_quantized", ctypes.c_int, ctypes.c_char_p)
fn("nl_qmodel_load", ctypes.c_int, ctypes.c_char_p, _P, _P, ctypes.c_char_p)
fn("nl_qmodel_free", None, _P)
fn("nl_qmodel_size_bytes", ctypes.c_size_t, _P, _P, ctypes.POINTER(ctypes.c_size_t))
fn("nl_tokenizer_init_byte", ctypes.c_int, _P)
fn("nl_tokenizer_load_llama2c", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_int)
fn("nl_tokenizer_free", None, _P)
fn("nl_tokenizer_encode", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
   ctypes.POINTER(_int_p), ctypes.POINTER(i64))
fn("nl_tokenizer_piece", ctypes.c_void_p, _P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t))
fn("nl_tokenizer_piece_printable", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
fn("nl_decode_state_init", ctypes.c_int, _P, _P, ctypes.c_int)
fn("nl_decode_state_free", None, _P)
fn("nl_model_step", _lib.c_float_p, _P, _P, ctypes.c_int32, i64)
fn("nl_model_sample", ctypes.c_int32, _lib.c_float_p, i64, ctypes.c_float, _P)
fn("nl_rng_seed", None, _P, ctypes.c_uint64)
fn("nl_model_alloc_acts", ctypes.c_int, _P, i64, i64)
fn("nl_data_open", ctypes.c_int, _P, ctypes.c_char_p, _P)
fn("nl_data_free", None, _P)
fn("nl_eval_loss", ctypes.c_int, _P, _P, ctypes.c_int, i64, i64, i64, ctypes.POINTER(ctypes.c_double),
   ctypes.POINTER(i64))
fn("nl_eval_loss_tokens", ctypes.c_int, _P, _int_p, i64, i64, i64, ctypes.POINTER(ctypes.c_double),
   ctypes.POINTER(i64))

_SPLITS = {"train": 0, "val": 1, "all": 2}
_KV = {"fp32": 0, "int8": 1}


class _ModelOwner:
    """Owns an nl_model's memory: frees it when the last holder lets go, the Model or an array
    that views its parameters (Model.params), so a view outlives close() and collection."""

    def __init__(self, m):
        self.m = m

    def __del__(self):
        if self.m is not None:
            lib.nl_model_free(self.m)
            self.m = None


class _ParamsView:
    """The numpy array interface of the parameters; numpy keeps it (and its owner) as the base."""

    def __init__(self, owner, address, n):
        self._owner = owner
        self.__array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (address, False), "version": 3}


class Model:
    """A NanoLM model held by libnanolm. Build one with Model.load(path)."""

    def __init__(self, _m, tok, path):
        self._m = _m            # nl_model (opaque, padded)
        self._owner = _ModelOwner(_m)  # frees _m once neither this object nor a params view holds it
        self._tok = tok         # nl_tokenizer
        self._qm = None         # nl_qmodel while quantized
        self._acts = None       # (B, T) the activations are sized for
        self._kv = None         # element type of the decode state _dec holds
        self._dec = None        # nl_decode_state (opaque, padded) of generate(), made on first use
        self.path = path
        self.scheme = None      # quantization scheme name, None for fp32

    # ---- loading ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path, tokenizer=None):
        """Loads a checkpoint: a nanolm safetensors file (fp32 or quantized, `nanolm quant model
        --out`), or a llama2.c .bin (then `tokenizer` is its tokenizer file, e.g. tok512.bin).
        Errors: OSError (FileError, FormatError) naming the file; ValueError for a bad tokenizer."""
        path = os.fspath(path)
        m = ctypes.create_string_buffer(_PAD)
        kind = ctypes.create_string_buffer(64)
        qm = None
        if lib.nl_qmodel_is_quantized(cstr(path)):
            qm = ctypes.create_string_buffer(_PAD)
            check(lib.nl_qmodel_load(cstr(path), m, qm, kind), "Model.load")
        else:
            check(lib.nl_ckpt_load_model(cstr(path), m, kind), "Model.load")
        tok = ctypes.create_string_buffer(_PAD)
        head = ctypes.cast(m, ctypes.POINTER(_ModelHead)).contents
        try:
            if tokenizer is not None:
                check(lib.nl_tokenizer_load_llama2c(tok, cstr(os.fspath(tokenizer)), int(head.V)), "Model.load")
            elif kind.value == b"byte":
                check(lib.nl_tokenizer_init_byte(tok), "Model.load")
            elif kind.value in (b"", b"none"):
                tok = None  # a checkpoint without a tokenizer: token ids only
            else:
                raise _lib.InvalidError(f"Model.load: {path} uses the {kind.value.decode()} tokenizer: pass its "
                                        f"file with tokenizer=", 1, "invalid argument")
        except BaseException:
            if qm is not None:
                lib.nl_qmodel_free(qm)
            lib.nl_model_free(m)
            raise
        self = cls(m, tok, path)
        if qm is not None:
            self._qm = qm
            self.scheme = "quantized"
        return self

    def close(self):
        """Frees the C model now (also done when the object is collected)."""
        if getattr(self, "_m", None) is not None:
            if self._dec is not None:
                lib.nl_decode_state_free(self._dec)
                self._dec = None
                self._kv = None
            if self._qm is not None:
                lib.nl_qmodel_free(self._qm)
                self._qm = None
            if self._tok is not None:
                lib.nl_tokenizer_free(self._tok)
            self._m = None
            self._owner = None  # the model's memory goes now, or with the last params view

    def __del__(self):
        self.close()

    def _alive(self):
        if self._m is None:
            raise ValueError("nanolm: the model was closed")
        return self._m

    @property
    def _head(self):
        return ctypes.cast(self._alive(), ctypes.POINTER(_ModelHead)).contents

    # ---- facts ---------------------------------------------------------------------------------
    @property
    def arch(self):
        """The model's shape as a dict (nl_arch's fields)."""
        a = self._head.arch
        d = {k: getattr(a, k) for k, _ in Arch._fields_}
        d["name"] = a.name.decode()
        return d

    @property
    def vocab_size(self):
        return int(self._head.V)

    @property
    def n_params(self):
        """Number of fp32 parameters (nl_model.n_params)."""
        return int(self._head.n_params)

    @property
    def params(self):
        """The flat fp32 parameter vector (n_params,), a numpy view of the model's memory (no copy);
        the view keeps that memory alive after close() or the model's collection."""
        h = self._head
        if not h.n_params:
            return np.zeros(0, np.float32)
        addr = ctypes.cast(h.params, ctypes.c_void_p).value
        return np.asarray(_ParamsView(self._owner, addr, int(h.n_params)))

    def __repr__(self):
        a = self._head.arch
        return (f"Model({self.path!r}, dim={a.dim}, layers={a.n_layers}, heads={a.n_heads}, "
                f"vocab={a.vocab_size}, params={self.n_params}, scheme={self.scheme or 'fp32'})")

    # ---- text ------------------------------------------------------------------------------------
    def encode(self, text, bos=True):
        """Token ids (int32 array) of text with the model's tokenizer (BOS when it has one)."""
        self._alive()
        if self._tok is None:
            raise _lib.InvalidError(f"{self.path} has no tokenizer: pass tokenizer= to Model.load, or token ids",
                                    1, "invalid argument")
        b = text.encode() if isinstance(text, str) else bytes(text)
        ids, n = _int_p(), i64()
        check(lib.nl_tokenizer_encode(self._tok, b, len(b), 1 if bos else 0, 0, ctypes.byref(ids),
                                      ctypes.byref(n)), "encode")
        try:
            return np.ctypeslib.as_array(ids, shape=(n.value,)).astype(np.int32) if n.value else \
                np.zeros(0, np.int32)
        finally:
            lib.nl_free(ids)

    def _piece(self, prev, token):
        ln = ctypes.c_size_t()
        p = lib.nl_tokenizer_piece(self._tok, int(prev), int(token), ctypes.byref(ln))
        if not p:
            check(1, "generate")
        return p, ln.value

    def generate(self, prompt, steps=256, temperature=1.0, seed=1337, kv_cache="fp32"):
        """Continues prompt token by token through the KV cache, exactly as `nanolm generate`
        (same defaults; steps counts positions including the prompt, at most seq_len; temperature
        0 is greedy). Returns the text (prompt included, as the CLI prints it)."""
        m = self._alive()
        ids = self.encode(prompt)
        if kv_cache not in _KV:
            raise _lib.InvalidError(f"generate: unknown kv_cache {kv_cache!r} (known: fp32, int8)", 1,
                                    "invalid argument")
        if temperature < 0:
            raise _lib.InvalidError(f"generate: temperature must be >= 0, got {temperature}", 1, "invalid argument")
        h = self._head
        if len(ids) < 1:
            raise _lib.InvalidError("generate: the prompt is empty (the byte tokenizer needs at least one byte)", 1,
                                    "invalid argument")
        if len(ids) > h.arch.seq_len:
            raise _lib.InvalidError(f"generate: the prompt is {len(ids)} tokens, longer than the model's seq_len "
                                    f"{h.arch.seq_len}", 1, "invalid argument")
        steps = min(_lib.as_int(steps, "generate: steps", 0), int(h.arch.seq_len))
        seed = _lib.as_int(seed, "generate: seed", 0, (1 << 64) - 1)
        if not np.isfinite(temperature):
            raise _lib.InvalidError(f"generate: temperature must be finite, got {temperature}", 1, "invalid argument")
        if self._kv != kv_cache:
            if self._dec is not None:
                lib.nl_decode_state_free(self._dec)
                self._dec, self._kv = None, None
            dec = ctypes.create_string_buffer(_PAD)
            check(lib.nl_decode_state_init(dec, m, _KV[kv_cache]), "generate")
            self._dec, self._kv = dec, kv_cache
        rng = ctypes.create_string_buffer(32)
        lib.nl_rng_seed(rng, int(seed))
        bos = ctypes.cast(self._tok, ctypes.POINTER(_TokHead)).contents.bos_id
        out = bytearray()
        token = int(ids[0])
        if bos < 0:
            p, ln = self._piece(-1, token)
            out += ctypes.string_at(p, ln)
        pos = 0
        while pos < steps:
            logits = lib.nl_model_step(m, self._dec, token, pos)
            if not logits:
                check(1, "generate")
            if pos < len(ids) - 1:
                nxt = int(ids[pos + 1])
            else:
                nxt = lib.nl_model_sample(logits, h.V, float(temperature), rng)
            pos += 1
            if bos >= 0 and nxt == bos:
                break
            p, ln = self._piece(token, nxt)
            if lib.nl_tokenizer_piece_printable(p, ln):
                out += ctypes.string_at(p, ln)
            token = nxt
        return out.decode("utf-8", "replace")

    def eval_loss(self, data, batch=4, seq=None, split="all", max_windows=0):
        """Mean cross-entropy in nats/token, as `nanolm eval`: consecutive windows of seq tokens
        (default the model's seq_len), batch windows per forward. data: a text file's path (read
        with the model's tokenizer; split "all", "train" = first 90%, "val" = last 10%) or an
        array of token ids (all of it). The first call sizes the activations for (batch, seq)."""
        m = self._alive()
        h = self._head
        T = _lib.as_int(seq or h.arch.seq_len, "eval_loss: seq", 1)
        if T > h.arch.seq_len:
            raise _lib.InvalidError(f"eval_loss: seq {T} exceeds the model's seq_len {h.arch.seq_len}", 1,
                                    "invalid argument")
        B = _lib.as_int(batch, "eval_loss: batch", 1)
        max_windows = _lib.as_int(max_windows, "eval_loss: max_windows", 0)
        if self._acts is None:
            check(lib.nl_model_alloc_acts(m, B, T), "eval_loss")
            self._acts = (B, T)
        elif B > self._acts[0] or T > self._acts[1]:
            raise _lib.InvalidError(f"eval_loss: this model's activations are sized for batch {self._acts[0]}, "
                                    f"seq {self._acts[1]} by its first eval; got batch {B}, seq {T}", 1,
                                    "invalid argument")
        loss, n = ctypes.c_double(), i64()
        if isinstance(data, (str, os.PathLike)):
            if split not in _SPLITS:
                raise _lib.InvalidError(f"eval_loss: unknown split {split!r} (known: all, train, val)", 1,
                                        "invalid argument")
            if self._tok is None:
                self.encode("")  # raises: no tokenizer to read a text file with
            d = ctypes.create_string_buffer(_PAD)
            check(lib.nl_data_open(d, cstr(os.fspath(data)), self._tok), "eval_loss")
            try:
                check(lib.nl_eval_loss(m, d, _SPLITS[split], B, T, int(max_windows), ctypes.byref(loss),
                                       ctypes.byref(n)), "eval_loss")
            finally:
                lib.nl_data_free(d)
        else:
            toks = _lib.to_numpy(data)
            if toks.dtype.kind not in "iu":
                raise TypeError(f"nanolm: eval_loss: token ids must be integers, got dtype {toks.dtype}")
            toks = np.ascontiguousarray(toks.reshape(-1), dtype=np.intc)
            check(lib.nl_eval_loss_tokens(m, toks.ctypes.data_as(_int_p), toks.size, B, T, ctypes.byref(loss),
                                          ctypes.byref(n)), "eval_loss")
        return loss.value

    # ---- size ------------------------------------------------------------------------------------
    def size_bytes(self):
        """Exact bytes of the parameters as stored (quantized linear weights when quantized)."""
        return int(lib.nl_qmodel_size_bytes(self._alive(), self._qm, None))
