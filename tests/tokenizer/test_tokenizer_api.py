"""The public API contract of minillama.tokenizer.Tokenizer: errors, sniffing, the packaged default vocab.

Uses the small Hugging Face-built GGUF (the hf_bpe fixture) and the package's default vocab; no shared/ needed
(except the llama2.c sniffing test and the oracle test, which skip without it).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from pathlib import Path

import pytest
from support.fixtures import write_gpt2_gguf
from support.oracle import get_oracle
from support.paths import load_file, release_tokenizers, vocab_path

from minillama.errors import (
    ArgumentError,
    ArgumentTypeError,
    FormatError,
    InputError,
    MinillamaError,
    UnsupportedError,
)
from minillama.tokenizer import Tokenizer, default_vocab_path


@pytest.fixture(scope="module")
def tok(hf_bpe):
    yield load_file(hf_bpe.path)
    release_tokenizers()


# ---------------------------------------------------------------------------------------------------------------------
# decode of invalid ids
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["decode", "decode_bytes"])
@pytest.mark.parametrize("offset", [0, 7, 10**6, 2**40])  # 2**40: past any C int
def test_decode_id_too_large(tok, method, offset):
    bad_id = tok.n_vocab + offset
    with pytest.raises(ValueError) as ei:
        getattr(tok, method)([1, 2, bad_id, 3])
    msg = str(ei.value)
    assert str(bad_id) in msg, msg
    assert str(tok.n_vocab) in msg, msg


@pytest.mark.parametrize("method", ["decode", "decode_bytes"])
@pytest.mark.parametrize("bad_id", [-1, -12345])
def test_decode_negative_id(tok, method, bad_id):
    with pytest.raises(ValueError) as ei:
        getattr(tok, method)([bad_id])
    msg = str(ei.value)
    assert str(bad_id) in msg, msg
    assert str(tok.n_vocab) in msg, msg


def test_decode_last_valid_id(tok):
    assert isinstance(tok.decode_bytes([tok.n_vocab - 1, 0]), bytes)


# ---------------------------------------------------------------------------------------------------------------------
# files that are not tokenizers
# ---------------------------------------------------------------------------------------------------------------------

def _assert_format_error(path: Path) -> FormatError:
    with pytest.raises(FormatError) as ei:
        Tokenizer.from_file(str(path))
    assert isinstance(ei.value, MinillamaError)
    return ei.value


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    _assert_format_error(p)


@pytest.mark.parametrize("name", ["random.gguf", "tokenizer.bin", "noext"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes(tmp_path, name, seed):
    p = tmp_path / name
    data = random.Random(seed).randbytes(4096 * (seed + 1))
    p.write_bytes(data)
    _assert_format_error(p)


def test_text_file(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("This is a plain text file, not a tokenizer.\n" * 20, encoding="utf-8")
    _assert_format_error(p)


def test_bad_magic(tmp_path, hf_bpe):
    data = bytearray(hf_bpe.path.read_bytes())
    data[:4] = b"GGUX"
    p = tmp_path / "badmagic.gguf"
    p.write_bytes(bytes(data))
    _assert_format_error(p)


def _kv_end(path: Path) -> int:
    """Where the key/value section of a tensor-less GGUF ends (before alignment padding)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    last = max(r.fields.values(), key=lambda f: f.offset)
    return last.offset + sum(int(p.nbytes) for p in last.parts)


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0])
def test_truncated_gguf(tmp_path, hf_bpe, fraction):
    data = hf_bpe.path.read_bytes()
    end = _kv_end(hf_bpe.path)
    assert 0 < end <= len(data)
    cut = max(1, min(end - 1, int(end * fraction)))  # always at least 1 byte short of complete metadata
    p = tmp_path / "truncated.gguf"
    p.write_bytes(data[:cut])
    _assert_format_error(p)


def test_header_only_gguf(tmp_path):
    """Magic + version + counts claiming many key/values that are not there."""
    p = tmp_path / "header.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1000))
    _assert_format_error(p)


def test_huge_array_length(tmp_path):
    """A string array that claims far more items than the file holds fails cleanly (no memory bomb)."""
    key = b"tokenizer.ggml.tokens"
    body = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 2**60)  # ARRAY of STRING, 2**60 items
    p = tmp_path / "huge.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)
    _assert_format_error(p)


def test_gguf_without_tokenizer(tmp_path):
    """A valid GGUF that has no tokenizer in it is not a tokenizer file."""
    import gguf

    p = tmp_path / "no-tokenizer.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_format_error(p)


def test_missing_file(tmp_path):
    with pytest.raises((OSError, MinillamaError)):
        Tokenizer.from_file(str(tmp_path / "does-not-exist.gguf"))


# ---------------------------------------------------------------------------------------------------------------------
# unsupported but valid
# ---------------------------------------------------------------------------------------------------------------------

def test_unknown_pre_tokenizer(tmp_path, hf_bpe):
    name = "no-such-pretokenizer-42"
    p = tmp_path / "unknown-pre.gguf"
    write_gpt2_gguf(p, hf_bpe.hf, pre=name)
    with pytest.raises(UnsupportedError) as ei:
        Tokenizer.from_file(str(p))
    assert name in str(ei.value)
    assert isinstance(ei.value, MinillamaError)


# ---------------------------------------------------------------------------------------------------------------------
# sniffing by content, GGUF v2
# ---------------------------------------------------------------------------------------------------------------------

def _hf_ids(hf_bpe, text):
    return hf_bpe.hf.encode(text).ids


