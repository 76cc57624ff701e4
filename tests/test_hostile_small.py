"""The smaller findings of the adversarial trial: each is a clear MinillamaError (or works), never a traceback,
hang or unbounded read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from minillama.errors import ArgumentError, ArgumentTypeError, InputError, MinillamaError
from minillama.fileio import read_input
from minillama.ngram import NGramModel
from minillama.tokenizer import Tokenizer, default_vocab_path
from minillama.tokenizer.train import train_bpe


def _cli(*args: str, stdin=None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "minillama", *args], stdin=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def _one_line_error(p: subprocess.CompletedProcess, *expect: str) -> None:
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-600:]
    for e in expect:
        assert e in p.stderr, p.stderr


def test_spm_training_on_text_with_nul(tmp_path: Path) -> None:
    tv = train_bpe(["hello\0world hello world\n" * 5], 300, kind="spm", min_frequency=1)
    tok = tv.tokenizer()
    assert tok.decode(tok.encode("hello\0world", add_special=False)) == "hello\0world"


def test_spm_training_with_tiny_character_coverage() -> None:
    tv = train_bpe(["日本語\n"], 300, kind="spm", character_coverage=0.1)
    tok = tv.tokenizer()
    assert tok.decode(tok.encode("日本語", add_special=False)) == "日本語"


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


def test_fifo_as_model_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    _one_line_error(_cli("tokenize", "--model", str(fifo), "hi", timeout=30), "FIFO")


def test_decode_refuses_unordered_ids() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    for bad in ({1, 2}, {1: 2}, frozenset([3])):
        with pytest.raises(ArgumentTypeError, match="in order"):
            tok.decode(bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        tok.decode(True)  # type: ignore[arg-type]


def test_bounded_reads(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(InputError, match="expected at most 1,000 bytes, found 1,001"):
        read_input(str(big), limit=1000)
    with pytest.raises(InputError, match="character device"):
        read_input("/dev/zero")


@pytest.mark.parametrize("args", [
    ["train", "--vocab-size", "300", "--out", "{tmp}/v.gguf", "/dev/zero"],
    ["ngram", "train", "--out", "{tmp}/m.npz", "/dev/zero"],
    ["bench", "/dev/zero"],
])
def test_devices_as_input_files(tmp_path: Path, args: list[str]) -> None:
    _one_line_error(_cli(*[a.format(tmp=tmp_path) for a in args], timeout=30), "'/dev/zero'", "character device")


def test_endless_stdin_is_refused() -> None:
    with open("/dev/zero", "rb") as zero:
        _one_line_error(_cli("tokenize", "-", stdin=zero, timeout=60), "expected at most")
    with open("/dev/zero", "rb") as zero:
        _one_line_error(_cli("train", "--no-progress", "--vocab-size", "300", "--out", os.devnull, "-", stdin=zero,
                             timeout=120), "expected a line break")


def test_ngram_order_is_bounded(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    _one_line_error(_cli("ngram", "train", "--order", "100000", "--out", str(tmp_path / "m.npz"), str(text)),
                    "--order expects a number from 1 to 16, found 100000")
    with pytest.raises(ArgumentError, match="expected an order from 1 to 16"):
        NGramModel(10**8, 100)
