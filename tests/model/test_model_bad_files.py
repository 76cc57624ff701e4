"""Hostile model files: Model.from_file checks a GGUF's hyper-parameters and tensor table as ggml
and llama.cpp do, before anything is sized by a metadata number, and every bad file is a FormatError.

The files are tiny llama models written with gguf's GGUFWriter, with one key given a hostile value or type, or a
tensor's data offset patched in the tensor table.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.limits import run_limited
from support.tiny_llama import VOCAB, block_tensors, write_model

from minillama.embedding import Embedding
from minillama.errors import FormatError
from minillama.model import Model

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")

gguf = pytest.importorskip("gguf")
V = gguf.GGUFValueType


def _offset_at(data: bytes, name: str) -> int:
    """Where tensor `name`'s data offset (u64) sits in the tensor table."""
    raw = name.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return at + 4 + 8 * n_dims + 4


def offset_of(path: Path, name: str) -> int:
    data = path.read_bytes()
    return struct.unpack_from("<Q", data, _offset_at(data, name))[0]


def set_offset(path: Path, name: str, offset: int) -> None:
    """Point tensor `name` at another data offset (relative to the data section), in place."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, _offset_at(bytes(data), name), offset)
    path.write_bytes(bytes(data))


def test_the_tiny_model_loads(tmp_path: Path) -> None:
    """The baseline the other files are one change away from."""
    m = Model.from_file(write_model(tmp_path / "ok.gguf", blocks=2))
    assert m.hparams.n_layer == 2 and m.logits([1, 2]).shape == (2, VOCAB)


def test_huge_block_count_fails_before_allocating(tmp_path: Path) -> None:
    """block_count = 2^31 in a small file: FormatError in a process limited to 512 MB (it built 9 x 2^31 tuples)."""
    path = write_model(tmp_path / "blocks.gguf", {"block_count": (2**31, V.UINT32)})
    assert path.stat().st_size < 100_000
    p = run_limited(f"""
from minillama.errors import FormatError
from minillama.model import Model
try:
    Model.from_file({str(path)!r})
except FormatError as e:
    print("FormatError:", e)
""", mem_mb=512, timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert "FormatError: llama.block_count is 2147483648, expected 1..512" in p.stdout.decode()


@pytest.mark.parametrize("blocks, n_layer, what", [(2, 1, "tensors of block 1"), (1, 2, "no tensors for block 1")])
def test_block_count_must_match_the_blk_tensors(tmp_path: Path, blocks: int, n_layer: int, what: str) -> None:
    """llama.cpp refuses a file whose tensors are not exactly those of block_count blocks."""
    path = write_model(tmp_path / "m.gguf", {"block_count": (n_layer, V.UINT32)}, blocks=blocks)
    with pytest.raises(FormatError, match=rf"block_count is {n_layer}, but the file holds tensors for {blocks} "
                                          rf"blocks \({what}\)") as e:
        Model.from_file(path)
    assert str(path) in str(e.value)


def test_overlapping_tensors_are_refused(tmp_path: Path) -> None:
    """Every block pointing at block 0's data made 2,000 layers ask for ~8 GB from a 5.6 MB file."""
    path = write_model(tmp_path / "overlap.gguf", blocks=2)
    for name in block_tensors(1):
        set_offset(path, name, offset_of(path, name.replace("blk.1.", "blk.0.")))
    with pytest.raises(FormatError, match=r"tensor blk\.[01]\.\w+\.weight \(bytes \d+\.\.\d+\) overlaps tensor "
                                          r"blk\.[01]\.\w+\.weight"):
        Model.from_file(path)


def test_a_tensor_inside_another_is_refused(tmp_path: Path) -> None:
    """Not only neighbours: a small tensor placed inside a larger one's bytes overlaps it."""
    path = write_model(tmp_path / "inside.gguf")
    set_offset(path, "output_norm.weight", offset_of(path, "token_embd.weight") + 256)
    with pytest.raises(FormatError, match=r"output_norm\.weight .*overlaps tensor token_embd\.weight"):
        Model.from_file(path)


def test_zero_heads_is_a_format_error(tmp_path: Path) -> None:
    """head_count = 0 gave ZeroDivisionError (the default head size is n_embd / n_head)."""
    path = write_model(tmp_path / "heads.gguf", {"attention.head_count": (0, V.UINT32)})
    with pytest.raises(FormatError, match=r"llama\.attention\.head_count is 0, expected 1\.\.4294967295"):
        Model.from_file(path)


