"""The token embedding table of a GGUF model: only the rows asked for, dequantized to float32.

A 128k x 4096 table is 2 GiB as float32, so ``Embedding.from_file`` keeps the file memory-mapped
and ``lookup(ids)`` copies just the requested rows' bytes out of the map and dequantizes them, the
whole batch at once with numpy (no Python loop per block). Every dequantizer performs the same
float32 operations in the same order as ``gguf.quants.dequantize`` (Q8_K, which gguf lacks, as
ggml's ``dequantize_row_q8_K``), so the results are equal to the last bit.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ArgumentError, ArgumentTypeError, FormatError, UnsupportedError
from .fileio import input_path
from .gguffile.reader import GGUFFile, TensorInfo, read_gguf

__all__ = ["Embedding", "SUPPORTED_TYPES", "TENSOR_NAME", "dequantize", "check_tensor", "check_tensor_table",
           "tensor_layout", "tensor_view"]

TENSOR_NAME = "token_embd.weight"

T = GGMLQuantizationType
F32 = np.float32
_Dequant = Callable[[np.ndarray], np.ndarray]

#: Dequantize at most about this many values per step, so temporaries stay small for huge batches.
_CHUNK_VALUES = 1 << 18


# ---------------------------------------------------------------------------------------------------------------------
# Dequantizers: (n_blocks, type_size) uint8 -> (n_blocks, block_size) float32, bit-equal to gguf.quants.
# ---------------------------------------------------------------------------------------------------------------------

def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The little-endian float16 at byte `at` of every block, as an (n, 1) float32 column."""
    return b[:, at:at + 2].view("<f2").astype(F32)


def _bits(q: np.ndarray, width: int, bits: int) -> np.ndarray:
    """Split bytes into `bits`-wide fields, ggml order: per group of `width` bytes, all low fields first."""
    n = q.shape[0]
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(1, 1, -1, 1)
    return ((q.reshape(n, -1, 1, width) >> shifts) & np.uint8((1 << bits) - 1)).reshape(n, -1)


def _kquant_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins packed in the 12 scale bytes of a Q4_K/Q5_K block."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(F32), mn.astype(F32)


# Non-linear 4-bit grids (int values are exact in float32).
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)
_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], F32)
# E8M0 exponent byte -> half its power of two, as ggml_e8m0_to_fp32_half.
_E8M0_HALF = np.array([0x00200000 << e if e < 2 else (e - 1) << 23 for e in range(256)], np.uint32).view(F32)
_POW3_5 = np.array([1, 3, 9, 27, 81], np.uint8).reshape(1, 1, 5, 1)
_POW3_4 = np.array([1, 3, 9, 27], np.uint8).reshape(1, 1, 4, 1)
_IQ4_XS_SHIFTS = np.arange(0, 16, 2, dtype=np.uint16)


def _f32(b: np.ndarray) -> np.ndarray:
    """F32: the values themselves."""
    return b.view("<f4").astype(F32, copy=False)  # b is already a private copy of the rows


def _f16_plain(b: np.ndarray) -> np.ndarray:
    """F16: IEEE half precision, widened exactly."""
    return b.view("<f2").astype(F32)


