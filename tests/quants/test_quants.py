"""minillama.quants and the native kernels (minillama/_native/quants.c): every type the kernels cover, against
independent references (the numpy ones in tests/support/quant_reference.py).

- the numpy dequantizers equal gguf-py's ``gguf.quants.dequantize`` bit for bit, on random blocks;
- the activation quantizers produce the bytes of llama.cpp's own quantize_row_q8_0 / _q8_1 / _q8_K, and the numpy
  reference products equal llama.cpp's ggml_vec_dot_*_generic to float rounding (that build contracts a*b+c into
  fused multiply-adds, the references do not), on blocks made by llama.cpp's ggml_quantize_chunk (xllamacpp);
- each C kernel (AVX2 where the CPU has it, and the scalar fallback in a child process) equals the numpy reference
  exactly, on random blocks and odd shapes, 1-3 threads, one and several activation rows;
- the C traits table (quants.h) is the one list of types that run in C, its layouts gguf-py's, and Python routes by
  it; attention and swiglu take cpu.c's one choice of kernels;
- the binding checks every length against its buffer; the native forward pass agrees with llama.cpp's greedy
  tokens (SmolLM2, MINILLAMA_TEST_GGUF).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import DATA, REPO
from support.ggml_graph import GRAPH_CDEF, ggml_mul_mat
from support.quant_reference import TRAITS, quantize_q8_0, quantize_q8_1, quantize_q8_k

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

try:
    from minillama._native import _core
except ImportError:  # the pure-only install: the kernel tests skip, the reference tests run
    _core = None
needs_core = pytest.mark.skipif(_core is None, reason="the native core is not built")

#: Byte offsets of every float16 scale field in a block (ggml-common.h): set to finite, moderate values.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0], "MXFP4": []}
#: MXFP4's E8M0 exponent byte (at 0) in random blocks: scales 2^-20..2^-2, finite products.
E8M0_RANDOM = (108, 127)

#: ggml's name of each type's dot product with its partner (ggml_vec_dot_<name>_generic in llama.cpp).
VEC_DOT = {T.Q4_0: "q4_0_q8_0", T.Q4_1: "q4_1_q8_1", T.Q5_0: "q5_0_q8_0", T.Q5_1: "q5_1_q8_1",
           T.Q8_0: "q8_0_q8_0", T.Q2_K: "q2_K_q8_K", T.Q3_K: "q3_K_q8_K", T.Q4_K: "q4_K_q8_K",
           T.Q5_K: "q5_K_q8_K", T.Q6_K: "q6_K_q8_K", T.IQ4_NL: "iq4_nl_q8_0", T.IQ4_XS: "iq4_xs_q8_K",
           T.MXFP4: "mxfp4_q8_0"}

TYPES = list(TRAITS)


def random_rows(t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random rows of type t: random bytes, with every float16 scale a finite value of moderate size."""
    tr = TRAITS[t]
    if t == T.F32:
        return rng.standard_normal((rows, cols)).astype("<f4").view(np.uint8)
    if t == T.F16:
        return rng.standard_normal((rows, cols)).astype("<f2").view(np.uint8)
    if t == T.BF16:
        return (rng.standard_normal((rows, cols)).astype("<f4").view("<u4") >> 16).astype("<u2").view(np.uint8)
    nb = cols // tr.block
    b = rng.integers(0, 256, (rows * nb, tr.type_size), dtype=np.uint8)
    for at in F16_FIELDS[t.name]:
        b[:, at:at + 2] = (rng.uniform(-0.05, 0.05, rows * nb)).astype("<f2").view(np.uint8).reshape(-1, 2)
    if t == T.MXFP4:
        b[:, 0] = rng.integers(*E8M0_RANDOM, rows * nb)
    return b.reshape(rows, nb * tr.type_size)


def shapes(t: T) -> list[tuple[int, int]]:
    """(rows, cols): odd row counts; rows of one and of several blocks, 96 wide (not a multiple of 256) where the
    block is 32; one product large enough to be split over threads."""
    block = TRAITS[t].block
    big = (1031, 1024)  # above the kernels' SMALL_PRODUCT, so the rows are really split over the threads
    if block == 1:
        return [(1, 1), (7, 33), (5, 96), (3, 600), big]
    if block == 32:
        return [(1, 32), (7, 96), (33, 352), big]
    return [(1, 256), (7, 512), (5, 768), big]


# ---------------------------------------------------------------------------------------------------------------------
# numpy against gguf-py and llama.cpp
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_equals_gguf(t: T) -> None:
    rng = np.random.default_rng(int(t))
    raw = random_rows(t, 9, 2 * TRAITS[t].block * (1 if TRAITS[t].block > 1 else 64), rng)
    tr = TRAITS[t]
    ours = tr.dequantize(raw.reshape(-1, tr.type_size)).reshape(raw.shape[0], -1)
    np.testing.assert_array_equal(ours, gguf.quants.dequantize(raw, t).reshape(raw.shape[0], -1))


#: ggml_quantize_mat_t<8, GGML_TYPE_Q8_K> (C++, so by its mangled name): the four-row Q8_K quantizer llama.cpp's
#: repacked Q4_K product (ggml_gemm_q4_K_8x8_q8_K) takes its activations from.
QUANTIZE_MAT_Q8_K_4X8 = "_Z19ggml_quantize_mat_tILl8EL9ggml_type15EEvPKfPvll"


def llamacpp():
    """llama.cpp's quantizers and dot products through cffi (the xllamacpp wheel), or skip."""
    cffi = pytest.importorskip("cffi")
    xl = pytest.importorskip("xllamacpp")
    ffi = cffi.FFI()
    ffi.cdef("size_t ggml_quantize_chunk(int type, const float *src, void *dst, int64_t start, int64_t nrows,"
             " int64_t n_per_row, const float *imatrix); void ggml_cpu_init(void);"
             + "".join(f"void quantize_row_{k}(const float *x, void *y, int64_t k);" for k in ("q8_0", "q8_1", "q8_K"))
             + "".join(f"void ggml_vec_dot_{n}{g}(int n, float *s, size_t bs, const void *vx, size_t bx,"
                       f" const void *vy, size_t by, int nrc);" for n in VEC_DOT.values() for g in ("", "_generic"))
             + "".join(f"void ggml_{g}_{k}(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);"
                       for g in ("gemv", "gemm") for k in ("q4_K_8x8_q8_K", "q4_0_8x8_q8_0", "iq4_nl_8x8_q8_0",
                                                            "mxfp4_8x8_q8_0"))
             + "void ggml_quantize_mat_q8_0_4x8(const float *x, void *y, int64_t k);"
             + f"void {QUANTIZE_MAT_Q8_K_4X8}(const float *x, void *y, int64_t nrow, int64_t n_per_row);"
             + GRAPH_CDEF.replace("void ggml_cpu_init(void);", "")
             + "extern uint16_t ggml_table_gelu_f16[65536];")
    lib = ffi.dlopen(os.path.join(os.path.dirname(xl.__file__), "xllamacpp.abi3.so"))
    lib.ggml_cpu_init()
    return ffi, lib