@pytest.mark.parametrize("name", ["tokenizer.bin", "model", "vocab.txt"])
def test_gguf_sniffed_by_content(tmp_path, hf_bpe, name):
    p = tmp_path / name
    shutil.copyfile(hf_bpe.path, p)
    t = Tokenizer.from_file(str(p))
    assert t.kind == "bpe" and t.model == "bpe"  # `model`: the older name, kept for the scripts that call it
    text = "Hello world, it's 2024!"
    assert t.encode(text, add_special=False) == _hf_ids(hf_bpe, text)


def test_from_file_accepts_pathlike(hf_bpe):
    t = Tokenizer.from_file(Path(hf_bpe.path))
    assert t.encode("Hello world", add_special=False) == _hf_ids(hf_bpe, "Hello world")


def test_gguf_v2(tmp_path, hf_bpe):
    """GGUF v2 has the v3 layout (64-bit counts, little-endian): the same file with version 2 must load."""
    data = bytearray(hf_bpe.path.read_bytes())
    assert data[:4] == b"GGUF" and struct.unpack_from("<I", data, 4)[0] == 3
    struct.pack_into("<I", data, 4, 2)
    p = tmp_path / "v2.gguf"
    p.write_bytes(bytes(data))
    t = Tokenizer.from_file(str(p))
    text = "GGUF version two, still fine."
    assert t.encode(text, add_special=False) == _hf_ids(hf_bpe, text)


def test_llama2c_sniffed_by_content(tmp_path):
    src = vocab_path("llama2c-tokenizer.bin")
    p = tmp_path / "weird-name.gguf"
    shutil.copyfile(src, p)
    t = Tokenizer.from_file(str(p))
    assert t.n_vocab == 32000
    assert t.kind == "spm"
    # llama.cpp (llama-spm vocab): "Hello world" -> [15043, 3186]
    assert t.encode("Hello world", add_special=False) == [15043, 3186]


# ---------------------------------------------------------------------------------------------------------------------
# the packaged default vocab
# ---------------------------------------------------------------------------------------------------------------------

def test_default_vocab():
    path = default_vocab_path()
    assert isinstance(path, str)
    assert os.path.isfile(path)
    t = Tokenizer.from_file(path)
    assert t.n_vocab > 256
    assert t.kind == "bpe"
    assert isinstance(t.pre, str) and t.pre
    for text in ["Hello world", "It's 2024 -- naïve café, 日本語 🦙\n\tend"]:
        ids = t.encode(text, add_special=False)
        assert all(isinstance(i, int) and 0 <= i < t.n_vocab for i in ids)
        assert t.decode(ids) == text  # byte-level BPE is lossless (no space clean-up needed here)


def test_default_vocab_matches_llamacpp():
    """llama.cpp loads the packaged vocab and tokenizes like minillama (skips without the oracle)."""
    o = get_oracle(default_vocab_path())
    t = Tokenizer.from_file(default_vocab_path())
    assert t.n_vocab == o.n_vocab
    texts = ["Hello world", " Hello  world\n", "It's 2024 -- naïve café, 日本語 🦙", "<|endoftext|> after"]
    for text in texts:
        for add_special, parse_special in [(False, False), (True, False), (True, True)]:
            assert t.encode(text, add_special, parse_special) == o.tokenize(text, add_special, parse_special), (
                text, add_special, parse_special)


# ---------------------------------------------------------------------------------------------------------------------
# pieces and special ids
# ---------------------------------------------------------------------------------------------------------------------

def test_token_to_piece_returns_bytes(tok):
    for i in range(tok.n_vocab):
        for special in (True, False):
            assert isinstance(tok.token_to_piece(i, special=special), bytes), (i, special)


def test_special_token_piece(tok, hf_bpe):
    """A control token renders as its text with special=True and as nothing with special=False (llama.cpp)."""
    assert tok.token_to_piece(hf_bpe.eot_id, special=True) == b"<|endoftext|>"
    assert tok.token_to_piece(hf_bpe.eot_id, special=False) == b""


def test_eos_is_eog(tok, hf_bpe):
    assert tok.eos_id == hf_bpe.eot_id
    assert tok.is_eog(tok.eos_id)
    normal = hf_bpe.hf.token_to_id("a")
    assert not tok.is_eog(normal)


def test_properties(tok, hf_bpe):
    assert tok.n_vocab == hf_bpe.vocab_size
    assert tok.kind == "bpe"
    assert tok.pre == "gpt-2"
    assert tok.bos_id == hf_bpe.eot_id  # the GGUF sets bos = eos = <|endoftext|>, as GPT-2's converter does


def test_encode_returns_list_of_int(tok, hf_bpe):
    ids = tok.encode("Hello world")
    assert isinstance(ids, list)
    assert all(type(i) is int for i in ids)
    # tokenizer.ggml.add_bos_token is False in this GGUF: llama.cpp adds nothing even with add_special=True
    assert ids == _hf_ids(hf_bpe, "Hello world")
    assert tok.encode("") == []
    assert tok.encode("", add_special=False) == []


def test_from_file_with_bad_paths(tmp_path: Path) -> None:
    for bad in (None, 123, 1.5, ["x"]):
        with pytest.raises(ArgumentTypeError, match="expected a path"):
            Tokenizer.from_file(bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="without NUL"):
        Tokenizer.from_file("a\0b")
    with pytest.raises(InputError, match="found no such file"):
        Tokenizer.from_file(tmp_path / "missing.gguf")
    with pytest.raises(InputError, match="found a directory"):
        Tokenizer.from_file(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="found a FIFO"):  # open() on a FIFO would wait for a writer forever
        Tokenizer.from_file(fifo)
    assert issubclass(InputError, MinillamaError) and issubclass(InputError, OSError)


def test_decode_refuses_unordered_ids() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    for bad in ({1, 2}, {1: 2}, frozenset([3])):
        with pytest.raises(ArgumentTypeError, match="in order"):
            tok.decode(bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        tok.decode(True)  # type: ignore[arg-type]
