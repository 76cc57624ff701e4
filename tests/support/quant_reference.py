"""numpy references of ggml's activation quantizers and matrix-vector products, the expected values of the C kernels'
tests (minillama/_native/quants.c runs the products; nothing in the package uses these).

The activation row is quantized to the partner type (Q8_0, Q8_1 or Q8_K) as ggml's x86 ``quantize_row_q8_*`` does
(tests compare the bytes with llama.cpp's), each block's integer dot product is exact, and the blocks' float32 terms
are added in the order of ggml's ``ggml_vec_dot_*_generic``. ``TRAITS[t]`` holds, per ggml type with C kernels, its
layout (from gguf's ``GGML_QUANT_SIZES``), its partner (ggml-cpu's ``vec_dot_type``) and these references.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from minillama.quants import (
    _DEQUANT,
    _bf16,
    _bits,
    _f16,
    _kquant_scales,
    _q3_k_ints,
    _q5,
    _q5_k_ints,
    _q6_k_ints,
)

T = GGMLQuantizationType
F32 = np.float32
_Dequant = Callable[[np.ndarray], np.ndarray]


# ---------------------------------------------------------------------------------------------------------------------
# Activation quantization: a float32 row as ggml's x86 quantize_row_q8_0 / _q8_1 / _q8_K make it.
# ---------------------------------------------------------------------------------------------------------------------

def _to_f16(v: np.ndarray) -> np.ndarray:
    """float32 -> float16 rounded to nearest even (GGML_FP32_TO_FP16), widened back to float32."""
    return v.astype(np.float16).astype(F32)


def _finite_blocks(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(xb with its non-finite blocks zeroed, which blocks were not finite). A block holding a NaN or an infinity
    is quantized with a NaN scale (and block_q8_1's sum NaN) and zero quants, as the C quantizers do
    (quants_common.h: llama.cpp has no one answer for it), so every product with it is NaN and the forward pass
    reports it; finite blocks keep llama.cpp's bytes."""
    bad = ~np.isfinite(xb).all(axis=1)
    if bad.any():
        xb = np.where(bad[:, None], F32(0), xb)
    return xb, bad


