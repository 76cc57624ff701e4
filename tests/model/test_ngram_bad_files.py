"""Hostile n-gram files (`chat --ngram`): each fails with a FormatError, fast and in little memory, where it used
to end in RecursionError, MemoryError or AttributeError."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.limits import run_limited

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")

LOAD = """
from minillama.errors import FormatError
from minillama.ngram import NGramModel
try:
    NGramModel.load(sys.argv[1])
except FormatError as e:
    print("FormatError:", e)
"""


def _meta(**changes: object) -> np.ndarray:
    meta = {"format": "minillama-ngram", "version": 1, "smoothing": "witten-bell", "order": 1, "n_vocab": 10,
            "n_tokens": 1, "n_sequences": 1, "tokenizer": {}}
    meta.update(changes)
    return np.frombuffer(json.dumps(meta).encode(), np.uint8)


def _table0() -> dict[str, np.ndarray]:
    return {"ctx0": np.zeros((1, 0), np.int32), "off0": np.array([0, 1], np.int64),
            "next0": np.array([3], np.int32), "count0": np.array([1], np.int64)}


def _npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def _fails_cleanly(path: Path, expect: str, mem_mb: int = 1024) -> None:
    p = run_limited(LOAD, mem_mb=mem_mb, timeout=30, args=[str(path)])
    assert p.returncode == 0 and p.stdout.decode().startswith("FormatError:"), p.stderr.decode()[-800:]
    assert expect in p.stdout.decode(), p.stdout.decode()


def test_deeply_nested_meta(tmp_path: Path) -> None:
    deep = np.frombuffer(b"[" * 100_000 + b"]" * 100_000, np.uint8)
    _fails_cleanly(_npz(tmp_path / "deep.npz", {"meta": deep, **_table0()}), "nested too deep")


def test_huge_order_is_checked_before_allocating(tmp_path: Path) -> None:
    _fails_cleanly(_npz(tmp_path / "order.npz", {"meta": _meta(order=10**8), **_table0()}),
                   "expected 400000001 members for order 100000000", mem_mb=512)


def test_forged_npy_header(tmp_path: Path) -> None:
    path = _npz(tmp_path / "forged.npz", {"meta": _meta(), **_table0()})
    with zipfile.ZipFile(path, "a") as zf:
        header = b"\x93NUMPY\x01\x00" + b"v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000,), }"
        zf.writestr("extra.npy", header.ljust(200, b" ") + b"\n")
    _fails_cleanly(path, "to hold 8000000000")


def test_zip_bomb(tmp_path: Path) -> None:
    n = 400_000_000  # 400 MB of zeros in ~0.4 MB of deflate
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, a in {"meta": _meta(), **_table0()}.items():
            if name != "next0":
                zf.writestr(name + ".npy", _npy_bytes(a))
        with zf.open("next0.npy", "w", force_zip64=True) as f:
            f.write(_npy_header(np.dtype(np.int8), (n,)))
            block = bytes(1 << 24)
            for _ in range(n // len(block)):
                f.write(block)
            f.write(bytes(n % len(block)))
    assert path.stat().st_size < 2 << 20
    _fails_cleanly(path, "expected arrays of at most")


def test_member_that_is_not_an_array(tmp_path: Path) -> None:
    path = _npz(tmp_path / "text.npz", {"meta": _meta(), **_table0()})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("notes.txt", "hello")
    _fails_cleanly(path, "expected only .npy members, found 'notes.txt'")


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype.str, "fortran_order": False, "shape": shape})
    return b"\x93NUMPY\x01\x00" + buf.getvalue() if not buf.getvalue().startswith(b"\x93") else buf.getvalue()


def _npy_bytes(a: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.mark.parametrize("order", [1, 3])
def test_real_models_still_load(tmp_path: Path, order: int) -> None:
    from minillama.ngram import NGramModel
    from minillama.tokenizer import Tokenizer, default_vocab_path
    tok = Tokenizer.from_file(default_vocab_path())
    corpus = tmp_path / "c.txt"
    corpus.write_text("the llama eats grass.\n\nthe alpaca eats hay.\n" * 20)
    lm = NGramModel.train_files(tok, [corpus], order=order)
    lm.save(tmp_path / "m.npz")
    assert NGramModel.load(tmp_path / "m.npz", tok).n_tokens == lm.n_tokens
