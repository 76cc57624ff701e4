"""Quantization, one home: ggml's block formats, their dequantizers, the tensor-view checks, and which types the
native core multiplies in place.

Dequantizers perform the same float32 operations in the same order as ``gguf.quants.dequantize`` (Q8_K, which
gguf lacks, as ggml's ``dequantize_row_q8_K``), so results are equal to the last bit: the pure backend multiplies
the float32 matrices they give. The native backend leaves a matrix quantized when its type is among
``native_types(core)``, the rows of the C traits table (minillama/_native/quants.h), whose kernels compute ggml's
products. Tensor views: the one check of a tensor's type, extent and place in the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from .errors import FormatError, UnsupportedError
from .gguffile.reader import GGUFFile, TensorInfo

__all__ = ["SUPPORTED_TYPES", "dequantize", "check_tensor", "check_tensor_table", "native_types", "tensor_layout",
           "tensor_view"]


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


def _q3_k_ints(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q3_K's 16 scales (sc - 32) and 256 quants (-4..3) as int8, in ggml's value order."""
    low, high = _bits(b[:, 96:104], 8, 4), _bits(b[:, 104:108], 4, 2)
    scales = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    ql = _bits(b[:, 32:96], 32, 2).astype(np.int8)
    minus4 = ((_bits(b[:, 0:32], 32, 1) ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)  # bit clear: -4
    return scales, ql - minus4


def _q3_k(b: np.ndarray) -> np.ndarray:
    """Q3_K (110 / 256): high-bit mask, 2-bit quants, 16 packed 6-bit scales, f16 d; y = d*(sc-32) * q."""
    n = b.shape[0]
    scales, q = _q3_k_ints(b)
    dl = (_f16(b, 108) * scales.astype(F32)).reshape(n, 16, 1)
    return (dl * q.astype(F32).reshape(n, 16, 16)).reshape(n, 256)


def _q4_k(b: np.ndarray) -> np.ndarray:
    """Q4_K (144 / 256): f16 d, f16 dmin, 8 packed 6-bit scales and mins, nibbles; y = d*sc * q - dmin*m."""
    n, (sc, mn) = b.shape[0], _kquant_scales(b[:, 4:16])
    d, dm = (_f16(b, 0) * sc).reshape(n, 8, 1), (_f16(b, 2) * mn).reshape(n, 8, 1)
    q = _bits(b[:, 16:144], 32, 4).reshape(n, 8, 32).astype(F32)
    return (d * q - dm).reshape(n, 256)


def _q5_k_ints(b: np.ndarray) -> np.ndarray:
    """Q5_K's 256 quants (0..31) in ggml's value order."""
    return _bits(b[:, 48:176], 32, 4) | (_bits(b[:, 16:48], 32, 1) << np.uint8(4))


def _q5_k(b: np.ndarray) -> np.ndarray:
    """Q5_K (176 / 256): as Q4_K plus 32 bytes of fifth bits before the nibbles."""
    n, (sc, mn) = b.shape[0], _kquant_scales(b[:, 4:16])
    d, dm = (_f16(b, 0) * sc).reshape(n, 8, 1), (_f16(b, 2) * mn).reshape(n, 8, 1)
    return (d * _q5_k_ints(b).reshape(n, 8, 32).astype(F32) - dm).reshape(n, 256)


def _q6_k_ints(b: np.ndarray) -> np.ndarray:
    """Q6_K's 256 quants (0..63, before the -32) in ggml's value order."""
    return _bits(b[:, 0:128], 64, 4) | (_bits(b[:, 128:192], 32, 2) << np.uint8(4))


def _q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K (210 / 256): low nibbles, high 2-bit pairs, 16 int8 scales, f16 d; y = d*sc * (q - 32)."""
    n = b.shape[0]
    d = (_f16(b, 208) * b[:, 192:208].view(np.int8).astype(F32)).reshape(n, 16, 1)
    return (d * (_q6_k_ints(b).astype(F32) - F32(32)).reshape(n, 16, 16)).reshape(n, 256)


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


def _gguf_grid(qtype: GGMLQuantizationType) -> _Dequant:
    """The IQ2/IQ3/IQ1 grid types: gguf-py's own dequantizer, which holds ggml's grids and sign tables and gives
    ggml's dequantize_row_* bits (tests/quants/test_iquants.py compares them with llama.cpp's)."""
    def dequant(b: np.ndarray) -> np.ndarray:
        return gguf_quants.dequantize(b, qtype).astype(F32, copy=False)
    dequant.__doc__ = f"{qtype.name}: grid entries with signs and per-block scales, as ggml's dequantize_row."
    return dequant


_GRID_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)

_DEQUANT: dict[GGMLQuantizationType, _Dequant] = {
    T.F32: _f32, T.F16: _f16_plain, T.BF16: _bf16,
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k, T.Q8_K: _q8_k,
    T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs, T.TQ1_0: _tq1_0, T.TQ2_0: _tq2_0, T.MXFP4: _mxfp4,
    **{t: _gguf_grid(t) for t in _GRID_TYPES},
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


def native_types(core: object) -> frozenset[GGMLQuantizationType]:
    """The ggml types whose matrices the native core multiplies in place: the rows of its traits table
    (``_core.quant_types()``, minillama/_native/quants.h), the one list that decides whether a matrix runs in C."""
    return frozenset(GGMLQuantizationType(t) for t in core.quant_types())  # type: ignore[attr-defined]
