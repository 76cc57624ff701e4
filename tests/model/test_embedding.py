"""minillama.embedding: rows of token_embd.weight equal gguf.quants.dequantize of the same rows, bit for bit.

Every supported type is checked on GGUF files written here with gguf.GGUFWriter: data quantized by
gguf.quants.quantize where gguf can quantize the type, and valid random blocks (random bytes, scale
fields set to finite values) for every type. Expected values come from gguf.quants.dequantize, or,
for Q8_K which gguf cannot dequantize, from ggml's dequantize_row_q8_K transcribed below. The real
model test needs MINILLAMA_TEST_GGUF (SmolLM2-135M-Instruct, token_embd in Q8_0) and skips without it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

import minillama.embedding as emb_mod
from minillama.embedding import SUPPORTED_TYPES, Embedding
from minillama.errors import FormatError, UnsupportedError

NAME = "token_embd.weight"

#: The types the issue requires; more are welcome.
REQUIRED = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]

#: Types gguf.quants.quantize can produce.
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"]

#: Byte offsets of the float16 scale fields in one block (ggml-common.h); every other byte may be anything.
F16_FIELDS = {
    "F32": [], "F16": [], "BF16": [],
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "Q8_K": [],  # float32 d at 0, set separately
    "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64],
    "MXFP4": [],  # E8M0 exponent byte at 0, limited to exponents whose results stay finite
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
    "IQ1_M": [],  # its float16 scale is the top nibbles of the four scale words: any bits
}

REAL_GGUF_ENV = "MINILLAMA_TEST_GGUF"


# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------

def write_table(path: Path, data: np.ndarray, qtype: T | None = None, name: str = NAME,
                extra: dict[str, np.ndarray] | None = None) -> Path:
    """Write a GGUF whose tensor `name` holds `data` (floats, or raw bytes of type qtype), plus `extra` tensors."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    for other, arr in (extra or {}).items():
        w.add_tensor(other, arr)
    if data is not None:
        w.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random finite float16 values (normal, subnormal, zero, either sign) as raw uint16."""
    h = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    h[(h & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)  # exponent all ones (inf/nan) -> finite
    return h


def random_blocks(qtype: T, n_blocks: int, seed: int) -> np.ndarray:
    """Valid random blocks of qtype, (n_blocks, type_size) uint8: random bytes with finite scales."""
    rng = np.random.default_rng(seed)
    _, ts = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n_blocks, ts), dtype=np.uint8)
    for at in F16_FIELDS[qtype.name]:
        b[:, at:at + 2] = random_f16_bits(rng, n_blocks).astype("<u2").view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-8, 8, n_blocks)).astype("<f4")
        b[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    if qtype == T.MXFP4:
        b[:, 0] = rng.integers(0, 250, n_blocks, dtype=np.uint8)
    return b


def ggml_dequantize_row_q8_k(raw: np.ndarray) -> np.ndarray:
    """ggml-quants.c dequantize_row_q8_K: y[j] = x.d * x.qs[j] (float d, int8 qs[256], int16 bsums[16])."""
    blocks = raw.reshape(-1, 292)
    d = blocks[:, 0:4].copy().view("<f4").astype(np.float32)
    qs = blocks[:, 4:260].view(np.int8)
    return (d * qs.astype(np.float32)).reshape(raw.shape[0], -1)


def reference(raw_rows: np.ndarray, qtype: T) -> np.ndarray:
    """Expected float32 rows for raw GGUF rows of qtype: gguf.quants.dequantize (ggml's formula for Q8_K)."""
    if qtype == T.Q8_K:
        return ggml_dequantize_row_q8_k(raw_rows)
    return gguf.quants.dequantize(raw_rows, qtype)


def assert_bit_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Same shape, float32, and the same bits everywhere (NaN payloads and signed zeros included)."""
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, (f"{diff.size} values differ, first at flat index {diff[0]}: "
                            f"{got.ravel()[diff[0]]!r} != {want.ravel()[diff[0]]!r}")


def patch_tensor_info(path: Path, name: str, *, shape: tuple[int, ...] | None = None,
                      ggml_type: int | None = None) -> None:
    """Rewrite a tensor's dims (same count) or type id in place, to make files GGUFWriter refuses to write."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    pos = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    pos += 4
    if shape is not None:
        assert len(shape) == n_dims
        struct.pack_into(f"<{n_dims}Q", data, pos, *shape)
    pos += 8 * n_dims
    if ggml_type is not None:
        struct.pack_into("<I", data, pos, ggml_type)
    path.write_bytes(bytes(data))


class RowSpy:
    """Stands in for Embedding's mapped table and records which rows are read from it."""

    def __init__(self, table: np.ndarray) -> None:
        self.table, self.read = table, []

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        self.read.extend(np.asarray(ids).tolist())
        return self.table[ids]


def spy_on(e: Embedding, monkeypatch: pytest.MonkeyPatch) -> tuple[RowSpy, list[int]]:
    """Record the rows e reads from its map and the number of blocks it dequantizes."""
    rows = RowSpy(e._table)
    blocks: list[int] = []
    dequant = e._dequant

    def counting(b: np.ndarray) -> np.ndarray:
        blocks.append(b.shape[0])
        return dequant(b)

    monkeypatch.setattr(e, "_table", rows)
    monkeypatch.setattr(e, "_dequant", counting)
    return rows, blocks


def sample_ids(n_vocab: int, rng: np.random.Generator, k: int = 40) -> np.ndarray:
    """Unsorted ids with repeats and both ends of the table."""
    return np.concatenate([[n_vocab - 1, 0, 3], rng.integers(0, n_vocab, k), [3, n_vocab - 1]])


# ---------------------------------------------------------------------------------------------------------------------
# bit-exactness against gguf, every type
# ---------------------------------------------------------------------------------------------------------------------

def test_required_types_supported() -> None:
    missing = [t for t in REQUIRED if t not in SUPPORTED_TYPES]
    assert not missing, f"required types not supported: {missing}"


@pytest.mark.parametrize("type_name", QUANTIZABLE)
def test_matches_gguf_on_quantized_data(tmp_path: Path, type_name: str) -> None:
    qtype = T[type_name]
    rng = np.random.default_rng(list(type_name.encode()))
    n_vocab, n_embd = 61, 512
    data = rng.standard_normal((n_vocab, n_embd)).astype(np.float32) * np.float32(0.05)
    data[7] = 0.0  # an all-zero row: zero scales
    data[8, :64] = 1e4  # and a few large values
    q = gguf.quants.quantize(data, qtype)
    path = write_table(tmp_path / f"{type_name}.gguf", q, qtype)
    raw = q.view(np.uint8).reshape(n_vocab, -1)

    with Embedding.from_file(path) as e:
        assert (e.n_vocab, e.n_embd, e.ggml_type) == (n_vocab, n_embd, type_name)
        ids = sample_ids(n_vocab, rng)
        assert_bit_equal(e.lookup(ids), reference(raw[ids], qtype))
        assert_bit_equal(e.lookup(np.arange(n_vocab)), reference(raw, qtype))


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
def test_matches_gguf_on_random_blocks(tmp_path: Path, type_name: str) -> None:
    qtype = T[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_vocab, n_embd = 45, 768 if block_size > 1 else 96
    n_blocks = n_vocab * n_embd // block_size
    raw = random_blocks(qtype, n_blocks, seed=len(type_name) * 1000 + int(qtype)).reshape(n_vocab, -1)
    path = write_table(tmp_path / f"{type_name}.gguf", raw, qtype)

    with Embedding.from_file(path) as e:
        assert (e.n_vocab, e.n_embd, e.ggml_type) == (n_vocab, n_embd, type_name)
        ids = sample_ids(n_vocab, np.random.default_rng(int(qtype)))
        assert_bit_equal(e.lookup(ids), reference(raw[ids], qtype))
        assert_bit_equal(e.lookup(np.arange(n_vocab)), reference(raw, qtype))
        assert e.lookup([]).shape == (0, n_embd)


def test_q8_k_reference_agrees_with_float_math() -> None:
    """The Q8_K transcription itself: d * q for hand-made blocks."""
    block = np.zeros(292, np.uint8)
    block[0:4] = np.frombuffer(np.float32(0.5).tobytes(), np.uint8)
    block[4:260] = (np.arange(256) - 128).astype(np.int8).view(np.uint8)
    want = (np.arange(256, dtype=np.float32) - 128) * np.float32(0.5)
    assert_bit_equal(ggml_dequantize_row_q8_k(block.reshape(1, -1)), want.reshape(1, -1))


def test_large_batch_is_split_into_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    raw = random_blocks(T.Q4_K, 300 * 2, seed=5).reshape(300, -1)
    e = Embedding.from_file(write_table(tmp_path / "q4k.gguf", raw, T.Q4_K))
    monkeypatch.setattr(emb_mod, "_CHUNK_VALUES", 512 * 7)  # 7 rows per step
    _, blocks = spy_on(e, monkeypatch)
    ids = rng.permutation(300)[:100]
    assert_bit_equal(e.lookup(ids), reference(raw[ids], T.Q4_K))
    assert blocks == [14] * 14 + [4], "expected 100 rows as 14 steps of 7 rows and one of 2"
    e.close()


# ---------------------------------------------------------------------------------------------------------------------
# only the requested rows are read
# ---------------------------------------------------------------------------------------------------------------------

def test_reads_and_dequantizes_only_requested_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = random_blocks(T.Q6_K, 1000 * 2, seed=9).reshape(1000, -1)
    e = Embedding.from_file(write_table(tmp_path / "q6k.gguf", raw, T.Q6_K))
    rows, blocks = spy_on(e, monkeypatch)
    out = e.lookup([999, 5, 5, 17, 999])
    assert sorted(rows.read) == [5, 17, 999], "each distinct row is read once, nothing else"
    assert sum(blocks) == 3 * 2, "3 distinct rows of 2 Q6_K blocks each"
    assert_bit_equal(out, reference(raw[[999, 5, 5, 17, 999]], T.Q6_K))
    e.close()


# ---------------------------------------------------------------------------------------------------------------------
# real model
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_gguf() -> Path:
    value = os.environ.get(REAL_GGUF_ENV)
    if not value:
        pytest.skip(f"{REAL_GGUF_ENV} is not set (point it at SmolLM2-135M-Instruct.Q4_1.gguf or another GGUF "
                    "model whose token_embd.weight is of a supported type)")
    path = Path(value).expanduser()
    if not path.is_file():
        pytest.skip(f"{REAL_GGUF_ENV}={value}: no such file")
    return path


def test_real_model_matches_gguf_reader(real_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = gguf.GGUFReader(str(real_gguf))
    tensor = next(t for t in reader.tensors if t.name == NAME)
    n_embd, n_vocab = (int(d) for d in tensor.shape[:2])
    with Embedding.from_file(real_gguf) as e:
        assert (e.n_vocab, e.n_embd, e.ggml_type) == (n_vocab, n_embd, tensor.tensor_type.name)
        if real_gguf.name.startswith("SmolLM2-135M"):
            assert (e.n_vocab, e.n_embd, e.ggml_type) == (49152, 576, "Q8_0")

        ends = [0, 1, n_vocab - 1]
        rows, blocks = spy_on(e, monkeypatch)
        assert_bit_equal(e.lookup(ends), gguf.quants.dequantize(np.asarray(tensor.data[ends]), tensor.tensor_type))
        assert sorted(rows.read) == ends
        assert sum(blocks) == 3 * n_embd // GGML_QUANT_SIZES[tensor.tensor_type][0]
        monkeypatch.undo()

        ids = np.random.default_rng(0).integers(0, n_vocab, 300)
        want = gguf.quants.dequantize(np.asarray(tensor.data[ids]), tensor.tensor_type)
        assert_bit_equal(e.lookup(ids), want)
        assert_bit_equal(e.lookup(list(map(int, ids))), want)


# ---------------------------------------------------------------------------------------------------------------------
# ids
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture
def small(tmp_path: Path) -> Iterator[Embedding]:
    data = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
    e = Embedding.from_file(write_table(tmp_path / "small.gguf", data))
    yield e
    e.close()


@pytest.mark.parametrize("bad", [-1, 10, 11, 2**40, -(2**63)])
def test_out_of_range_id(small: Embedding, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"token id {bad} .*table of 10 rows"):
        small.lookup([0, 1, bad, 2])


def test_out_of_range_unsigned_and_huge_ids(small: Embedding) -> None:
    with pytest.raises(ValueError, match=r"token id 10 "):
        small.lookup(np.array([3, 10], np.uint64))
    with pytest.raises(ValueError, match=rf"token id {2**64} "):
        small.lookup([2**64])


def test_id_types(small: Embedding) -> None:
    table = np.arange(80, dtype=np.float32).reshape(10, 8)
    for ids in ([9, 0, 4], (9, 0, 4), np.array([9, 0, 4], np.int32), np.array([9, 0, 4], np.uint16),
                range(9, -1, -3), [np.int64(9), 0, 4]):
        got = small.lookup(ids)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert_bit_equal(got, table[list(ids)])
    assert small.lookup([]).shape == (0, 8) and small.lookup([]).dtype == np.float32
    with pytest.raises(TypeError, match="integers"):
        small.lookup([1.0, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        small.lookup([[1, 2]])
    with pytest.raises(ValueError, match="1-D"):
        small.lookup(3)


def test_result_is_a_fresh_array(small: Embedding) -> None:
    a = small.lookup([2])
    a[:] = -1
    assert small.lookup([2])[0, 0] == 16.0


def test_closed(tmp_path: Path) -> None:
    path = write_table(tmp_path / "c.gguf", np.ones((4, 8), np.float32))
    with Embedding.from_file(path) as e:
        assert e.lookup([1]).sum() == 8.0
    with pytest.raises(ValueError, match="closed"):
        e.lookup([1])
    e.close()  # twice is fine


# ---------------------------------------------------------------------------------------------------------------------
# bad files
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name", ["NVFP4", "Q1_0", "F64", "Q8_1"])
def test_unsupported_type(tmp_path: Path, type_name: str) -> None:
    qtype = T[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.zeros((4, 512 // block_size * type_size), np.uint8)
    path = write_table(tmp_path / "u.gguf", raw, qtype)
    with pytest.raises(UnsupportedError, match=type_name):
        Embedding.from_file(path)


def test_unknown_type_id(tmp_path: Path) -> None:
    path = write_table(tmp_path / "u.gguf", np.ones((4, 32), np.float32))
    patch_tensor_info(path, NAME, ggml_type=250)
    with pytest.raises(UnsupportedError, match="250"):
        Embedding.from_file(path)


def test_missing_tensor(tmp_path: Path) -> None:
    path = write_table(tmp_path / "m.gguf", None, extra={"output.weight": np.ones((4, 8), np.float32)})
    with pytest.raises(FormatError, match=r"expected a tensor 'token_embd.weight'.*found 1 tensors \('output.weight'\)"):
        Embedding.from_file(path)


def test_vocab_only_file(tmp_path: Path) -> None:
    path = write_table(tmp_path / "v.gguf", None)
    with pytest.raises(FormatError, match="expected a tensor 'token_embd.weight'.*found no tensors"):
        Embedding.from_file(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.gguf", np.ones((16, 64), np.float32))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 256)
    with pytest.raises(FormatError, match=r"token_embd.weight \(16 x 64 F32\) needs bytes .* but the file has"):
        Embedding.from_file(path)


def test_wrong_rank(tmp_path: Path) -> None:
    path = write_table(tmp_path / "r.gguf", np.ones(32, np.float32))
    with pytest.raises(FormatError, match=r"shape \[32\], expected 2 dimensions"):
        Embedding.from_file(path)
    path = write_table(tmp_path / "r3.gguf", np.ones((2, 4, 8), np.float32))
    with pytest.raises(FormatError, match=r"shape \[8, 4, 2\], expected 2 dimensions"):
        Embedding.from_file(path)


def test_row_not_whole_blocks(tmp_path: Path) -> None:
    # 4 rows of 17 Q8_0 blocks, relabelled as 17 * 32 - 8 values per row.
    path = write_table(tmp_path / "b.gguf", np.zeros((4, 17 * 34), np.uint8), T.Q8_0)
    patch_tensor_info(path, NAME, shape=(17 * 32 - 8, 4))
    with pytest.raises(FormatError, match="536 values, expected a multiple of the Q8_0 block size 32"):
        Embedding.from_file(path)


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(FormatError, match="not a GGUF file"):
        Embedding.from_file(path)


# ---------------------------------------------------------------------------------------------------------------------
# random stub
# ---------------------------------------------------------------------------------------------------------------------

def test_random_is_deterministic_per_seed() -> None:
    a, b, c = Embedding.random(1000, 64, seed=1), Embedding.random(1000, 64, seed=1), Embedding.random(1000, 64, seed=2)
    ids = [0, 999, 5, 5]
    assert_bit_equal(a.lookup(ids), b.lookup(ids))
    assert not np.array_equal(a.lookup(ids), c.lookup(ids))
    assert (a.n_vocab, a.n_embd, a.ggml_type) == (1000, 64, "F32")
    assert_bit_equal(Embedding.random(10, 4).lookup([3]), Embedding.random(10, 4, seed=0).lookup([3]))


def test_random_rows_do_not_depend_on_the_batch() -> None:
    e = Embedding.random(50_000, 32, seed=7)
    batch = e.lookup([40_000, 3, 17, 3])
    assert_bit_equal(batch[1:2], e.lookup([3]))
    assert_bit_equal(batch[0:1], e.lookup([40_000]))
    assert_bit_equal(batch[1], batch[3])
    assert not np.array_equal(batch[1], batch[2])


def test_random_values() -> None:
    x = Embedding.random(4096, 256, seed=3).lookup(np.arange(4096))
    assert x.dtype == np.float32 and x.shape == (4096, 256)
    assert x.min() >= -1.0 and x.max() < 1.0
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1 / np.sqrt(3)) < 0.01
    assert len(np.unique(x[:, 0])) > 4000


def test_random_bad_arguments() -> None:
    for args in ((0, 8), (8, 0), (-1, 8), (8.0, 8), (True, 8)):
        with pytest.raises(ValueError, match="positive integer"):
            Embedding.random(*args)
    with pytest.raises(ValueError, match=r"token id 10 .*table of 10 rows"):
        Embedding.random(10, 4).lookup([10])
