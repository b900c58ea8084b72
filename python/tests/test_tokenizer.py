"""nanolm.Tokenizer: the ids and pieces `nanolm tokenize --json` prints for the same tokenizer
(a Hugging Face folder exported from stories260K, its tokenizer.json, the llama2.c tokenizer.bin,
"byte"; the GGUF export's tokenizer), decode(encode(x)) == x, special tokens only when asked, and the errors."""
import subprocess

import pytest

from conftest import cli_json, cli_path, data_path

import nanolm

TEXT = "Once upon a time, Lily saw a cat. \u00e9t\u00e9 \u6771\u4eac \U0001F642"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    exe = cli_path()
    if not exe:
        pytest.skip("the nanolm CLI was not found")
    d = tmp_path_factory.mktemp("tok") / "m"
    subprocess.run([exe, "export", "--ckpt", str(data_path("stories260K/stories260K.bin")), "--tokenizer",
                    str(data_path("stories260K/tok512.bin")), "--to", "hf", str(d)], check=True, capture_output=True)
    return d


def test_matches_the_cli(folder):
    for path in (folder, folder / "tokenizer.json", data_path("stories260K/tok512.bin")):
        tok = nanolm.Tokenizer.load(path)
        ref = cli_json("tokenize", "--tokenizer", path, "--text", TEXT)
        assert tok.encode(TEXT) == [t["id"] for t in ref["tokens"]]
        assert tok.pieces(tok.encode(TEXT)) == [t["piece"] for t in ref["tokens"]]
        assert tok.vocab_size == ref["vocab_size"] == len(tok) == 512
        assert tok.count(TEXT) == ref["n_tokens"]
        assert tok.decode(tok.encode(TEXT, bos=True)) == TEXT  # the dummy-prefix space goes after BOS
        tok.close()


def test_special_tokens_and_ids(folder):
    with nanolm.Tokenizer.load(folder) as tok:
        assert tok.kind == "hf" and tok.bos_id == 1 and tok.eos_id == 2
        plain = tok.encode("end</s>")
        special = tok.encode("end</s>", special=True)
        assert special[-1] == tok.eos_id and tok.eos_id not in plain  # a user's "</s>" is text by default
        assert tok.encode("x", bos=True)[0] == tok.bos_id
        assert tok.token_to_id("</s>") == 2 and tok.piece(2) == "</s>"
        assert tok.piece(10 ** 6) is None and tok.token_to_id("no such piece") is None
    with nanolm.Tokenizer.load("byte") as b:
        assert b.encode("caf\u00e9") == [99, 97, 102, 0xC3, 0xA9] and b.decode([104, 105]) == "hi"


def test_gguf(folder):
    exe = cli_path()
    g = folder.parent / "m.gguf"
    subprocess.run([exe, "export", "--ckpt", str(data_path("stories260K/stories260K.bin")), "--tokenizer",
                    str(data_path("stories260K/tok512.bin")), "--to", "gguf", str(g), "--dtype", "f32"],
                   check=True, capture_output=True)
    with nanolm.Tokenizer.load(g) as tok, nanolm.Tokenizer.load(data_path("stories260K/tok512.bin")) as ref:
        assert tok.encode(TEXT) == ref.encode(TEXT) and tok.vocab_size == 512
        assert tok.decode(tok.encode(TEXT, bos=True)) == TEXT


def test_errors(tmp_path):
    with pytest.raises(OSError, match="model.gguf"):
        nanolm.Tokenizer.load(tmp_path / "model.gguf")
    with pytest.raises(OSError):
        nanolm.Tokenizer.load(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    with pytest.raises(nanolm.FormatError, match="model.type"):
        nanolm.Tokenizer.load(bad)
    tok = nanolm.Tokenizer.load("byte")
    tok.close()
    with pytest.raises(ValueError, match="after close"):
        tok.encode("x")
