"""Input files and streams that are not files: FIFOs, character devices, endless stdin, inputs over a size
bound, an n-gram order that would size a table from a number. Each is one clear error line from the command (or a MinillamaError from minillama.fileio), never a hang,
a traceback or an unbounded read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from minillama.errors import ArgumentError, InputError
from minillama.fileio import read_input
from minillama.ngram import NGramModel

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")


def _cli(*args: str, stdin=None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "minillama", *args], stdin=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def _one_line_error(p: subprocess.CompletedProcess, *expect: str) -> None:
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-600:]
    for e in expect:
        assert e in p.stderr, p.stderr


def test_fifo_as_model_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    _one_line_error(_cli("tokenize", "--model", str(fifo), "hi", timeout=30), "FIFO")


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