@pytest.mark.parametrize("key, value, vtype, message", [
    ("block_count", 1.5, V.FLOAT32, r"block_count is 1\.5 of type FLOAT32, expected an integer type"),
    ("attention.head_count", float("nan"), V.FLOAT32, r"head_count is nan of type FLOAT32, expected an integer"),
    ("embedding_length", float("inf"), V.FLOAT64, r"embedding_length is inf of type FLOAT64, expected an integer"),
    ("context_length", 2**63, V.UINT64, r"context_length is 9223372036854775808, expected 1\.\.4294967295"),
    ("attention.head_count_kv", "2", V.STRING, r"head_count_kv is '2' of type STRING, expected an integer type"),
    ("attention.layer_norm_rms_epsilon", float("nan"), V.FLOAT32, r"epsilon is nan, expected a finite number >= 0"),
    ("rope.freq_base", float("inf"), V.FLOAT32, r"freq_base is inf, expected a finite number > 0"),
])
def test_hyperparameters_need_their_type_and_bounds(tmp_path: Path, key: str, value: object, vtype: object,
                                                   message: str) -> None:
    """NaN, inf, 1.5 or 2^63 in an integer key raised ValueError/OverflowError or were silently truncated."""
    path = write_model(tmp_path / "key.gguf", {key: (value, vtype)})
    with pytest.raises(FormatError, match=message) as e:
        Model.from_file(path)
    assert f"key 'llama.{key}'" in str(e.value)


def test_empty_token_embedding_is_refused(tmp_path: Path) -> None:
    """A token_embd with 0 rows loaded, and then every prompt failed."""
    path = write_model(tmp_path / "empty.gguf", n_vocab=0, tokens=None)
    with pytest.raises(FormatError, match=r"token_embd\.weight has shape \[32, 0\], expected \[32, n_vocab\] "
                                          "with n_vocab of at least 1"):
        Model.from_file(path)


def test_vocab_size_must_match_token_embd(tmp_path: Path) -> None:
    """llama.cpp creates token_embd as [n_embd, n_vocab] from the vocab and refuses another shape."""
    path = write_model(tmp_path / "vocab.gguf", tokens=VOCAB + 3)
    with pytest.raises(FormatError, match=rf"the vocab has {VOCAB + 3} tokens but token_embd\.weight has {VOCAB} "
                                          "rows"):
        Model.from_file(path)


def test_unaligned_offsets_fail_in_model_as_in_embedding(tmp_path: Path) -> None:
    """Model.from_file accepted a token_embd offset that Embedding.from_file refused: now one check for both."""
    path = write_model(tmp_path / "unaligned.gguf")
    set_offset(path, "token_embd.weight", offset_of(path, "token_embd.weight") + 4)
    message = r"token_embd\.weight data offset \d+ is not a multiple of the alignment 32"
    with pytest.raises(FormatError, match=message):
        Embedding.from_file(path)
    with pytest.raises(FormatError, match=message):
        Model.from_file(path)


# --- non-finite activations ---------------------------------------------------------------------

KD = 256  # one K-quant block per row


