"""The IQ2/IQ3/IQ1 grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against llama.cpp itself
(the xllamacpp wheel through cffi), on rows its own ggml_quantize_chunk makes with an importance matrix from random
activations (ggml quantizes IQ2_XXS, IQ2_XS and IQ1_S only with one):

- minillama.quants.dequantize (the pure backend) equals ggml's dequantize_row_* bit for bit;
- the native products equal llama.cpp's bit for bit: one activation row its ggml_vec_dot_*_q8_K as this machine's
  build runs it (the AVX2 form, whose float order differs from the generic one: checked here), and n rows the
  product its CPU backend computes for n (its tiled kernel from 8 rows on), on this CPU's kernels and the scalar
  table's (a child process), at several row lengths and batch sizes;
- hostile sizes give clear errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import REPO

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

try:
    from minillama._native import _core
except ImportError:  # the pure-only install: the kernel tests skip
    _core = None
needs_core = pytest.mark.skipif(_core is None, reason="the native core is not built")

IQ_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
#: Row lengths (one block, several, a real width) and activation batch sizes (below and from 8, where llama.cpp's
#: CPU backend moves from its vec_dot to its tiled kernel).
COLS = (256, 768, 2048)
BATCHES = (1, 2, 4, 5, 7, 8, 9, 13)


def llamacpp():
    """llama.cpp's quantizer, dequantizers and dot products for the grid types through cffi, or skip."""
    cffi = pytest.importorskip("cffi")
    xl = pytest.importorskip("xllamacpp")
    ffi = cffi.FFI()
    names = [t.name.lower() for t in IQ_TYPES]
    ffi.cdef("size_t ggml_quantize_chunk(int type, const float *src, void *dst, int64_t start, int64_t nrows,"
             " int64_t n_per_row, const float *imatrix); void ggml_cpu_init(void);"
             " void quantize_row_q8_K(const float *x, void *y, int64_t k);"
             + "".join(f"void dequantize_row_{n}(const void *x, float *y, int64_t k);" for n in names)
             + "".join(f"void ggml_vec_dot_{n}_q8_K{g}(int n, float *s, size_t bs, const void *vx, size_t bx,"
                       f" const void *vy, size_t by, int nrc);" for n in names for g in ("", "_generic")))
    lib = ffi.dlopen(os.path.join(os.path.dirname(xl.__file__), "xllamacpp.abi3.so"))
    lib.ggml_cpu_init()
    return ffi, lib


