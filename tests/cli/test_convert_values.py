"""`convert` on files minillama itself loads whose values GGUF's narrow types cannot hold as written: each
converts (values kept, or read the way minillama reads them) or fails with one clear line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V
from gguf import GGUFWriter
from support import REPO

from minillama.gguffile import read_gguf
from minillama.tokenizer import Tokenizer, default_vocab_path
from minillama.tokenizer.formats import read_metadata

TEXT = "Hello, llamas! naïve 123"


def _write(path: Path, tweak: str) -> None:
    md = read_metadata(default_vocab_path())
    n = len(md["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), "llama")
    for k, v in md.items():
        if k == "tokenizer.ggml.tokens" or k == "tokenizer.ggml.merges":
            w.add_key_value(k, [t.encode("utf-8", "surrogateescape") for t in v], V.ARRAY, V.STRING)
        elif k == "tokenizer.ggml.token_type":
            types = [int(x) for x in v]
            if tweak == "types_u64":
                w.add_key_value(k, [2**64 - 1] + types[1:], V.ARRAY, V.UINT64)
            elif tweak == "types_float":
                w.add_key_value(k, [float(x) for x in types], V.ARRAY, V.FLOAT32)
            else:
                w.add_key_value(k, types, V.ARRAY, V.INT32)
        elif isinstance(v, (bool, np.bool_)):
            w.add_key_value(k, bool(v), V.BOOL)
        elif isinstance(v, (int, np.integer)) and k.startswith("tokenizer."):
            w.add_key_value(k, int(v), V.UINT32)
        elif isinstance(v, str) and k.startswith("tokenizer."):
            w.add_key_value(k, v, V.STRING)
    if tweak == "scores_f64":
        w.add_key_value("tokenizer.ggml.scores", [1e300] + [0.0] * (n - 1), V.ARRAY, V.FLOAT64)
    if tweak == "key_u64":
        w.add_key_value("tokenizer.ggml.odd", 2**64 - 1, V.UINT64)
    if tweak == "key_f64":
        w.add_key_value("tokenizer.ggml.odd", 1e300, V.FLOAT64)
    if tweak == "name_bytes":
        w.add_key_value("general.name", b"bad\xff\xfename", V.STRING)
    if tweak == "template_bytes":
        w.add_key_value("tokenizer.chat_template", b"{{ bos_token }}\xff", V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def _convert(src: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "minillama", "convert", str(src), str(out)], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("tweak, key, expected", [
    ("scores_f64", "tokenizer.ggml.scores", float("inf")),      # read as float32, as minillama reads it
    ("types_float", None, None),
    ("key_u64", "tokenizer.ggml.odd", 2**64 - 1),
    ("key_f64", "tokenizer.ggml.odd", 1e300),
    ("name_bytes", "general.name", "bad\udcff\udcfename"),
    ("template_bytes", "tokenizer.chat_template", "{{ bos_token }}\udcff"),
])
def test_odd_values_convert(tmp_path: Path, tweak: str, key: str | None, expected: object) -> None:
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    _write(src, tweak)
    p = _convert(src, out)
    assert p.returncode == 0, p.stderr
    assert Tokenizer.from_file(out).encode(TEXT) == Tokenizer.from_file(src).encode(TEXT)
    if key is not None:
        value = read_gguf(str(out), tensors=False).metadata[key]
        got = value[0] if key == "tokenizer.ggml.scores" else value
        assert got == expected


def test_token_types_beyond_int32_fail_clearly(tmp_path: Path) -> None:
    src = tmp_path / "src.gguf"
    _write(src, "types_u64")
    p = _convert(src, tmp_path / "out.gguf")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "expected int32 values" in p.stderr and "found 18446744073709551615 at index 0" in p.stderr
    assert not (tmp_path / "out.gguf").exists()