def _q8_blocks(x: np.ndarray, qk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d as float32, id, q int8 (nb, qk)): d = amax/127, id = 127/amax (0 for an all-zero block), q = rint(x*id);
    d NaN and q 0 for a block that is not finite (_finite_blocks)."""
    xb, bad = _finite_blocks(x.reshape(-1, qk).astype(F32, copy=False))
    amax = np.abs(xb).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(xb * inv[:, None]).astype(np.int8)
    return np.where(bad, F32(np.nan), amax / F32(127)).astype(F32), inv, q


def quantize_q8_0(x: np.ndarray) -> bytes:
    """The activation row as block_q8_0s (f16 d, int8 qs[32]), bytes equal to ggml's quantize_row_q8_0."""
    d, _, q = _q8_blocks(x, 32)
    out = np.empty((len(q), 34), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q8_1(x: np.ndarray) -> bytes:
    """block_q8_1s (f16 d, f16 s = d * sum(q), int8 qs[32]), as ggml's quantize_row_q8_1."""
    d, _, q = _q8_blocks(x, 32)
    s = d * q.astype(np.int32).sum(axis=1).astype(F32)  # NaN where d is
    out = np.empty((len(q), 36), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = s.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q8_k(x: np.ndarray) -> bytes:
    """block_q8_Ks (f32 d, int8 qs[256], int16 bsums[16]), as ggml's quantize_row_q8_K_ref: the scale from the
    value of largest magnitude (the first of equals), iscale = -127/max, q = min(127, rint(iscale*x)); d NaN and
    q 0 for a block that is not finite (_finite_blocks)."""
    xb, bad = _finite_blocks(x.reshape(-1, 256).astype(F32, copy=False))
    nb = len(xb)
    first = np.abs(xb).argmax(axis=1)
    mx = xb[np.arange(nb), first]
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, F32(-127) / mx, F32(0)).astype(F32)
        d = np.where(bad, F32(np.nan), np.where(mx != 0, F32(1) / iscale, F32(0))).astype(F32)
    q = np.minimum(np.rint(xb * iscale[:, None]), 127).astype(np.int8)
    out = np.empty((nb, 292), np.uint8)
    out[:, 0:4] = d.view(np.uint8).reshape(-1, 4)
    out[:, 4:260] = q.view(np.uint8)
    out[:, 260:] = q.astype(np.int16).reshape(nb, 16, 16).sum(axis=2).astype("<i2").view(np.uint8)
    return out.tobytes()


def _float_partner(dtype: str) -> Callable[[np.ndarray], bytes]:
    """F32/F16/BF16 weights pair with an activation row of their own type (rounded to nearest even)."""
    def quantize(x: np.ndarray) -> bytes:
        x = x.astype(F32)
        if dtype == "bf16":
            u = x.view(np.uint32).astype(np.uint64)
            h = np.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 64, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
            return h.astype("<u2").tobytes()
        return x.astype(dtype).tobytes()
    return quantize


# ---------------------------------------------------------------------------------------------------------------------
# Reference matrix-vector products: weight rows (rows, row_bytes) uint8 and the partner's blocks -> (rows,) float32.
# Integer dot products per block are exact (int64); float32 terms are added as ggml_vec_dot_*_generic adds them.
# ---------------------------------------------------------------------------------------------------------------------

def _blocks(w: np.ndarray, type_size: int) -> np.ndarray:
    """Weight rows as (rows, nb, type_size) uint8."""
    return np.ascontiguousarray(w).reshape(w.shape[0], -1, type_size)


def _act(y: bytes, size: int) -> np.ndarray:
    return np.frombuffer(y, np.uint8).reshape(-1, size)


def _acc_blocks(terms: Callable[[int], np.ndarray], rows: int, nb: int) -> np.ndarray:
    """sumf = 0; for each block in order: sumf += terms(ib) (float32, one value per row)."""
    sumf = np.zeros(rows, F32)
    for ib in range(nb):
        sumf += terms(ib)
    return sumf


def _acc_lanes(aux32: np.ndarray, d: np.ndarray, sumf: np.ndarray | None = None) -> np.ndarray:
    """ggml's eight float lanes of the K-quant dots: sums[l] += d*aux32[l] per block, then sumf += sums[l]."""
    rows, nb, _ = aux32.shape
    sums = np.zeros((rows, 8), F32)
    for ib in range(nb):
        sums += d[:, ib:ib + 1] * aux32[:, ib].astype(F32)
    out = np.zeros(rows, F32) if sumf is None else sumf
    for lane in range(8):
        out = out + sums[:, lane]
    return out


def _int_dot(q: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per block, the exact integer dot product of weight quants (rows, nb, k) and activation quants (nb, k)."""
    return (q.astype(np.int64) * y.astype(np.int64)[None]).sum(axis=2)


def _mv_float(dtype: str) -> Callable[[np.ndarray, bytes], np.ndarray]:
    """F32/F16/BF16: products in float32, summed in double in order, as ggml_vec_dot_f32/_f16/_bf16 generic."""
    def matvec(w: np.ndarray, y: bytes) -> np.ndarray:
        if dtype == "bf16":
            wf = _bf16(np.ascontiguousarray(w)).reshape(w.shape[0], -1)
            yf = _bf16(np.frombuffer(y, np.uint8).reshape(1, -1))
        else:
            wf = np.ascontiguousarray(w).view("<" + ("f4" if dtype == "f32" else "f2")).astype(F32)
            yf = np.frombuffer(y, "<" + ("f4" if dtype == "f32" else "f2")).astype(F32)
        prod = (wf * yf.reshape(1, -1)).astype(np.float64)
        return np.cumsum(prod, axis=1)[:, -1].astype(F32) if prod.shape[1] else np.zeros(len(w), F32)
    return matvec


def _mv_q4_0(w: np.ndarray, y: bytes) -> np.ndarray:
    b, a = _blocks(w, 18), _act(y, 34)
    rows, nb = b.shape[:2]
    q = (_bits(b.reshape(-1, 18)[:, 2:], 16, 4).astype(np.int8) - np.int8(8)).reshape(rows, nb, 32)
    sumi = _int_dot(q, a[:, 2:].view(np.int8)).astype(F32)
    dx, dy = _f16(b.reshape(-1, 18), 0).reshape(rows, nb), _f16(a, 0).reshape(nb)
    return _acc_blocks(lambda ib: sumi[:, ib] * dx[:, ib] * dy[ib], rows, nb)


def _mv_q8_0(w: np.ndarray, y: bytes) -> np.ndarray:
    b, a = _blocks(w, 34), _act(y, 34)
    rows, nb = b.shape[:2]
    sumi = _int_dot(b[:, :, 2:].view(np.int8), a[:, 2:].view(np.int8)).astype(F32)
    dx, dy = _f16(b.reshape(-1, 34), 0).reshape(rows, nb), _f16(a, 0).reshape(nb)
    return _acc_blocks(lambda ib: sumi[:, ib] * (dx[:, ib] * dy[ib]), rows, nb)


def _mv_q5_0(w: np.ndarray, y: bytes) -> np.ndarray:
    b, a = _blocks(w, 22), _act(y, 34)
    rows, nb = b.shape[:2]
    q = (_q5(b.reshape(-1, 22), 2).astype(np.int8) - np.int8(16)).reshape(rows, nb, 32)
    sumi = _int_dot(q, a[:, 2:].view(np.int8)).astype(F32)
    dx, dy = _f16(b.reshape(-1, 22), 0).reshape(rows, nb), _f16(a, 0).reshape(nb)
    return _acc_blocks(lambda ib: (dx[:, ib] * dy[ib]) * sumi[:, ib], rows, nb)


def _mv_q4_1_q5_1(quants: Callable[[np.ndarray], np.ndarray], size: int) -> Callable[[np.ndarray, bytes], np.ndarray]:
    """Q4_1/Q5_1 . Q8_1: sumf += (d_x*d_y)*sumi + m_x*s_y per block."""
    def matvec(w: np.ndarray, y: bytes) -> np.ndarray:
        b, a = _blocks(w, size), _act(y, 36)
        rows, nb = b.shape[:2]
        flat = b.reshape(-1, size)
        sumi = _int_dot(quants(flat).reshape(rows, nb, 32), a[:, 4:].view(np.int8)).astype(F32)
        dx, mx = _f16(flat, 0).reshape(rows, nb), _f16(flat, 2).reshape(rows, nb)
        dy, sy = _f16(a, 0).reshape(nb), _f16(a, 2).reshape(nb)
        return _acc_blocks(lambda ib: (dx[:, ib] * dy[ib]) * sumi[:, ib] + mx[:, ib] * sy[ib], rows, nb)
    return matvec


def _q8k(y: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q8_K row: d (nb,) float32, q (nb, 256) int8, bsums (nb, 16) int16."""
    a = _act(y, 292)
    return a[:, 0:4].copy().view("<f4").reshape(-1), a[:, 4:260].view(np.int8), a[:, 260:].copy().view("<i2")


def _lanes(prod: np.ndarray) -> np.ndarray:
    """Products (rows, nb, 256) summed into ggml's eight int32 lanes: value p goes to lane p % 8."""
    return prod.reshape(prod.shape[0], prod.shape[1], 32, 8).sum(axis=2)


def _mv_q2_k(w: np.ndarray, y: bytes) -> np.ndarray:
    b, (yd, yq, bs) = _blocks(w, 84), _q8k(y)
    rows, nb = b.shape[:2]
    flat = b.reshape(-1, 84)
    sc = flat[:, 0:16].reshape(rows, nb, 16)
    q = _bits(flat[:, 16:80], 32, 2).reshape(rows, nb, 16, 16).astype(np.int64)
    isum = (q * (sc & 0x0F)[..., None] * yq.reshape(1, nb, 16, 16)).sum(axis=(2, 3)).astype(F32)
    summs = ((sc >> 4).astype(np.int64) * bs[None]).sum(axis=2).astype(F32)
    dall = yd[None] * _f16(flat, 80).reshape(rows, nb)
    dmin = yd[None] * _f16(flat, 82).reshape(rows, nb)
    return _acc_blocks(lambda ib: dall[:, ib] * isum[:, ib] - dmin[:, ib] * summs[:, ib], rows, nb)


def _mv_q3_k(w: np.ndarray, y: bytes) -> np.ndarray:
    b, (yd, yq, _) = _blocks(w, 110), _q8k(y)
    rows, nb = b.shape[:2]
    flat = b.reshape(-1, 110)
    scales, q = _q3_k_ints(flat)
    sc = np.repeat(scales.reshape(rows, nb, 16).astype(np.int64), 16, axis=2)
    aux32 = _lanes(sc * q.reshape(rows, nb, 256) * yq[None].astype(np.int64))
    return _acc_lanes(aux32, _f16(flat, 108).reshape(rows, nb) * yd[None])


def _mv_q45_k(quants: Callable[[np.ndarray], np.ndarray], size: int) -> Callable[[np.ndarray, bytes], np.ndarray]:
    """Q4_K/Q5_K . Q8_K: eight int lanes of scale*q*y, sumf -= dmin*sum(bsums*mins) per block, lanes at the end."""
    def matvec(w: np.ndarray, y: bytes) -> np.ndarray:
        b, (yd, yq, bs) = _blocks(w, size), _q8k(y)
        rows, nb = b.shape[:2]
        flat = b.reshape(-1, size)
        sc, mn = (v.astype(np.int64).reshape(rows, nb, 8) for v in _kquant_scales(flat[:, 4:16]))
        aux32 = _lanes(np.repeat(sc, 32, axis=2) * quants(flat).reshape(rows, nb, 256) * yq[None].astype(np.int64))
        sumi = (bs.reshape(1, nb, 8, 2).astype(np.int64).sum(axis=3) * mn).sum(axis=2).astype(F32)
        dmin = _f16(flat, 2).reshape(rows, nb) * yd[None]
        sumf = _acc_blocks(lambda ib: -(dmin[:, ib] * sumi[:, ib]), rows, nb)
        return _acc_lanes(aux32, _f16(flat, 0).reshape(rows, nb) * yd[None], sumf)
    return matvec


def _mv_q6_k(w: np.ndarray, y: bytes) -> np.ndarray:
    b, (yd, yq, _) = _blocks(w, 210), _q8k(y)
    rows, nb = b.shape[:2]
    flat = b.reshape(-1, 210)
    q = _q6_k_ints(flat).astype(np.int64) - 32
    sc = np.repeat(flat[:, 192:208].view(np.int8).astype(np.int64).reshape(rows, nb, 16), 16, axis=2)
    aux32 = _lanes(sc * q.reshape(rows, nb, 256) * yq[None].astype(np.int64))
    return _acc_lanes(aux32, _f16(flat, 208).reshape(rows, nb) * yd[None])


# ---------------------------------------------------------------------------------------------------------------------
# The traits table
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Traits:
    """What minillama knows of one ggml type's matrix-vector product (ggml's type_traits + type_traits_cpu)."""

    block: int  # values per block
    type_size: int  # bytes per block
    dequantize: _Dequant  # (n_blocks, type_size) uint8 -> (n_blocks, block) float32
    partner: GGMLQuantizationType  # the activation type its dot product takes (ggml's vec_dot_type)
    quantize_partner: Callable[[np.ndarray], bytes]  # float32 activation row -> the partner's bytes
    reference: Callable[[np.ndarray, bytes], np.ndarray]  # (weight rows, partner bytes) -> (rows,) float32

    def matvec(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Weight rows (rows, row_bytes) uint8 times the float32 activation row x: the numpy reference."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.reference(w, self.quantize_partner(np.asarray(x, F32)))


def _traits(t: GGMLQuantizationType, partner: GGMLQuantizationType, quantize: Callable[[np.ndarray], bytes],
            reference: Callable[[np.ndarray, bytes], np.ndarray]) -> Traits:
    block, size = GGML_QUANT_SIZES[t]
    return Traits(block, size, _DEQUANT[t], partner, quantize, reference)


#: One row per ggml type minillama multiplies without dequantizing (the C kernels cover the same types).
TRAITS: dict[GGMLQuantizationType, Traits] = {
    T.F32: _traits(T.F32, T.F32, _float_partner("<f4"), _mv_float("f32")),
    T.F16: _traits(T.F16, T.F16, _float_partner("<f2"), _mv_float("f16")),
    T.BF16: _traits(T.BF16, T.BF16, _float_partner("bf16"), _mv_float("bf16")),
    T.Q4_0: _traits(T.Q4_0, T.Q8_0, quantize_q8_0, _mv_q4_0),
    T.Q4_1: _traits(T.Q4_1, T.Q8_1, quantize_q8_1, _mv_q4_1_q5_1(lambda f: _bits(f[:, 4:], 16, 4), 20)),
    T.Q5_0: _traits(T.Q5_0, T.Q8_0, quantize_q8_0, _mv_q5_0),
    T.Q5_1: _traits(T.Q5_1, T.Q8_1, quantize_q8_1, _mv_q4_1_q5_1(lambda f: _q5(f, 4).astype(np.uint8), 24)),
    T.Q8_0: _traits(T.Q8_0, T.Q8_0, quantize_q8_0, _mv_q8_0),
    T.Q2_K: _traits(T.Q2_K, T.Q8_K, quantize_q8_k, _mv_q2_k),
    T.Q3_K: _traits(T.Q3_K, T.Q8_K, quantize_q8_k, _mv_q3_k),
    T.Q4_K: _traits(T.Q4_K, T.Q8_K, quantize_q8_k, _mv_q45_k(lambda f: _bits(f[:, 16:144], 32, 4), 144)),
    T.Q5_K: _traits(T.Q5_K, T.Q8_K, quantize_q8_k, _mv_q45_k(_q5_k_ints, 176)),
    T.Q6_K: _traits(T.Q6_K, T.Q8_K, quantize_q8_k, _mv_q6_k),
}
