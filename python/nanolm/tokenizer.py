"""nanolm.Tokenizer: a tokenizer held by libnanolm, loaded on its own.

    tok = nanolm.Tokenizer.load("path/to/hf-model-folder")   # its tokenizer.json
    tok = nanolm.Tokenizer.load("tokenizer.json")            # byte-level or SentencePiece-style BPE
    tok = nanolm.Tokenizer.load("tok512.bin")                # llama2.c tokenizer
    tok = nanolm.Tokenizer.load("model.gguf")                # the tokenizer stored in a GGUF file
    tok = nanolm.Tokenizer.load("byte")                      # 256 bytes
    ids = tok.encode("Hello world")                          # [int]
    tok.decode(ids)                                          # "Hello world"
    tok.pieces(ids)                                          # vocabulary spellings: ["Hello", "Ġworld"]

The same encoder as `nanolm tokenize`, `nanolm generate` and the server (pre-tokenizer Splits in
sequence, as DeepSeek-V3's; Gemma 3's normalizer and Split; GGUF's tokenizer.ggml.* keys).
"""
import ctypes
import os

from ._lib import check, cstr, fn, i64, lib

_PAD = 1 << 12  # bytes reserved for nl_tokenizer, passed by pointer
_P = ctypes.c_void_p
_int_p = ctypes.POINTER(ctypes.c_int)


class _TokHead(ctypes.Structure):
    """The leading fields of nl_tokenizer (include/nanolm/tokenizer.h)."""
    _fields_ = [("kind", ctypes.c_int), ("vocab_size", ctypes.c_int), ("bos_id", ctypes.c_int),
                ("eos_id", ctypes.c_int)]


fn("nl_hf_open_tokenizer", ctypes.c_int, ctypes.c_char_p, _P)
fn("nl_tokenizer_free", None, _P)
fn("nl_tokenizer_kind_name", ctypes.c_char_p, ctypes.c_int)
fn("nl_tokenizer_encode_special", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
   ctypes.c_int, ctypes.POINTER(_int_p), ctypes.POINTER(i64))
fn("nl_tokenizer_decode", ctypes.c_int, _P, _int_p, i64, ctypes.POINTER(ctypes.c_void_p),
   ctypes.POINTER(ctypes.c_size_t))
fn("nl_tokenizer_vocab_piece", ctypes.c_char_p, _P, ctypes.c_int)
fn("nl_tokenizer_lookup", ctypes.c_int, _P, ctypes.c_char_p)


class Tokenizer:
    """Text <-> token ids with libnanolm's tokenizers. Build one with Tokenizer.load(path)."""

    def __init__(self, _t, path):
        self._t = _t
        self.path = path

    @classmethod
    def load(cls, path):
        """Loads a tokenizer: a Hugging Face model folder (its tokenizer.json), a tokenizer.json,
        a llama2.c tokenizer.bin, a GGUF file, or "byte". Errors: OSError (FileError,
        FormatError) naming the file and the key."""
        path = os.fspath(path)
        t = ctypes.create_string_buffer(_PAD)
        check(lib.nl_hf_open_tokenizer(cstr(path), t), "Tokenizer.load")
        return cls(t, path)

    def close(self):
        """Frees the C tokenizer now (also done when the object is collected)."""
        if getattr(self, "_t", None) is not None:
            lib.nl_tokenizer_free(self._t)
            self._t = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _alive(self):
        if self._t is None:
            raise ValueError("nanolm.Tokenizer: used after close()")
        return self._t

    def _head(self):
        return ctypes.cast(self._alive(), ctypes.POINTER(_TokHead)).contents

    @property
    def vocab_size(self):
        return int(self._head().vocab_size)

    def __len__(self):
        return self.vocab_size

    @property
    def kind(self):
        """"byte", "llama2c" or "hf"."""
        return lib.nl_tokenizer_kind_name(self._head().kind).decode()

    @property
    def bos_id(self):
        """The BOS id, or None."""
        v = int(self._head().bos_id)
        return None if v < 0 else v

    @property
    def eos_id(self):
        """The EOS id, or None."""
        v = int(self._head().eos_id)
        return None if v < 0 else v

    def encode(self, text, bos=False, eos=False, special=False):
        """Token ids of text (str or bytes). bos/eos: add the tokenizer's BOS / EOS; special: match
        special tokens written in the text ("<|eot_id|>", "</s>") as those tokens (tokenizer.json;
        by default they are text, as a user's input should be)."""
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids = _int_p()
        n = i64()
        check(lib.nl_tokenizer_encode_special(self._alive(), b, len(b), int(bool(bos)), int(bool(eos)),
                                              int(bool(special)), ctypes.byref(ids), ctypes.byref(n)),
              "Tokenizer.encode")
        try:
            return [ids[i] for i in range(n.value)]
        finally:
            lib.nl_free(ids)

    def count(self, text, special=False):
        """How many tokens text encodes to (no BOS / EOS)."""
        return len(self.encode(text, special=special))

    def decode_bytes(self, ids):
        """The bytes a sequence of ids decodes to (BOS and EOS give none)."""
        ids = [int(i) for i in ids]
        arr = (ctypes.c_int * max(1, len(ids)))(*ids)
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        check(lib.nl_tokenizer_decode(self._alive(), arr, len(ids), ctypes.byref(out), ctypes.byref(n)),
              "Tokenizer.decode")
        try:
            return ctypes.string_at(out.value, n.value) if n.value else b""
        finally:
            lib.nl_free(out)

    def decode(self, ids, errors="replace"):
        """The text of a sequence of ids (bytes that are not UTF-8 handled by `errors`)."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def piece(self, token_id):
        """The vocabulary entry of an id as the tokenizer spells it ("Ġworld", "▁world"), or None."""
        p = lib.nl_tokenizer_vocab_piece(self._alive(), int(token_id))
        return None if p is None else p.decode("utf-8", "replace")

    def pieces(self, ids):
        return [self.piece(i) for i in ids]

    def token_to_id(self, piece):
        """The id of a vocabulary entry spelled exactly so, or None."""
        v = lib.nl_tokenizer_lookup(self._alive(), cstr(piece))
        return None if v < 0 else v

    def __repr__(self):
        if self._t is None:
            return "Tokenizer(closed)"
        return f"Tokenizer({self.path!r}, kind={self.kind}, vocab_size={self.vocab_size})"