def llamacpp_rows(ffi, lib, t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """rows x cols normal random weights quantized to type t by llama.cpp's ggml_quantize_chunk: (rows, row bytes)."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = np.empty((rows, cols // TRAITS[t].block * TRAITS[t].type_size), np.uint8)
    lib.ggml_quantize_chunk(int(t), ffi.cast("float *", w.ctypes.data), ffi.cast("void *", raw.ctypes.data), 0, rows,
                            cols, ffi.NULL)
    return raw


#: Each partner's llama.cpp quantizer, and a weight type that uses it.
PARTNERS = {"q8_0": T.Q8_0, "q8_1": T.Q4_1, "q8_K": T.Q4_K}


def quantizer_inputs():
    """Rows that reach every branch: three scales, an all-zero block, equal magnitudes (the first wins in Q8_K)."""
    rng = np.random.default_rng(7)
    for scale in (1e-3, 1.0, 40.0):
        x = (rng.standard_normal(1024) * scale).astype(np.float32)
        x[:32] = 0
        x[256:258] = [-scale * 9, scale * 9]
        yield scale, x


def quantizer_mismatches(lib=None, ffi=None) -> list[str]:
    """The native partner quantizers (this process's kernels: AVX2 or scalar) against llama.cpp's quantize_row_*
    and, for the float16 partner, numpy's float16 rounding; the failures as text."""
    if lib is None:
        ffi, lib = llamacpp()
    bad = []
    for scale, x in quantizer_inputs():
        for name, t in PARTNERS.items():
            want = np.zeros(len(_core.quantize(int(t), x)), np.uint8)
            getattr(lib, f"quantize_row_{name}")(ffi.cast("float *", x.ctypes.data),
                                                 ffi.cast("void *", want.ctypes.data), len(x))
            if _core.quantize(int(t), x) != want.tobytes():
                bad.append(f"{name} at scale {scale}")
        odd = np.concatenate([x, x[:7]])  # float16 rows of any length: the cache's rows
        if _core.quantize(int(T.F16), odd) != odd.astype("<f2").tobytes():
            bad.append(f"f16 at scale {scale}")
    return bad


@pytest.mark.parametrize("name,ours", [("q8_0", quantize_q8_0), ("q8_1", quantize_q8_1), ("q8_K", quantize_q8_k)])
def test_activation_quantizers_equal_llamacpp(name: str, ours) -> None:
    ffi, lib = llamacpp()
    for scale, x in quantizer_inputs():
        mine = ours(x)
        out = np.zeros(len(mine), np.uint8)
        getattr(lib, f"quantize_row_{name}")(ffi.cast("float *", x.ctypes.data), ffi.cast("void *", out.ctypes.data),
                                             len(x))
        assert mine == out.tobytes(), f"{name} differs from llama.cpp at scale {scale}"


@needs_core
def test_native_quantizers_equal_llamacpp() -> None:
    """What every product quantizes its activations with, on this CPU's kernels and (in a child) the scalar ones."""
    ffi, lib = llamacpp()
    assert quantizer_mismatches(lib, ffi) == [], f"{_core.kernels()} quantizers differ"
    code = ("import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests', sys.argv[1] + '/tests/quants']; import test_quants as q; "
            "from minillama._native import _core; print(json.dumps([_core.kernels(), q.quantizer_mismatches()]))")
    env = dict(os.environ, MINILLAMA_KERNELS="scalar")
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env,
                         check=True, timeout=600)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["scalar", []]


@pytest.mark.parametrize("t", list(VEC_DOT), ids=lambda t: t.name)
def test_reference_matvec_equals_llamacpp_vec_dot(t: T) -> None:
    ffi, lib = llamacpp()
    tr, rng = TRAITS[t], np.random.default_rng(int(t) + 100)
    rows, cols = 9, 512
    raw = llamacpp_rows(ffi, lib, t, rows, cols, rng)
    x = rng.standard_normal(cols).astype(np.float32)
    y = np.frombuffer(tr.quantize_partner(x), np.uint8).copy()
    s = ffi.new("float *")
    want = np.empty(rows, np.float32)
    for r in range(rows):
        getattr(lib, f"ggml_vec_dot_{VEC_DOT[t]}_generic")(cols, s, 0, ffi.cast("void *", raw[r].ctypes.data), 0,
                                                           ffi.cast("void *", y.ctypes.data), 0, 1)
        want[r] = s[0]
    got = tr.matvec(raw, x)
    # Float rounding only: a few ulps of the largest partial sum (the integer parts agree or this would be off by
    # whole scale steps, orders of magnitude more).
    bound = 1e-5 * np.abs(tr.dequantize(raw.reshape(-1, tr.type_size)).reshape(rows, cols) * x).sum(axis=1)
    assert np.all(np.abs(got - want) <= bound), (got - want, bound)


def q4_k_x8(blocks: list[np.ndarray]) -> np.ndarray:
    """Eight Q4_K blocks (one per weight row) as llama.cpp's CPU backend repacks them (block_q4_Kx8, ggml's
    make_block_q4_Kx8 with 8-byte interleave): the eight d, the eight dmin, the scales and mins regrouped, the quants
    interleaved 8 bytes at a time."""
    out = np.zeros(1152, np.uint8)
    out[0:16] = np.concatenate([b[0:2] for b in blocks])
    out[16:32] = np.concatenate([b[2:4] for b in blocks])
    for i in range(128):
        out[128 + 8 * i:136 + 8 * i] = blocks[i % 8][16 + 8 * (i // 8):24 + 8 * (i // 8)]
    k = [b[4:16].astype(np.int32) for b in blocks]
    for i in range(4):
        low = ([x[i] & 63 for x in k], [x[i + 4] & 63 for x in k])
        high = ([((x[i] & 192) >> 2) | (x[i + 8] & 15) for x in k],
                [((x[i + 4] & 192) >> 2) | ((x[i + 8] & 240) >> 4) for x in k])
        for base, (sc, mn) in ((32, low), (80, high)):
            o = base + 12 * i
            for j in range(4):
                out[o + j] = (sc[j] & 63) + ((sc[j + 4] & 48) << 2)
                out[o + 4 + j] = (mn[j] & 63) + ((mn[j + 4] & 48) << 2)
                out[o + 8 + j] = (sc[j + 4] & 15) + ((mn[j + 4] & 15) << 4)
    return out


def q4_0_x8(blocks: list[np.ndarray]) -> np.ndarray:
    """Eight Q4_0 blocks as llama.cpp repacks them (block_q4_0x8, make_block_q4_0x8 with 8-byte interleave): the
    eight d, then the quants 8 bytes at a time from each block in turn, each nibble's top bit flipped (xor 0x88)."""
    out = np.zeros(144, np.uint8)
    out[0:16] = np.concatenate([b[0:2] for b in blocks])
    for i in range(16):
        out[16 + 8 * i:24 + 8 * i] = blocks[i % 8][2 + 8 * (i // 8):10 + 8 * (i // 8)] ^ 0x88
    return out


def scaled_x8(scale_bytes: int) -> object:
    """The packer of IQ4_NL (scale_bytes 2: its float16 d) or MXFP4 (1: its E8M0 byte) blocks as llama.cpp repacks
    them (block_iq4_nlx8 / block_mxfp4x8, make_block_*x8 with 8-byte interleave): the eight scales, then the quants
    8 bytes at a time from each block in turn, unchanged."""
    def pack(blocks: list[np.ndarray]) -> np.ndarray:
        out = np.zeros(8 * scale_bytes + 128, np.uint8)
        out[:8 * scale_bytes] = np.concatenate([b[:scale_bytes] for b in blocks])
        for i in range(16):
            at = 8 * scale_bytes + 8 * i
            out[at:at + 8] = blocks[i % 8][scale_bytes + 8 * (i // 8):scale_bytes + 8 * (i // 8) + 8]
        return out
    return pack


#: What llama.cpp repacks at load on AVX2 (matrices of a multiple of 8 rows): type -> (its packer of 8 blocks,
#: its products' names, its four-row activation quantizer, the bytes that quantizer makes per block of values).
REPACKED = {T.Q4_0: (q4_0_x8, "q4_0_8x8_q8_0", "ggml_quantize_mat_q8_0_4x8", 4 * 2 + 4 * 32),
            T.Q4_K: (q4_k_x8, "q4_K_8x8_q8_K", QUANTIZE_MAT_Q8_K_4X8, 4 * 4 + 4 * 256 + 4 * 32),
            T.IQ4_NL: (scaled_x8(2), "iq4_nl_8x8_q8_0", "ggml_quantize_mat_q8_0_4x8", 4 * 2 + 4 * 32),
            T.MXFP4: (scaled_x8(1), "mxfp4_8x8_q8_0", "ggml_quantize_mat_q8_0_4x8", 4 * 2 + 4 * 32)}


def repacked_product(ffi, lib, t: T, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp's product of a repacked matrix (ggml-cpu's repack forward_mul_mat) with the rows x: each group of
    four rows through ggml_gemm_<kind> (activations quantized four rows at a time), the rows after the last group
    through ggml_gemv_<kind>."""
    pack, kind, quantize4, y4_bytes = REPACKED[t]
    tr, rows, n = TRAITS[t], raw.shape[0], x.shape[0]
    nb, full = cols // tr.block, n - n % 4
    packed = [np.concatenate([pack([raw[r0 + r, tr.type_size * b:tr.type_size * (b + 1)] for r in range(8)])
                              for b in range(nb)]) for r0 in range(0, rows, 8)]
    want = np.empty((n, rows), np.float32)
    for i0 in range(0, full, 4):
        y4 = np.empty(nb * y4_bytes, np.uint8)
        getattr(lib, quantize4)(*(ffi.cast("float *", x[i0:].ctypes.data), ffi.cast("void *", y4.ctypes.data)),
                                *((4, cols) if t == T.Q4_K else (cols,)))
        for g, p in enumerate(packed):
            tile = np.empty((4, 8), np.float32)
            getattr(lib, f"ggml_gemm_{kind}")(cols, ffi.cast("float *", tile.ctypes.data), 8,
                                              ffi.cast("void *", p.ctypes.data), ffi.cast("void *", y4.ctypes.data),
                                              4, 8)
            want[i0:i0 + 4, 8 * g:8 * g + 8] = tile
    for i in range(full, n):
        y = np.frombuffer(tr.quantize_partner(x[i]), np.uint8).copy()  # llama.cpp's bytes (tested above)
        for g, p in enumerate(packed):
            getattr(lib, f"ggml_gemv_{kind}")(cols, ffi.cast("float *", want[i, 8 * g:].ctypes.data), 8,
                                              ffi.cast("void *", p.ctypes.data), ffi.cast("void *", y.ctypes.data),
                                              1, 8)
    return want


def llamacpp_one_row(ffi, lib, t: T, raw: np.ndarray, cols: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """llama.cpp's product of the rows raw with one activation row x (y: its partner bytes), as its CPU backend
    computes a row alone: the repacked types' gemv, the others' vec_dot."""
    if t in REPACKED:
        return repacked_product(ffi, lib, t, raw, cols, x[None])[0]
    want, s = np.empty(raw.shape[0], np.float32), ffi.new("float *")
    for r in range(raw.shape[0]):
        getattr(lib, f"ggml_vec_dot_{VEC_DOT[t]}")(cols, s, 0, ffi.cast("void *", raw[r].ctypes.data), 0,
                                                  ffi.cast("void *", y.ctypes.data), 0, 1)
        want[r] = s[0]
    return want


#: The types whose AVX2 kernel computes the bits of the kernel llama.cpp's CPU backend runs on an AVX2 machine:
#: ggml_vec_dot_<name> (its x86 build), and for Q4_0 and Q4_K, which it repacks eight rows interleaved at load,
#: its gemv (IQ4_NL and MXFP4 too, by Q4_0's kernels). Q2_K and Q3_K have no AVX2 kernel here (the scalar order,
#: equal to float rounding).
LLAMACPP_AVX2 = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4]


@needs_core
@pytest.mark.parametrize("t", LLAMACPP_AVX2, ids=lambda t: t.name)
def test_avx2_kernels_equal_llamacpp_bit_for_bit(t: T) -> None:
    """One activation row against llama.cpp's own x86 kernel on blocks made by its quantizer: every output equal,
    not only close. (A difference in which float lane a term lands in, e.g. where Q6_K's -32 offset is taken,
    changed about 80% of the outputs in their last bits; on Gemma 3 that moved the log-probs measurably.)"""
    if _core.kernels() != "avx2":
        pytest.skip(f"this CPU runs the {_core.kernels()} kernels")
    ffi, lib = llamacpp()
    tr, rng = TRAITS[t], np.random.default_rng(int(t) + 200)
    rows, cols = 16 if t in REPACKED else 19, 2048  # 19: the four-row decode kernels' tail too
    for trial in range(4):
        raw = llamacpp_rows(ffi, lib, t, rows, cols, rng)
        x = (rng.standard_normal(cols) * rng.uniform(0.01, 10)).astype(np.float32)
        y = np.frombuffer(tr.quantize_partner(x), np.uint8).copy()  # llama.cpp's bytes (tested above)
        want = llamacpp_one_row(ffi, lib, t, raw, cols, x, y)
        got = np.empty((1, rows), np.float32)
        _core.matvec(raw, int(t), rows, cols, x, got, 1)
        np.testing.assert_array_equal(got[0], want, err_msg=f"trial {trial}")


@needs_core
@pytest.mark.parametrize("t", LLAMACPP_AVX2, ids=lambda t: t.name)
def test_avx2_products_equal_llamacpp_at_every_batch_size(t: T) -> None:
    """A product of n activation rows against llama.cpp's for the same n: its CPU backend sums a row by where it
    falls in a batch (Q5_K and Q6_K from 8 rows on by its tiled kernels; Q4_K, which it repacks, in groups of four
    by ggml_gemm_q4_K_8x8_q8_K and the rows past the last group by ggml_gemv_q4_K_8x8_q8_K; Q4_0, also repacked, the
    same way, whose two forms agree), and so does minillama, so every row of every batch has llama.cpp's bits. (Q4_1
    and Q5_0 take two weight rows a call from 2 to 4 activation rows: an odd row count gives the last row alone.)"""
    if _core.kernels() != "avx2":
        pytest.skip(f"this CPU runs the {_core.kernels()} kernels")
    ffi, lib = llamacpp()
    rng = np.random.default_rng(int(t) + 300)
    cols = 1024
    for rows in (32,) if t in REPACKED else (32, 19):
        raw = llamacpp_rows(ffi, lib, t, rows, cols, rng)
        for n in (1, 2, 3, 4, 6, 7, 8, 9, 13):
            x = (rng.standard_normal((n, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
            got = np.empty((n, rows), np.float32)
            _core.matmul(raw, int(t), rows, cols, x, got, 2)
            want = (repacked_product if t in REPACKED else ggml_mul_mat)(ffi, lib, t, raw, cols, x)
            np.testing.assert_array_equal(got, want, err_msg=f"{rows} weight rows, {n} activation rows")


@needs_core
@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0, T.Q4_1], ids=lambda t: t.name)
def test_avx2_prompt_products_equal_llamacpp(t: T) -> None:
    """Prompt-sized products (Q4_K, Q6_K, Q5_0, Q8_0: the integer GEMM, weight rows packed eight side by side; Q4_1:
    the panel kernel of quants_batch32_avx2.c, two weight rows by a tile; tiles of four activation rows, the weight
    rows split over threads in chunks) against llama.cpp's for the same batch, a real width (eight blocks a row;
    Q5_0 and Q8_0 at 2080 values, 65 blocks, past the kernel's stretch of 32), 1 and 2 threads; and a matrix whose
    row count is not a multiple of eight (a part-filled panel; Q4_1: an odd row, one weight row by a tile) has, row
    for row, the outputs of the full one. Q8_0's rows hold a -128 quant too (llama.cpp's quantizer never makes one,
    a file may hold it)."""
    if _core.kernels() != "avx2":
        pytest.skip(f"this CPU runs the {_core.kernels()} kernels")
    ffi, lib = llamacpp()
    rng = np.random.default_rng(int(t) + 400)
    rows, cols = 56, 2048 if TRAITS[t].block == 256 else 2080
    raw = llamacpp_rows(ffi, lib, t, rows, cols, rng)
    if t == T.Q8_0:
        raw[::3, 2 + 34 * rng.integers(0, cols // 32, rows // 3 + 1)] = 0x80
    for n in (5, 16, 33):
        x = (rng.standard_normal((n, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
        want = llamacpp_product(ffi, lib, t, raw, cols, x)
        for threads in (1, 2):
            np.testing.assert_array_equal(kernel(t, raw, cols, x, threads), want, err_msg=f"{n} rows, {threads} threads")
        part = np.ascontiguousarray(raw[:45])
        np.testing.assert_array_equal(kernel(t, part, cols, x, 2), want[:, :45], err_msg=f"{n} rows, 45 weight rows")


@pytest.mark.parametrize("t", LLAMACPP_AVX2, ids=lambda t: t.name)
def test_avx2_expert_products_equal_llamacpp_row_by_row(t: T) -> None:
    """The rows that chose one expert, multiplied together (each weight block unpacked once for several of them),
    each have the bits llama.cpp's mul_mat_id gives a row alone (its repacked gemv or vec_dot, row by row), at any
    number of rows, with weight rows past the last group of eight and rows longer than 4096 values."""
    if _core.kernels() != "avx2":
        pytest.skip(f"this CPU runs the {_core.kernels()} kernels")
    ffi, lib = llamacpp()
    tr, rng = TRAITS[t], np.random.default_rng(int(t) + 400)
    for rows, cols in ((24, 1024), (8, 8448)):
        raw = llamacpp_rows(ffi, lib, t, rows, cols, rng)
        x = (rng.standard_normal((9, cols)) * rng.uniform(0.01, 10, (9, 1))).astype(np.float32)
        want = np.stack([llamacpp_one_row(ffi, lib, t, raw, cols, xi,
                                          np.frombuffer(tr.quantize_partner(xi), np.uint8).copy()) for xi in x])
        for used in {rows, rows - 5}:
            for n in (1, 2, 4, 5, 9):
                got = np.full((n, used), np.nan, np.float32)
                _core.expert_matmul(np.ascontiguousarray(raw[:used]), int(t), used, cols, x[:n], got, 1)
                np.testing.assert_array_equal(got, want[:n, :used], err_msg=f"{used} x {cols}, {n} rows")


#: The scale fields of the grid types at their edges: float16 zero, subnormal, max, inf and NaN; E8M0 bytes 0 (a
#: subnormal half), 1, 2, 127 (one half), 254 and 255 (2^126: products overflow to inf).
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0x7E00]
EDGE_E8M0 = [0, 1, 2, 127, 254, 255]
GRID_TYPES = [T.IQ4_NL, T.IQ4_XS, T.MXFP4]


def edge_rows(t: T, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Eight rows of type t made by llama.cpp's quantizer, their scales set to every edge value in turn (and a row of
    all-zero quants / all-top quants), and the row length."""
    ffi, lib = llamacpp()
    cols = 512
    raw = llamacpp_rows(ffi, lib, t, 8, cols, rng)
    tr = TRAITS[t]
    blocks = raw.reshape(-1, tr.type_size)
    edges = EDGE_E8M0 if t == T.MXFP4 else EDGE_F16
    for i in range(len(blocks)):
        if t == T.MXFP4:
            blocks[i, 0] = edges[i % len(edges)]
        else:
            blocks[i, 0:2] = np.array([edges[i % len(edges)]], "<u2").view(np.uint8)
    quants = {T.IQ4_NL: 2, T.IQ4_XS: 8, T.MXFP4: 1}[t]
    blocks[0::5, quants:] = 0x00
    blocks[1::5, quants:] = 0xFF
    return raw, cols


def llamacpp_product(ffi, lib, t: T, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp's product on an AVX2 machine: the repacked kernels where it repacks t, else its ggml graph (one
    row: ggml_vec_dot_*)."""
    return (repacked_product if t in REPACKED else ggml_mul_mat)(ffi, lib, t, raw, cols, x)


def grid_edge_mismatches() -> list[str]:
    """The grid types' kernels (this process's: AVX2 or scalar) on blocks with edge scales, against llama.cpp's own
    kernels (AVX2: bit for bit, NaN where it has NaN) or the numpy references in ggml's generic order (scalar:
    exactly), one and nine activation rows, some of them zero or huge; the failures as text."""
    rng, bad = np.random.default_rng(41), []
    avx2 = _core.kernels() == "avx2"
    ffi, lib = llamacpp() if avx2 else (None, None)
    for t in GRID_TYPES:
        raw, cols = edge_rows(t, rng)
        x = (rng.standard_normal((9, cols)) * np.array([1, 0, 1e-3, 1e3, 3e38, 1, 1, 1, 1])[:, None]).astype(np.float32)
        for n in (1, 9):
            got = kernel(t, raw, cols, x[:n], 1)
            if avx2:
                want = llamacpp_product(ffi, lib, t, raw, cols, x[:n])
            else:
                want = np.stack([TRAITS[t].matvec(raw, xi) for xi in x[:n]])
            if not np.array_equal(got, want, equal_nan=True):
                bad.append(f"{t.name} n={n}: {int((~((got == want) | (np.isnan(got) & np.isnan(want)))).sum())} "
                           f"outputs differ")
    return bad


@needs_core
@pytest.mark.parametrize("kernels", [None, "scalar"], ids=["cpu", "scalar"])
def test_grid_types_on_edge_scales(kernels: str | None) -> None:
    """MXFP4, IQ4_NL and IQ4_XS blocks with zero, subnormal, huge, infinite and NaN scales (E8M0 0..255): the same
    outputs as llama.cpp's kernels (AVX2) or ggml's generic order (scalar), in a child so a crash fails the test."""
    assert _in_child(kernels, "grid_edge_mismatches()") == []


@needs_core
def test_gelu_table_equals_llamacpp() -> None:
    """The GELU the native GeGLU looks up, at every float16 it is looked up at (finite, |x| < 10; outside, ggml uses
    0 or x), equals llama.cpp's ggml_table_gelu_f16, which its CPU backend fills with ggml_gelu_f32 as its compiler
    fuses it: 1 + a x x became a fused multiply-add, and at x = -1.999 only that form gives llama.cpp's entry (it
    made one of Gemma 3's test prompts differ from llama.cpp from its fifth layer on)."""
    ffi, lib = llamacpp()
    theirs = np.frombuffer(ffi.buffer(lib.ggml_table_gelu_f16, 2 * 65536), "<f2").astype(np.float32)
    ours = np.frombuffer(_core.gelu_table(), np.float32)
    x = np.arange(65536, dtype=np.uint16).view("<f2").astype(np.float32)
    used = np.isfinite(x) & (np.abs(x) < 10)
    np.testing.assert_array_equal(ours[used], theirs[used])


# ---------------------------------------------------------------------------------------------------------------------
# the C kernels against the numpy references
# ---------------------------------------------------------------------------------------------------------------------

#: Types whose AVX2 products sum a row by its place in the batch, as llama.cpp's CPU backend does.
BATCH_FORMS = {T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS}

#: Types whose AVX2 kernel groups the float terms as ggml's AVX2 kernel does (eight lanes of whole sub-block sums)
#: rather than as the scalar one: exact integer parts, equal to float rounding.
AVX2_FLOAT_ORDER = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4}


def close(t: T, raw: np.ndarray, x: np.ndarray, got: np.ndarray, want: np.ndarray) -> bool:
    """got == want exactly, or (an AVX2 kernel of AVX2_FLOAT_ORDER) within float rounding: 1e-5 of the sum of
    the products' magnitudes, far below one step of any block's scale."""
    if np.array_equal(got, want, equal_nan=True):
        return True
    if t not in AVX2_FLOAT_ORDER or _core.kernels() != "avx2":
        return False
    tr = TRAITS[t]
    w = tr.dequantize(raw.reshape(-1, tr.type_size)).reshape(raw.shape[0], -1).astype(np.float64)
    bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-30
    return bool(np.all(np.abs(got.astype(np.float64) - want) <= bound.reshape(got.shape)))


def kernel(t: T, raw: np.ndarray, cols: int, x: np.ndarray, threads: int) -> np.ndarray:
    out = np.full((x.shape[0], raw.shape[0]), np.nan, np.float32)
    _core.matmul(raw, int(t), raw.shape[0], cols, np.ascontiguousarray(x), out, threads)
    return out


def compare_all_types() -> list[str]:
    """Every type, shape, thread count: C == numpy exactly; the failures as text (empty: all equal)."""
    bad = []
    for t in TYPES:
        rng = np.random.default_rng(int(t) + 1)
        for rows, cols in shapes(t):
            raw = random_rows(t, rows, cols, rng)
            x = (rng.standard_normal((6, cols)) * rng.uniform(0.01, 10)).astype(np.float32)  # 4 + 2: rows kernels
            x[1, : TRAITS[t].block] = 0  # an all-zero activation block
            want = np.stack([TRAITS[t].matvec(raw, xi) for xi in x])
            for threads in (1, 2, 3):
                got = kernel(t, raw, cols, x, threads)
                one = np.empty((1, rows), np.float32)
                _core.matvec(raw, int(t), rows, cols, x[2], one, threads)
                if not (close(t, raw, x, got, want) and close(t, raw, x[2:3], one, want[2:3])):
                    bad.append(f"{t.name} {rows}x{cols} threads={threads}: max |diff| {np.nanmax(np.abs(got - want))}")
            # a row's result does not depend on the rows beside it (tiles of 4, weight rows unpacked in panels of
            # two): each row of a 9-row product has the bits of that row alone; except where llama.cpp's own
            # kernels sum by batch (BATCH_FORMS, compared with llama.cpp at every batch size above)
            x9 = (rng.standard_normal((9, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
            many = kernel(t, raw, cols, x9, 2)
            alone = np.stack([kernel(t, raw, cols, x9[i:i + 1], 1)[0] for i in range(9)])
            if not (t in BATCH_FORMS and _core.kernels() == "avx2") and not np.array_equal(many, alone,
                                                                                           equal_nan=True):
                bad.append(f"{t.name} {rows}x{cols}: a row of a 9-row product differs from the row alone")
    return bad


@needs_core
def test_kernels_equal_references() -> None:
    assert compare_all_types() == [], f"kernels ({_core.kernels()}) differ from the numpy references"


@needs_core
def test_scalar_kernels_equal_references() -> None:
    """The fallback every CPU has: MINILLAMA_KERNELS=scalar in a child (the choice is made once per process)."""
    code = ("import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests', sys.argv[1] + '/tests/quants']; import test_quants as q; "
            "from minillama._native import _core; print(json.dumps([_core.kernels(), q.compare_all_types()]))")
    env = dict(os.environ, MINILLAMA_KERNELS="scalar")
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env,
                         check=True, timeout=600)
    isa, bad = json.loads(out.stdout.strip().splitlines()[-1])
    assert isa == "scalar" and bad == []


NATIVE = REPO / "minillama" / "_native"


def table_rows(source: str, table: str) -> set[T]:
    """The ggml types with a row in the C traits table `table` (its `[MQ_NAME] = {` lines), read from the source."""
    text = (NATIVE / source).read_text(encoding="utf-8")
    body = text[text.index(f" {table}[MQ_NTYPES] = {{"):]
    body = body[:body.index("\n};")]
    return {T[name] for name in re.findall(r"^ +\[MQ_(\w+)\] = \{", body, re.M)}


@needs_core
def test_quant_types_are_the_traits_tables_and_what_python_runs_in_c(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """_core.quant_types() lists the rows of the chosen instruction set's table, the scalar and AVX2 tables have
    the same rows, the scalar kernels' choice (a child) lists the same, and a matrix of every type the package
    reads stays quantized in C exactly when its type is listed (the one truth Python routes by)."""
    from minillama.model.layers import QuantLinear
    from minillama.model.weights import Weights
    from minillama.quants import SUPPORTED_TYPES, native_types

    types = _core.quant_types()
    assert {T(t) for t in types} == table_rows("quants.c", "scalar_traits") == table_rows("quants_avx2.c", "traits")
    assert native_types(_core) == {T(t) for t in types}
    code = "import json; from minillama._native import _core; print(json.dumps(sorted(_core.quant_types().items())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env=dict(os.environ, MINILLAMA_KERNELS="scalar", PYTHONPATH=str(REPO)))
    assert {t: tuple(v) for t, v in json.loads(out.stdout)} == types

    w = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "llama")
    cols = 256  # a multiple of every block size
    for name in SUPPORTED_TYPES:
        block, size = gguf.GGML_QUANT_SIZES[T[name]]
        w.add_tensor(name, np.zeros((2, cols // block * size), np.uint8), raw_dtype=T[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    weights = Weights(tmp_path / "types.gguf")
    in_c = {T[name] for name in SUPPORTED_TYPES if isinstance(weights.matrix(name, (cols, 2)), QuantLinear)}
    weights.close()
    assert in_c == {T(t) for t in types}
    assert set(SUPPORTED_TYPES) - {t.name for t in in_c}, "expected some types the package reads but C does not run"


@needs_core
def test_traits_rows_have_ggml_layouts() -> None:
    """Every row's block size and bytes, and its partner's, are gguf-py's GGML_QUANT_SIZES; the partner is the
    activation type ggml-cpu pairs with the type (its vec_dot_type). Q8_1 is the one exception: gguf-py still
    lists it with float32 d and s (40 bytes), ggml-common.h's block_q8_1 holds them as halves (static_assert
    2 * sizeof(ggml_half) + QK8_1: 36), the bytes test_activation_quantizers_equal_llamacpp compares."""
    partner_sizes = {**gguf.GGML_QUANT_SIZES, T.Q8_1: (32, 36)}
    types = _core.quant_types()
    assert types, "no type runs in C"
    for t, (block, size, partner, partner_block, partner_size) in types.items():
        assert gguf.GGML_QUANT_SIZES[T(t)] == (block, size), T(t).name
        # the IQ2/IQ3/IQ1 grid types (no numpy reference: test_iquants.py compares them with llama.cpp) all take
        # Q8_K, as ggml-cpu's type_traits_cpu says
        assert T(partner) == (TRAITS[T(t)].partner if T(t) in TRAITS else T.Q8_K), T(t).name
        assert partner_sizes[T(partner)] == (partner_block, partner_size), T(t).name


def test_kernel_choice_is_made_once_in_cpu_c() -> None:
    """attention.c and swiglu.c take cpu.c's choice of instruction set (no pick() of their own behind a
    pthread_once, no comparing mq_isa()'s string); the thread pool is threadpool.c's alone; the tokenizer's
    header holds nothing of the quantized types."""
    for name in ("attention.c", "swiglu.c"):
        text = (NATIVE / name).read_text(encoding="utf-8")
        assert "mq_cpu_isa()" in text, name
        for banned in ("pthread_once", "mq_isa", "strcmp", "__builtin_cpu_supports"):
            assert banned not in text, f"{name} has {banned}"
    for name in ("quants.c", "quants_avx2.c", "model.c", "attention.c", "swiglu.c"):
        text = (NATIVE / name).read_text(encoding="utf-8")
        assert "pthread_create" not in text and "__builtin_cpu_supports" not in text, name
    assert "MQ_" not in (NATIVE / "core.h").read_text(encoding="utf-8")


@needs_core
def test_binding_checks_every_length() -> None:
    raw = random_rows(T.Q4_K, 4, 512, np.random.default_rng(3))
    x, out = np.ones((2, 512), np.float32), np.empty((2, 4), np.float32)
    good = (raw, int(T.Q4_K), 4, 512, x, out, 2)
    _core.matmul(*good)
    bad_calls = {
        "unknown type": (raw, 31, 4, 512, x, out, 2),
        "cols not whole blocks": (raw, int(T.Q4_K), 4, 500, x, out, 2),
        "more rows than the buffer": (raw, int(T.Q4_K), 5, 512, x, out, 2),
        "fewer rows than the buffer": (raw, int(T.Q4_K), 3, 512, x, out, 2),
        "cols lie about the row": (raw, int(T.Q4_K), 2, 1024, x, out, 2),
        "x not whole rows": (raw, int(T.Q4_K), 4, 512, np.ones(700, np.float32), out, 2),
        "out too small": (raw, int(T.Q4_K), 4, 512, x, np.empty((2, 3), np.float32), 2),
        "out read-only": (raw, int(T.Q4_K), 4, 512, x, np.frombuffer(bytes(32), np.float32), 2),
        "x float64": (raw, int(T.Q4_K), 4, 512, np.ones((2, 512)), out, 2),
        "zero threads": (raw, int(T.Q4_K), 4, 512, x, out, 0),
        "negative rows": (raw, int(T.Q4_K), -4, 512, x, out, 2),
        "huge rows": (raw, int(T.Q4_K), 1 << 62, 512, x, out, 2),
    }
    for what, args in bad_calls.items():
        with pytest.raises((ValueError, TypeError, BufferError)):
            _core.matmul(*args)
            pytest.fail(what)
    with pytest.raises(ValueError):
        _core.matvec(*good)  # two activation rows given to the one-row product


# ---------------------------------------------------------------------------------------------------------------------
# the native forward pass on a real model
# ---------------------------------------------------------------------------------------------------------------------

@needs_core
def test_native_forward_tracks_llamacpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 on the native kernels (weights left quantized), teacher-forced on llama.cpp's greedy continuations:
    every position at margin >= 0.5 agrees, >= 98% at margin >= 0.1, and the mean |log-prob difference| over
    llama.cpp's top 5 stays at most 0.11 (0.098 measured; the float32 path's 0.086, the goal was 0.03)."""
    from support.paths import real_gguf

    from minillama.model import Model
    from minillama.model.layers import QuantLinear

    path = real_gguf()
    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    m = Model.from_file(path, threads=2)
    assert isinstance(m._layers[0]["w_gate_up"], QuantLinear)
    data = json.loads((DATA / "smollm2_llamacpp_greedy.json").read_text(encoding="utf-8"))
    diffs, wrong, n01, ok01 = [], 0, 0, 0
    for case in (c for c in data["cases"] if c["aligned"]):
        gen = [g["id"] for g in case["gen"]]
        n = len(case["prompt_ids"])
        logits = m.logits(case["prompt_ids"] + gen[:-1])[n - 1:].astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        for row, g in zip(logp, case["gen"], strict=True):
            diffs += [abs(row[i] - lp) for i, lp in g["top"]]
            margin = g["top"][0][1] - g["top"][1][1]
            wrong += margin >= 0.5 and int(row.argmax()) != g["id"]
            n01, ok01 = n01 + (margin >= 0.1), ok01 + (margin >= 0.1 and int(row.argmax()) == g["id"])
    assert wrong == 0 and ok01 >= 0.98 * n01
    assert np.mean(diffs) <= 0.11, f"mean |log-prob difference| {np.mean(diffs):.4f}, expected <= 0.11"


# ---------------------------------------------------------------------------------------------------------------------
# the native forward pass over the map, and hostile tensor metadata
# ---------------------------------------------------------------------------------------------------------------------

def _type_at(data: bytes, name: str) -> int:
    """Where tensor `name`'s ggml type (u32) sits in the tensor table."""
    raw = name.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    return at + 4 + 8 * struct.unpack_from("<I", data, at)[0]


def patched(path: Path, name: str, ggml_type: int | None = None, ne1: int | None = None) -> Path:
    """A copy of the model with tensor `name`'s type or second dimension changed in the table (the data unchanged)."""
    data = bytearray(path.read_bytes())
    at = _type_at(bytes(data), name)
    if ggml_type is not None:
        struct.pack_into("<I", data, at, ggml_type)
    if ne1 is not None:
        struct.pack_into("<Q", data, at - 8, ne1)
    out = path.with_name(f"{name}-{ggml_type}-{ne1}.gguf")
    out.write_bytes(bytes(data))
    return out


def tiny_model(tmp_path: Path, dtype: type = np.float16, qtypes: dict[str, T] | None = None) -> Path:
    """The tiny llama of support.tiny_llama with its matrices as dtype, or (qtypes: a tensor name's part -> type) the
    matrices whose name holds a key quantized to that type by llama.cpp's quantizer."""
    from support.tiny_llama import write_model

    path = write_model(tmp_path / "f32.gguf", blocks=2)
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    ffi, lib = llamacpp() if qtypes else (None, None)
    for field in r.fields.values():
        if field.name.startswith("llama.") or field.name.startswith("tokenizer."):
            w.add_key_value(field.name, field.contents(), field.types[0] if len(field.types) == 1 else field.types[0],
                            sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in r.tensors:
        arr = np.array(t.data).reshape([int(d) for d in reversed(t.shape)])
        qtype = next((q for part, q in (qtypes or {}).items() if part in t.name), None)
        if arr.ndim == 2 and qtype is not None:
            raw = np.empty((arr.shape[0], arr.shape[1] // TRAITS[qtype].block * TRAITS[qtype].type_size), np.uint8)
            x = np.ascontiguousarray(arr, np.float32)
            lib.ggml_quantize_chunk(int(qtype), ffi.cast("float *", x.ctypes.data), ffi.cast("void *", raw.ctypes.data),
                                    0, arr.shape[0], arr.shape[1], ffi.NULL)
            w.add_tensor(t.name, raw, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, arr.astype(dtype) if arr.ndim == 2 else arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "tiny.gguf"


@needs_core
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_native_model_matches_pure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    """The same tiny model on both backends: the native one holds QuantLinear views of the map and scores like the
    float32 path to float16 rounding of the activations (F16) or float rounding (F32)."""
    from minillama.model import Model
    from minillama.model.layers import QuantLinear

    path = tiny_model(tmp_path, dtype)
    ids = [1, 5, 9, 3, 7, 2]
    monkeypatch.setenv("MINILLAMA_BACKEND", "pure")
    want = Model.from_file(path, threads=1).logits(ids)
    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    m = Model.from_file(path, threads=2)
    assert isinstance(m._output, QuantLinear)
    got = m.logits(ids)
    tol = 2e-2 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@needs_core
def test_native_model_of_grid_types_matches_pure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny llama whose matrices are IQ4_NL (attention, output) and MXFP4 (token embedding, feed-forward), as
    llama.cpp quantizes them: the native backend keeps them quantized in C and scores like the pure backend, which
    dequantizes them (numpy), to the rounding of the activations to Q8_0. (IQ4_XS's 256-value blocks do not fit
    the tiny model's 32-wide rows; its kernels are compared with llama.cpp's above.)"""
    from minillama.model import Model
    from minillama.model.layers import QuantLinear

    path = tiny_model(tmp_path, qtypes={"attn": T.IQ4_NL, "output": T.IQ4_NL, "ffn": T.MXFP4, "token_embd": T.MXFP4})
    assert {t.tensor_type for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2} == {T.IQ4_NL, T.MXFP4}
    ids = [1, 5, 9, 3, 7, 2]
    monkeypatch.setenv("MINILLAMA_BACKEND", "pure")
    want = Model.from_file(path, threads=1).logits(ids)
    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    m = Model.from_file(path, threads=2)
    assert isinstance(m._output, QuantLinear) and isinstance(m._layers[0]["w_gate_up"], QuantLinear)
    got = m.logits(ids)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@needs_core
def test_hostile_tensor_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Types and shapes that lie about the bytes are FormatErrors on the native backend, before any kernel runs."""
    from minillama.errors import FormatError
    from minillama.model import Model

    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    path = tiny_model(tmp_path)
    name = "blk.0.attn_q.weight"
    cases = {
        "F16 data called F32 (twice the bytes: runs into the next tensor)": patched(path, name, ggml_type=0),
        "32-wide rows called Q4_K (256-value blocks)": patched(path, name, ggml_type=int(T.Q4_K)),
        "more rows than the data": patched(path, "blk.1.ffn_down.weight", ne1=1 << 40),
        "a second dimension that does not match the model": patched(path, name, ne1=16),
    }
    for what, bad in cases.items():
        with pytest.raises(FormatError) as e:
            Model.from_file(bad)
        assert str(bad) in str(e.value) or bad.name in str(e.value), what


# ---------------------------------------------------------------------------------------------------------------------
# non-finite activations
# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp's quantizers have no single answer for a NaN (quantize_row_q8_K skips it when it looks for the scale and
# rounds it to 0; the AVX2 quantize_row_q8_0 takes the scale from the other values or not, by where the NaN sits, and
# stores -128), so minillama specifies one: an activation block holding a NaN or an infinity is quantized with a NaN
# scale (and, in block_q8_1, a NaN sum) and zero quants, so every product with it is NaN and the forward pass can tell;
# every finite block keeps llama.cpp's bytes. The float partners (F32, F16, BF16) keep the value as IEEE converts it.

NONFINITE = (np.nan, np.inf, -np.inf)
#: The partner block of each weight type (values per activation block, bytes, where the scale, sum and quants are).
PARTNER_LAYOUT = {"q8_0": (32, 34, "<f2", None, 2), "q8_1": (32, 36, "<f2", 2, 4), "q8_K": (256, 292, "<f4", None, 4)}
PARTNER_OF = {T.Q4_0: "q8_0", T.Q5_0: "q8_0", T.Q8_0: "q8_0", T.Q4_1: "q8_1", T.Q5_1: "q8_1", T.Q2_K: "q8_K",
              T.Q3_K: "q8_K", T.Q4_K: "q8_K", T.Q5_K: "q8_K", T.Q6_K: "q8_K", T.IQ4_NL: "q8_0", T.IQ4_XS: "q8_K",
              T.MXFP4: "q8_0"}


def nonfinite_inputs(block: int, cols: int, rng: np.random.Generator):
    """(what, row) pairs: a non-finite value as one element of the second block, at the second block's largest
    magnitude, as every element, and at both ends of the row; each of NaN, +inf, -inf."""
    for bad in NONFINITE:
        base = rng.standard_normal(cols).astype(np.float32)
        at = block + int(rng.integers(block)) if cols > block else int(rng.integers(cols))
        one = base.copy()
        one[at] = bad
        yield f"{bad} at {at}", one
        top = base.copy()
        lo = block if cols > block else 0
        top[lo + int(np.abs(top[lo:lo + block]).argmax())] = bad
        yield f"{bad} at the block's max", top
        yield f"{bad} everywhere", np.full(cols, bad, np.float32)
        ends = base.copy()
        ends[0] = ends[-1] = bad
        yield f"{bad} at both ends", ends


def partner_mismatches(name: str, x: np.ndarray, got: bytes, want_finite: bytes) -> list[str]:
    """got (a partner row of x) against the specification: a block with a non-finite value has a NaN scale (and sum)
    and zero quants; every other block equals want_finite's (llama.cpp's bytes for x with those blocks zeroed)."""
    block, size, scale_t, sum_at, q_at = PARTNER_LAYOUT[name]
    g, w = np.frombuffer(got, np.uint8).reshape(-1, size), np.frombuffer(want_finite, np.uint8).reshape(-1, size)
    bad = []
    for ib, xb in enumerate(x.reshape(-1, block)):
        if np.isfinite(xb).all():
            if not np.array_equal(g[ib], w[ib]):
                bad.append(f"finite block {ib} differs from llama.cpp's")
            continue
        nan_scale = np.isnan(g[ib, :np.dtype(scale_t).itemsize].view(scale_t)[0])
        nan_sum = sum_at is None or np.isnan(g[ib, sum_at:sum_at + 2].view("<f2")[0])
        if not (nan_scale and nan_sum and not g[ib, q_at:q_at + block].any()):
            bad.append(f"non-finite block {ib}: {g[ib, :8].tolist()}..., expected a NaN scale and zero quants")
    return bad


def nonfinite_mismatches(quantizers: dict[str, object], seed: int = 11) -> list[str]:
    """Every partner quantizer (quantizers: name -> x -> bytes) on nonfinite_inputs against the specification, with
    llama.cpp's quantize_row_* giving the finite blocks' bytes; the failures as text."""
    ffi, lib = llamacpp()
    rng, bad = np.random.default_rng(seed), []
    for name, (block, _, _, _, _) in PARTNER_LAYOUT.items():
        for what, x in nonfinite_inputs(block, 3 * block, rng):
            finite = x.copy()
            finite.reshape(-1, block)[~np.isfinite(x.reshape(-1, block)).all(axis=1)] = 0
            want = np.zeros(len(quantizers[name](finite)), np.uint8)
            getattr(lib, f"quantize_row_{name}")(ffi.cast("float *", finite.ctypes.data),
                                                 ffi.cast("void *", want.ctypes.data), len(x))
            bad += [f"{name}, {what}: {m}" for m in partner_mismatches(name, x, quantizers[name](x), want.tobytes())]
    return bad


def test_numpy_quantizers_flag_nonfinite_blocks() -> None:
    """The pure backend's partners (minillama.quants) follow the specification."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast": nothing undefined is computed
        assert nonfinite_mismatches({"q8_0": quantize_q8_0, "q8_1": quantize_q8_1, "q8_K": quantize_q8_k}) == []


def native_nonfinite_failures(seed: int = 12, rounds: int = 1) -> list[str]:
    """This process's kernels (AVX2 or scalar) on non-finite activations: every partner quantizer against the
    specification; every type's products (one row, the rows kernels, the panels, the batch forms, 1 and 2 threads)
    NaN for a row with a non-finite value (F32/F16/BF16: not finite), every other row equal to the reference. With
    rounds > 1, also random rows with random non-finite elements (a fuzz). The failures as text."""
    bad = nonfinite_mismatches({k: (lambda x, t=t: _core.quantize(int(t), x)) for k, t in PARTNERS.items()}, seed)
    for src, want_t in ((np.float16, T.F16), (None, T.BF16)):
        for what, x in nonfinite_inputs(32, 96, np.random.default_rng(seed)):
            got = np.frombuffer(_core.quantize(int(want_t), x), "<u2")
            ref = x.astype(src).view("<u2") if src else np.frombuffer(TRAITS[T.BF16].quantize_partner(x), "<u2")
            bad += [f"{want_t.name} {what}"] if not np.array_equal(got, ref) else []
    rng = np.random.default_rng(seed)
    for t in TYPES:
        block = TRAITS[t].block
        cols = 512 if block == 256 else 128
        raw = random_rows(t, 37, cols, rng)
        rows = [x for _, x in nonfinite_inputs(max(block, 32), cols, rng)]
        for _ in range(rounds - 1):  # the fuzz: random rows, random non-finite elements at random places
            x = (rng.standard_normal(cols) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
            at = rng.integers(cols, size=int(rng.integers(1, 4)))
            x[at] = rng.choice(NONFINITE, size=at.size)
            rows.append(x)
        for n in (1, 2, 4, 5, 9):  # one row, a tile, a tile and one, the batch forms (MQ_BATCH) and panels
            for start in range(0, len(rows), max(1, len(rows) // 3)):
                x = np.stack([rows[(start + i) % len(rows)] if i % 2 == 0 else
                              rng.standard_normal(cols).astype(np.float32) for i in range(n)])
                for threads in (1, 2):
                    got, xs = kernel(t, raw, cols, x, threads), x
                    if n == 1:  # and the one-row binding
                        one = np.empty((1, raw.shape[0]), np.float32)
                        _core.matvec(raw, int(t), raw.shape[0], cols, x[0], one, threads)
                        got, xs = np.concatenate([got, one]), np.concatenate([x, x])
                    for i, xi in enumerate(xs):
                        if np.isfinite(xi).all():
                            want = TRAITS[t].matvec(raw, xi)[None]
                            if not close(t, raw, xi[None], got[i:i + 1], want):
                                bad.append(f"{t.name} n={n}: the finite row {i} differs from the reference")
                        elif t in PARTNER_OF and not np.isnan(got[i]).all():
                            bad.append(f"{t.name} n={n} threads={threads}: row {i} gives {got[i][:4]}, not NaN")
                        elif t not in PARTNER_OF and np.isfinite(got[i]).any():
                            bad.append(f"{t.name} n={n} threads={threads}: row {i} has finite outputs")
    return bad


def _in_child(kernels: str | None, call: str) -> list[str]:
    """call (an expression of test_quants, a list of failures) in a child with MINILLAMA_KERNELS=kernels: a crash in
    the kernels fails the test instead of ending pytest."""
    code = ("import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests', sys.argv[1] + '/tests/quants']; import test_quants as q; "
            f"print(json.dumps(q.{call}))")
    env = dict(os.environ)
    env.pop("MINILLAMA_KERNELS", None)
    if kernels:
        env["MINILLAMA_KERNELS"] = kernels
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, f"the child ended with {out.returncode}: {out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_core
@pytest.mark.parametrize("kernels", [None, "scalar"], ids=["cpu", "scalar"])
def test_kernels_on_nonfinite_activations(kernels: str | None) -> None:
    """Every kernel binding on rows holding NaN, +inf, -inf (one element, every element, the block's max): no crash
    (a NaN block max made the AVX2 Q8_K quantizer run off the row), and NaN out for those rows only."""
    assert _in_child(kernels, "native_nonfinite_failures()") == []


@needs_core
@pytest.mark.parametrize("kernels", [None, "scalar"], ids=["cpu", "scalar"])
def test_fuzz_kernels_with_nonfinite_activations(kernels: str | None) -> None:
    """Random rows with random non-finite elements through every binding (run under the sanitizers in CI)."""
    assert _in_child(kernels, "native_nonfinite_failures(seed=13, rounds=25)") == []