def _bf16(b: np.ndarray) -> np.ndarray:
    """BF16: the top half of a float32, widened by shifting."""
    return (b.view("<u2").astype(np.uint32) << np.uint32(16)).view(F32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    """Q8_0 (34 bytes / 32 values): f16 d, int8 q[32]; y = q * d."""
    return b[:, 2:].view(np.int8).astype(F32) * _f16(b, 0)


def _q4_0(b: np.ndarray) -> np.ndarray:
    """Q4_0 (18 / 32): f16 d, 16 bytes of nibbles (low: values 0-15, high: 16-31); y = d * (q - 8)."""
    return _f16(b, 0) * (_bits(b[:, 2:], 16, 4).astype(F32) - F32(8))


def _q4_1(b: np.ndarray) -> np.ndarray:
    """Q4_1 (20 / 32): f16 d, f16 m, nibbles as Q4_0; y = d * q + m."""
    return _f16(b, 0) * _bits(b[:, 4:], 16, 4).astype(F32) + _f16(b, 2)


def _q5(b: np.ndarray, at: int) -> np.ndarray:
    """The 5-bit quants of a Q5_0/Q5_1 block whose 32-bit high-bit mask starts at byte `at`."""
    high = np.unpackbits(b[:, at:at + 4], axis=1, bitorder="little")
    return (_bits(b[:, at + 4:], 16, 4) | (high << np.uint8(4))).astype(F32)


def _q5_0(b: np.ndarray) -> np.ndarray:
    """Q5_0 (22 / 32): f16 d, 32-bit mask of fifth bits, nibbles; y = d * (q - 16)."""
    return _f16(b, 0) * (_q5(b, 2) - F32(16))


def _q5_1(b: np.ndarray) -> np.ndarray:
    """Q5_1 (24 / 32): f16 d, f16 m, fifth-bit mask, nibbles; y = d * q + m."""
    return _f16(b, 0) * _q5(b, 4) + _f16(b, 2)


def _q2_k(b: np.ndarray) -> np.ndarray:
    """Q2_K (84 / 256): 16 scale/min nibble pairs, 2-bit quants, f16 d, f16 dmin; y = d*sc * q - dmin*m."""
    n, sc = b.shape[0], b[:, 0:16]
    dl = (_f16(b, 80) * (sc & 0x0F).astype(F32)).reshape(n, 16, 1)
    ml = (_f16(b, 82) * (sc >> 4).astype(F32)).reshape(n, 16, 1)
    q = _bits(b[:, 16:80], 32, 2).reshape(n, 16, 16).astype(F32)
    return (dl * q - ml).reshape(n, 256)


def _q3_k(b: np.ndarray) -> np.ndarray:
    """Q3_K (110 / 256): high-bit mask, 2-bit quants, 16 packed 6-bit scales, f16 d; y = d*(sc-32) * q."""
    n = b.shape[0]
    low, high = _bits(b[:, 96:104], 8, 4), _bits(b[:, 104:108], 4, 2)
    scales = (low | (high << np.uint8(4))).astype(F32) - F32(32)
    dl = (_f16(b, 108) * scales).reshape(n, 16, 1)
    ql = _bits(b[:, 32:96], 32, 2).astype(np.int8)
    minus4 = ((_bits(b[:, 0:32], 32, 1) ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)  # bit clear: -4
    q = (ql - minus4).astype(F32).reshape(n, 16, 16)
    return (dl * q).reshape(n, 256)


def _q4_k(b: np.ndarray) -> np.ndarray:
    """Q4_K (144 / 256): f16 d, f16 dmin, 8 packed 6-bit scales and mins, nibbles; y = d*sc * q - dmin*m."""
    n, (sc, mn) = b.shape[0], _kquant_scales(b[:, 4:16])
    d, dm = (_f16(b, 0) * sc).reshape(n, 8, 1), (_f16(b, 2) * mn).reshape(n, 8, 1)
    q = _bits(b[:, 16:144], 32, 4).reshape(n, 8, 32).astype(F32)
    return (d * q - dm).reshape(n, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    """Q5_K (176 / 256): as Q4_K plus 32 bytes of fifth bits before the nibbles."""
    n, (sc, mn) = b.shape[0], _kquant_scales(b[:, 4:16])
    d, dm = (_f16(b, 0) * sc).reshape(n, 8, 1), (_f16(b, 2) * mn).reshape(n, 8, 1)
    q = _bits(b[:, 48:176], 32, 4) | (_bits(b[:, 16:48], 32, 1) << np.uint8(4))
    return (d * q.reshape(n, 8, 32).astype(F32) - dm).reshape(n, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K (210 / 256): low nibbles, high 2-bit pairs, 16 int8 scales, f16 d; y = d*sc * (q - 32)."""
    n = b.shape[0]
    d = (_f16(b, 208) * b[:, 192:208].view(np.int8).astype(F32)).reshape(n, 16, 1)
    q = _bits(b[:, 0:128], 64, 4) | (_bits(b[:, 128:192], 32, 2) << np.uint8(4))
    return (d * (q.astype(F32) - F32(32)).reshape(n, 16, 16)).reshape(n, 256)


def _q8_k(b: np.ndarray) -> np.ndarray:
    """Q8_K (292 / 256): f32 d, int8 q[256], 16 int16 block sums (unused here); y = d * q."""
    return b[:, 0:4].view("<f4").astype(F32) * b[:, 4:260].view(np.int8).astype(F32)


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    """IQ4_NL (18 / 32): f16 d, nibbles indexing a non-linear grid; y = d * grid[q]."""
    return _f16(b, 0) * _IQ4_VALUES[_bits(b[:, 2:], 16, 4)]


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    """IQ4_XS (136 / 256): f16 d, eight packed 6-bit scales, nibbles into the IQ4_NL grid."""
    n = b.shape[0]
    high = ((b[:, 2:4].view("<u2") >> _IQ4_XS_SHIFTS) & np.uint16(3)).astype(np.uint8)
    scales = (_bits(b[:, 4:8], 1, 4) | (high << np.uint8(4))).astype(F32) - F32(32)
    dl = (_f16(b, 0) * scales).reshape(n, 8, 1)
    return (dl * _IQ4_VALUES[_bits(b[:, 8:136], 16, 4)].reshape(n, 8, 32)).reshape(n, 256)


def _tq1_0(b: np.ndarray) -> np.ndarray:
    """TQ1_0 (54 / 256): ternary digits packed five (or four) per byte, f16 d; y = d * (t - 1)."""
    n = b.shape[0]
    # Base-3 digits: multiplying by 3**k modulo 256 (uint8 wrap-around) brings digit k to the top.
    q = np.concatenate([(b[:, 0:32].reshape(n, 1, 1, 32) * _POW3_5).reshape(n, 160),
                        (b[:, 32:48].reshape(n, 1, 1, 16) * _POW3_5).reshape(n, 80),
                        (b[:, 48:52].reshape(n, 1, 1, 4) * _POW3_4).reshape(n, 16)], axis=1)
    return _f16(b, 52) * (((q.astype(np.uint16) * np.uint16(3)) >> np.uint16(8)).astype(F32) - F32(1))


def _tq2_0(b: np.ndarray) -> np.ndarray:
    """TQ2_0 (66 / 256): 2-bit ternary codes, f16 d; y = d * (q - 1)."""
    return _f16(b, 64) * (_bits(b[:, 0:64], 32, 2).astype(F32) - F32(1))


def _mxfp4(b: np.ndarray) -> np.ndarray:
    """MXFP4 (17 / 32): E8M0 shared exponent, nibbles indexing doubled E2M1 values."""
    return _E8M0_HALF[b[:, 0:1]] * _MXFP4_VALUES[_bits(b[:, 1:17], 16, 4)]


_DEQUANT: dict[GGMLQuantizationType, _Dequant] = {
    T.F32: _f32, T.F16: _f16_plain, T.BF16: _bf16,
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k, T.Q8_K: _q8_k,
    T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs, T.TQ1_0: _tq1_0, T.TQ2_0: _tq2_0, T.MXFP4: _mxfp4,
}

#: Names of the ggml types ``Embedding.from_file`` can dequantize.
SUPPORTED_TYPES: tuple[str, ...] = tuple(t.name for t in _DEQUANT)


def dequantize(raw: np.ndarray, ggml_type: GGMLQuantizationType, n_cols: int) -> np.ndarray:
    """Raw rows of a ggml tensor, (n_rows, row_bytes) uint8, as (n_rows, n_cols) float32 (the one dequantizer).

    Used by Embedding.lookup for a few rows and by minillama.model for whole weight matrices; big inputs go
    in steps of about _CHUNK_VALUES values so the temporaries stay small.
    """
    dequant, type_size = _DEQUANT[ggml_type], GGML_QUANT_SIZES[ggml_type][1]
    n_rows = raw.shape[0]
    out = np.empty((n_rows, n_cols), F32)
    step = max(1, _CHUNK_VALUES // max(1, n_cols))
    with np.errstate(over="ignore"):  # an inf the data's scales produce is the result, as in ggml
        for s in range(0, n_rows, step):
            part = np.ascontiguousarray(raw[s:s + step])
            out[s:s + step] = dequant(part.reshape(-1, type_size)).reshape(-1, n_cols)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Tensor views: the one check of a tensor's type, extent and place in the file (Embedding and minillama.model)
# ---------------------------------------------------------------------------------------------------------------------

def _describe(info: TensorInfo, qtype: GGMLQuantizationType) -> str:
    """'token_embd.weight (16 x 64 F32)': the name, the dims outermost first, the type."""
    dims = " x ".join(str(d) for d in reversed(info.shape)) or "1"
    return f"{info.name} ({dims} {qtype.name})"


def tensor_layout(info: TensorInfo, path: str) -> tuple[GGMLQuantizationType, int, int]:
    """(ggml type, rows, bytes per row) of a table entry, as ggml computes its size: the type must be one the gguf
    package knows and a row a whole number of its blocks. Python ints: no dimension can overflow."""
    try:
        qtype = GGMLQuantizationType(info.ggml_type)
    except ValueError:
        raise UnsupportedError(f"{path}: tensor {info.name} has ggml type {info.ggml_type}, which this gguf "
                               f"package does not know; supported: {', '.join(SUPPORTED_TYPES)}") from None
    block, type_size = GGML_QUANT_SIZES[qtype]
    ne0 = info.shape[0] if info.shape else 1
    if ne0 % block:
        raise FormatError(f"{info.name} rows have {ne0} values, expected a multiple of the {qtype.name} block "
                          f"size {block}", path=path, key=info.name)
    rows = 1
    for d in info.shape[1:]:
        rows *= d
    return qtype, rows, ne0 // block * type_size


def check_tensor(gf: GGUFFile, info: TensorInfo, file_size: int) -> tuple[int, int]:
    """The byte range [start, end) of a tensor's data after checking, as ggml's gguf reader does, that its
    offset is a multiple of the file's alignment and that the data lies inside the file."""
    qtype, rows, row_bytes = tensor_layout(info, gf.path)
    start = gf.data_offset + info.offset
    if info.offset % gf.alignment:
        raise FormatError(f"{info.name} data offset {info.offset} is not a multiple of the alignment "
                          f"{gf.alignment}", path=gf.path, offset=start, key=info.name)
    end = start + rows * row_bytes
    if end > file_size:
        raise FormatError(f"{_describe(info, qtype)} needs bytes {start}..{end} but the file has {file_size}",
                          path=gf.path, offset=start, key=info.name)
    return start, end


def check_tensor_table(gf: GGUFFile, file_size: int) -> None:
    """Every tensor of the file aligned, inside the file and overlapping no other (ggml lays them out one after
    another): so n tensors can never ask for more bytes than the file holds."""
    spans = sorted((*check_tensor(gf, info, file_size), info.name) for info in gf.tensors)
    reach, owner = 0, ""  # the furthest end so far and its tensor: one inside a longer one is caught too
    for start, end, name in spans:
        if start < end:  # an empty tensor overlaps nothing
            if start < reach:
                raise FormatError(f"tensor {name} (bytes {start}..{end}) overlaps tensor {owner} (which ends at "
                                  f"byte {reach}); expected each tensor's data apart", path=gf.path, offset=start,
                                  key=name)
            reach, owner = end, name


def tensor_view(gf: GGUFFile, info: TensorInfo, buf: mmap.mmap, file_size: int) -> tuple[np.ndarray,
                                                                                         GGMLQuantizationType]:
    """The tensor's bytes as (rows, row_bytes) uint8 over buf, after check_tensor, for a type minillama can
    dequantize (the shape against what the caller expects is the caller's check)."""
    qtype, rows, row_bytes = tensor_layout(info, gf.path)
    if qtype not in _DEQUANT:
        raise UnsupportedError(f"{gf.path}: {info.name} is of ggml type {qtype.name} ({int(qtype)}), which "
                               f"minillama cannot dequantize; supported: {', '.join(SUPPORTED_TYPES)}")
    start, _ = check_tensor(gf, info, file_size)
    return np.frombuffer(buf, np.uint8, rows * row_bytes, start).reshape(rows, row_bytes), qtype


# ---------------------------------------------------------------------------------------------------------------------
# Random stub rows: a counter-based hash of (seed, element index), so any row is computed on its own.
# ---------------------------------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: Any) -> Any:
    """The splitmix64 finalizer, on a uint64 array (wrapping) or a Python int (masked)."""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _random_rows(key: int, ids: np.ndarray, n_embd: int) -> np.ndarray:
    """Rows `ids` of the random table `key`: uniform multiples of 2**-23 in [-1, 1)."""
    index = ids.astype(np.uint64).reshape(-1, 1) * np.uint64(n_embd) + np.arange(n_embd, dtype=np.uint64)
    z = _mix64(np.uint64(key) + index * np.uint64(_GOLDEN))
    return (z >> np.uint64(40)).astype(F32) * F32(2.0 ** -23) - F32(1)


# ---------------------------------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------------------------------

class Embedding:
    """A token embedding table (n_vocab rows of n_embd values) that dequantizes only the rows looked up."""

    def __init__(self, n_vocab: int, n_embd: int, ggml_type: GGMLQuantizationType, *,
                 table: np.ndarray | None = None, mm: mmap.mmap | None = None, seed: int | None = None,
                 path: str | None = None) -> None:
        """Use from_file or random; this wires either a mapped table of raw rows or a random seed."""
        self._n_vocab, self._n_embd, self._type = n_vocab, n_embd, ggml_type
        self._table, self._mmap, self.path = table, mm, path
        self._key = None if seed is None else _mix64(seed & _M64)
        self._dequant = _DEQUANT[ggml_type]
        self._type_size = GGML_QUANT_SIZES[ggml_type][1]

    # -- construction --------------------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Embedding:
        """Memory-map the token_embd.weight tensor of a GGUF model, checking its type and extent first."""
        path = input_path(path, "GGUF model file")
        gf = read_gguf(path)
        info = next((t for t in gf.tensors if t.name == TENSOR_NAME), None)
        if info is None:
            if not gf.tensors:
                found = "no tensors at all (a vocab-only file? Embedding.random stands in for it)"
            else:
                names = ", ".join(repr(t.name) for t in gf.tensors[:8])
                found = f"{len(gf.tensors)} tensors ({names}{', ...' if len(gf.tensors) > 8 else ''})"
            raise FormatError(f"expected a tensor {TENSOR_NAME!r} (the token embeddings), found {found}",
                              path=path)
        if len(info.shape) < 2 or any(d != 1 for d in info.shape[2:]):
            raise FormatError(f"{TENSOR_NAME} has shape {list(info.shape)}, expected 2 dimensions "
                              "[n_embd, n_vocab]", path=path, key=TENSOR_NAME)
        n_embd, n_vocab = info.shape[0], info.shape[1]
        if n_embd == 0 or n_vocab == 0:
            raise FormatError(f"{TENSOR_NAME} has shape {list(info.shape)}, expected a non-empty table",
                              path=path, key=TENSOR_NAME)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_tensor(gf, info, size)  # before mapping: a bad extent fails without touching the data
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        table, qtype = tensor_view(gf, info, mm, size)
        return cls(n_vocab, n_embd, qtype, table=table, mm=mm, path=path)

    @classmethod
    def random(cls, n_vocab: int, n_embd: int, seed: int = 0) -> Embedding:
        """A stand-in table of uniform [-1, 1) float32 values for vocab-only files and tests, fixed by seed."""
        for name, v in (("n_vocab", n_vocab), ("n_embd", n_embd)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ArgumentError(f"{name} must be a positive integer, got {v!r}")
        return cls(int(n_vocab), int(n_embd), T.F32, seed=int(seed))

    # -- properties ----------------------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of rows (tokens) in the table."""
        return self._n_vocab

    @property
    def n_embd(self) -> int:
        """Number of values in each row (the model's embedding width)."""
        return self._n_embd

    @property
    def ggml_type(self) -> str:
        """Name of the ggml type the rows are stored in ("Q8_0", "F16"...; "F32" for the random stub)."""
        return self._type.name

    def __repr__(self) -> str:
        """Shape, type and origin, for debugging."""
        origin = "random" if self._key is not None else repr(self.path)
        return f"Embedding({self._n_vocab} x {self._n_embd} {self.ggml_type}, {origin})"

    # -- lookup --------------------------------------------------------------------------------------------------

    def lookup(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows `ids` of the table as a (len(ids), n_embd) float32 array, reading and dequantizing only those."""
        idx = self._check_ids(ids)
        if len(idx) == 0:
            return np.empty((0, self._n_embd), F32)
        # A repeated id (common in text) is read and dequantized once, then copied.
        uniq, inverse = np.unique(idx, return_inverse=True)
        todo = idx if len(uniq) == len(idx) else uniq
        step = max(1, _CHUNK_VALUES // self._n_embd)  # bounds the temporaries of one dequantization
        if len(todo) <= step or (self._type == T.F32 and self._key is None):  # F32: the copy is the result
            rows = self._rows(todo)
        else:
            rows = np.empty((len(todo), self._n_embd), F32)
            for s in range(0, len(todo), step):
                rows[s:s + step] = self._rows(todo[s:s + step])
        return rows if todo is idx else rows[inverse.reshape(-1)]

    def _check_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The ids as a 1-D intp array; ArgumentError naming the first id outside the table."""
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ArgumentError(f"ids must be a 1-D sequence of token ids, got an array of shape {arr.shape}")
        if arr.size == 0:
            return np.zeros(0, np.intp)
        if arr.dtype.kind == "O":  # Python ints too large for int64/uint64
            for v in arr:
                if isinstance(v, (int, np.integer)) and not 0 <= v < self._n_vocab:
                    raise self._out_of_range(v)
        if arr.dtype.kind not in "iu":
            raise ArgumentTypeError(f"token ids must be integers, got {arr.dtype}")
        bad = arr >= self._n_vocab
        if arr.dtype.kind == "i":
            bad |= arr < 0
        if bad.any():
            raise self._out_of_range(arr[bad.argmax()])
        return arr.astype(np.intp, copy=False)

    def _out_of_range(self, token_id: Any) -> ArgumentError:
        """The error for an id outside the table, naming the id and the table size."""
        n = self._n_vocab
        return ArgumentError(f"token id {token_id} is out of range for an embedding table of {n} rows "
                          f"(expected 0..{n - 1})")

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Dequantized rows for valid, distinct ids (one batch; only these rows' bytes are read)."""
        if self._key is not None:
            return _random_rows(self._key, ids, self._n_embd)
        if self._table is None:
            raise ArgumentError(f"lookup on a closed Embedding ({self.path})")
        raw = self._table[ids]  # copies just these rows out of the memory map
        blocks = raw.reshape(-1, self._type_size)
        with np.errstate(over="ignore"):  # an inf the data's scales produce is the result, as in ggml
            return self._dequant(blocks).reshape(len(ids), self._n_embd)

    # -- lifetime ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the file now instead of at garbage collection (lookups afterwards raise ArgumentError)."""
        self._table = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a view is still alive somewhere: the map closes when it goes
                pass
            self._mmap = None

    def __enter__(self) -> Embedding:
        """Use as a context manager that closes the map on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the map."""
        self.close()