def write_kquant_model(path: Path, qtype: int, nan_norm: bool = False, random_bytes: bool = False) -> Path:
    """A tiny llama GGUF (n_embd 256, 4 heads, 2 blocks) whose matrices are of ggml type qtype: random bytes with
    moderate float16 scales, or (random_bytes) random bytes throughout, scales included (NaN, infinities, 65504);
    nan_norm: block 0's attn_norm holds a NaN."""
    rng = np.random.default_rng(qtype)
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)][1]
    w = gguf.GGUFWriter(str(path), "llama")
    keys = {"block_count": 2, "context_length": 64, "embedding_length": KD, "feed_forward_length": KD,
            "attention.head_count": 4, "attention.head_count_kv": 2}
    for key, value in keys.items():
        w.add_key_value(f"llama.{key}", value, V.UINT32)
    w.add_key_value("llama.attention.layer_norm_rms_epsilon", 1e-5, V.FLOAT32)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "\u2581", "t", "1", "2"] + [f"t{i}" for i in range(7, VOCAB)])
    w.add_tensor("token_embd.weight", rng.standard_normal((VOCAB, KD)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(KD, np.float32))

    def matrix(name: str, rows: int) -> None:
        b = rng.integers(0, 256, (rows, size), dtype=np.uint8)
        if not random_bytes:  # d and dmin (Q4_K, Q5_K: the block's first two float16) moderate
            b[:, 0:4] = rng.uniform(0.001, 0.01, (rows, 2)).astype("<f2").view(np.uint8).reshape(rows, 4)
        w.add_tensor(name, b, raw_dtype=gguf.GGMLQuantizationType(qtype))

    for il in range(2):
        norm = np.ones(KD, np.float32)
        if nan_norm and il == 0:
            norm[37] = np.nan
        w.add_tensor(f"blk.{il}.attn_norm.weight", norm)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", np.ones(KD, np.float32))
        for name, rows in (("attn_q", KD), ("attn_k", KD // 2), ("attn_v", KD // 2), ("attn_output", KD),
                           ("ffn_gate", KD), ("ffn_up", KD), ("ffn_down", KD)):
            matrix(f"blk.{il}.{name}.weight", rows)
    matrix("output.weight", VOCAB)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


#: In a child (a crash in the kernels fails the test, not pytest): the model's error on a prompt, a step, a batch of
#: steps and hidden(), as JSON [class, message] each ([None, None]: no error).
_NONFINITE_CHILD = """
import json, sys
from minillama.model import Model
from minillama.generate import Sampler
m = Model.from_file(sys.argv[1], threads=2)
def err(f):
    try:
        f()
        return [None, None]
    except Exception as e:
        return [type(e).__name__, str(e)]
def batch():
    s = m.session(batched=True)
    return s.next_token([1, 2, 3], Sampler(temperature=0))
print(json.dumps([err(lambda: m.logits([1, 2, 3])), err(lambda: m.next_token([4, 5], Sampler(temperature=0))),
                  err(batch), err(lambda: m.hidden([1, 2]))]))
"""


@pytest.mark.parametrize("qtype,what", [(12, "nan_norm"), (13, "random_bytes")], ids=["Q4_K-nan-norm", "Q5_K-bytes"])
def test_nonfinite_activations_are_one_error_on_both_backends(tmp_path: Path, qtype: int, what: str) -> None:
    """A Q4_K model whose attn_norm holds a NaN, a Q5_K model of random bytes: the native forward pass crashed (the
    AVX2 Q8_K quantizer ran off the row looking for a NaN block's max) or printed text where the pure one stopped;
    now both raise NonFiniteError with the same message, whatever runs the pass."""
    from minillama.errors import NonFiniteError

    path = write_kquant_model(tmp_path / f"{what}.gguf", qtype, **{what: True})
    got = {}
    for backend in ("native", "pure"):
        env = dict(os.environ, MINILLAMA_BACKEND=backend)
        out = subprocess.run([sys.executable, "-c", _NONFINITE_CHILD, str(path)], capture_output=True, text=True,
                             env=env, timeout=600)
        assert out.returncode == 0, f"{backend}: the child ended with {out.returncode}: {out.stderr[-2000:]}"
        got[backend] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["native"] == got["pure"]
    want = (f"the model's scores (logits) are not finite: found NaN, expected finite numbers (its weights hold NaN "
            f"or infinity, or its activations overflow float32) ({path})")
    assert got["native"][:3] == [[NonFiniteError.__name__, want]] * 3
    assert got["native"][3] == [NonFiniteError.__name__, want.replace("scores (logits)", "hidden states")]
    assert issubclass(NonFiniteError, FormatError)


def test_generate_cli_stops_on_nonfinite_activations(tmp_path: Path) -> None:
    """`minillama generate` on the NaN model: the error and exit status 2 on both backends, no text (the native
    backend printed text and exited 0)."""
    path = write_kquant_model(tmp_path / "nan.gguf", 12, nan_norm=True)
    for backend in ("native", "pure"):
        out = subprocess.run([sys.executable, "-m", "minillama", "generate", "--model", str(path), "--temperature",
                              "0", "--max-tokens", "4", "t1 t2"], capture_output=True, text=True,
                             env=dict(os.environ, MINILLAMA_BACKEND=backend), timeout=600)
        assert out.returncode == 2 and out.stdout.strip() == "", (backend, out)
        assert "not finite: found NaN" in out.stderr, (backend, out.stderr)