def quantized_rows(ffi, lib, t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """rows x cols normal random weights quantized to t by ggml_quantize_chunk with an importance matrix (the mean
    square of 64 random activation rows per column, as llama-imatrix collects it): (rows, row bytes) uint8."""
    block, size = gguf.GGML_QUANT_SIZES[t]
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    imatrix = (rng.standard_normal((64, cols)) ** 2).mean(axis=0).astype(np.float32)
    raw = np.zeros((rows, cols // block * size), np.uint8)
    done = lib.ggml_quantize_chunk(int(t), ffi.cast("float *", w.ctypes.data), ffi.cast("void *", raw.ctypes.data),
                                   0, rows, cols, ffi.cast("float *", imatrix.ctypes.data))
    assert done == raw.nbytes
    return raw


def q8_k(ffi, lib, x: np.ndarray) -> np.ndarray:
    """A float32 row as llama.cpp's quantize_row_q8_K bytes."""
    y = np.zeros(len(x) // 256 * 292, np.uint8)
    lib.quantize_row_q8_K(ffi.cast("float *", x.ctypes.data), ffi.cast("void *", y.ctypes.data), len(x))
    return y


def vec_dots(ffi, lib, t: T, raw: np.ndarray, y: np.ndarray, suffix: str = "") -> np.ndarray:
    """llama.cpp's ggml_vec_dot_<t>_q8_K{suffix} of each weight row with the Q8_K row y."""
    fn, s = getattr(lib, f"ggml_vec_dot_{t.name.lower()}_q8_K{suffix}"), ffi.new("float *")
    out = np.empty(raw.shape[0], np.float32)
    for r in range(raw.shape[0]):
        fn(raw.shape[1] // gguf.GGML_QUANT_SIZES[t][1] * 256, s, 0, ffi.cast("void *", raw[r].ctypes.data), 0,
           ffi.cast("void *", y.ctypes.data), 0, 1)
        out[r] = s[0]
    return out


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_dequantize_equals_llamacpp(t: T) -> None:
    from minillama.quants import dequantize

    ffi, lib = llamacpp()
    rng = np.random.default_rng(int(t))
    for cols in COLS:
        raw = quantized_rows(ffi, lib, t, 5, cols, rng)
        want = np.empty((5, cols), np.float32)
        for r in range(5):
            getattr(lib, f"dequantize_row_{t.name.lower()}")(ffi.cast("void *", raw[r].ctypes.data),
                                                             ffi.cast("float *", want[r].ctypes.data), cols)
        np.testing.assert_array_equal(dequantize(raw, t, cols), want, err_msg=f"{cols} values a row")


def product_mismatches() -> list[str]:
    """This process's kernels (AVX2 or scalar) against llama.cpp on every grid type: one activation row against its
    AVX2 vec_dot, n rows against its CPU backend's product of n rows (ggml_mul_mat, 2 threads); the failures as
    text."""
    from support.ggml_graph import ggml_mul_mat, graph_lib

    ffi, lib = llamacpp()
    gffi, glib = graph_lib()
    bad = []
    for t in IQ_TYPES:
        rng = np.random.default_rng(int(t) + 500)
        for cols in COLS:
            rows = 19  # odd: no kernel's tail is left out
            raw = quantized_rows(ffi, lib, t, rows, cols, rng)
            x = (rng.standard_normal(cols) * rng.uniform(0.01, 10)).astype(np.float32)
            got = np.empty((1, rows), np.float32)
            _core.matvec(raw, int(t), rows, cols, x, got, 1)
            want = vec_dots(ffi, lib, t, raw, q8_k(ffi, lib, x))
            if not np.array_equal(got[0], want):
                bad.append(f"{t.name} {cols} wide, one row: {int((got[0] != want).sum())} of {rows} differ")
            for n in BATCHES:
                xs = (rng.standard_normal((n, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
                got = np.empty((n, rows), np.float32)
                _core.matmul(raw, int(t), rows, cols, xs, got, 2)
                want = ggml_mul_mat(gffi, glib, t, raw, cols, xs)
                if not np.array_equal(got, want):
                    bad.append(f"{t.name} {cols} wide, {n} rows: {int((got != want).sum())} of {got.size} differ")
    return bad


@needs_core
def test_products_equal_llamacpp_bit_for_bit() -> None:
    assert product_mismatches() == [], f"the {_core.kernels()} kernels differ from llama.cpp"


@needs_core
def test_scalar_products_equal_llamacpp_bit_for_bit() -> None:
    """The scalar table (every CPU's fallback) gives the same bits: MINILLAMA_KERNELS=scalar in a child."""
    code = ("import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests', sys.argv[1] + '/tests/quants'];"
            " import test_iquants as q; from minillama._native import _core;"
            " print(json.dumps([_core.kernels(), q.product_mismatches()]))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, check=True,
                         timeout=900, env=dict(os.environ, MINILLAMA_KERNELS="scalar"))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["scalar", []]


def test_llamacpp_vec_dot_is_the_avx2_form() -> None:
    """The products above follow the AVX2 ggml_vec_dot_*_q8_K, the one this machine's llama.cpp runs: its float
    order (eight lanes, then hsum_float_8) gives other bits than ggml's generic form on some rows, so matching it
    is a choice the tests above check."""
    ffi, lib = llamacpp()
    differ = 0
    for t in IQ_TYPES:
        rng = np.random.default_rng(int(t) + 600)
        raw = quantized_rows(ffi, lib, t, 32, 2048, rng)
        y = q8_k(ffi, lib, rng.standard_normal(2048).astype(np.float32))
        differ += int((vec_dots(ffi, lib, t, raw, y) != vec_dots(ffi, lib, t, raw, y, "_generic")).sum())
    assert differ > 0


@needs_core
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_hostile_sizes_are_refused(t: T) -> None:
    """Lengths that do not fit the buffers or the 256-value block are refused by the binding, and a tensor whose
    rows are not whole blocks by the one tensor check, naming the type and its block size."""
    from minillama.errors import FormatError
    from minillama.gguffile.reader import TensorInfo
    from minillama.quants import tensor_layout

    size = gguf.GGML_QUANT_SIZES[t][1]
    raw = np.zeros((4, 2 * size), np.uint8)
    x, out = np.ones((2, 512), np.float32), np.empty((2, 4), np.float32)
    _core.matmul(raw, int(t), 4, 512, x, out, 1)  # all-zero blocks: a valid product
    assert np.array_equal(out, np.zeros_like(out))
    for what, args in {"cols not whole blocks": (raw, int(t), 4, 500, x, out, 1),
                       "more rows than the buffer": (raw, int(t), 5, 512, x, out, 1),
                       "cols lie about the row": (raw, int(t), 2, 1024, x, out, 1),
                       "row shorter than a block": (raw[:, :size - 1].copy(), int(t), 4, 256, x[:, :256].copy(),
                                                    out, 1)}.items():
        with pytest.raises(ValueError):
            _core.matmul(*args)
            pytest.fail(what)
    info = TensorInfo(name="blk.0.ffn_up.weight", shape=(300, 4), ggml_type=int(t), offset=0)
    with pytest.raises(FormatError, match=f"multiple of the {t.name} block size 256"):
        tensor_layout(info, "model.gguf")
