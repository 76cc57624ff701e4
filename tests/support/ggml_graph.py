"""llama.cpp's own matrix product and flash attention through its CPU backend (one-node ggml graphs), via cffi on the
xllamacpp wheel: the references a quantized kernel's n-row product and an attention path are held to."""

from __future__ import annotations

import os

import numpy as np
import pytest

GRAPH_CDEF = """struct ggml_init_params { size_t mem_size; void *mem_buffer; bool no_alloc; };
    struct ggml_context; struct ggml_tensor; struct ggml_cgraph;
    void ggml_cpu_init(void);
    struct ggml_context *ggml_init(struct ggml_init_params params);
    void ggml_free(struct ggml_context *ctx);
    struct ggml_tensor *ggml_new_tensor_2d(struct ggml_context *ctx, int type, int64_t ne0, int64_t ne1);
    struct ggml_tensor *ggml_new_tensor_3d(struct ggml_context *ctx, int type, int64_t ne0, int64_t ne1, int64_t ne2);
    struct ggml_tensor *ggml_mul_mat(struct ggml_context *ctx, struct ggml_tensor *a, struct ggml_tensor *b);
    struct ggml_tensor *ggml_flash_attn_ext(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
        struct ggml_tensor *v, struct ggml_tensor *mask, float scale, float max_bias, float logit_softcap);
    struct ggml_cgraph *ggml_new_graph(struct ggml_context *ctx);
    void ggml_build_forward_expand(struct ggml_cgraph *cgraph, struct ggml_tensor *tensor);
    int ggml_graph_compute_with_ctx(struct ggml_context *ctx, struct ggml_cgraph *cgraph, int n_threads);
    void *ggml_get_data(const struct ggml_tensor *tensor);"""


def graph_lib():
    """(ffi, lib) with GRAPH_CDEF's functions of llama.cpp's ggml, or skip."""
    cffi = pytest.importorskip("cffi")
    xl = pytest.importorskip("xllamacpp")
    ffi = cffi.FFI()
    ffi.cdef(GRAPH_CDEF)
    lib = ffi.dlopen(os.path.join(os.path.dirname(xl.__file__), "xllamacpp.abi3.so"))
    lib.ggml_cpu_init()
    return ffi, lib


def ggml_mul_mat(ffi, lib, t: int, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """llama.cpp's own product of raw (rows of ggml type t) with the float32 rows x: a one-node ggml graph on its CPU
    backend, 2 threads (the weights in a plain buffer: not repacked). ffi, lib: graph_lib()'s, or any that declare
    GRAPH_CDEF's functions."""
    rows, n = raw.shape[0], x.shape[0]
    params = ffi.new("struct ggml_init_params *", {"mem_size": raw.nbytes + 8 * x.nbytes + (1 << 24)})
    ctx = lib.ggml_init(params[0])
    try:
        a, b = lib.ggml_new_tensor_2d(ctx, int(t), cols, rows), lib.ggml_new_tensor_2d(ctx, 0, cols, n)
        ffi.memmove(lib.ggml_get_data(a), raw.tobytes(), raw.nbytes)
        ffi.memmove(lib.ggml_get_data(b), x.tobytes(), x.nbytes)
        c = lib.ggml_mul_mat(ctx, a, b)
        graph = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(graph, c)
        assert lib.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
        return np.frombuffer(ffi.buffer(lib.ggml_get_data(c), 4 * rows * n), np.float32).reshape(n, rows).copy()
    finally:
        lib.ggml_free(ctx)


GGML_F32, GGML_F16 = 0, 1


def ggml_flash_attn(ffi, lib, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, scale: float,
                    threads: int = 2) -> np.ndarray:  # noqa: ANN001
    """llama.cpp's flash attention (ggml_flash_attn_ext, default precision, on `threads` threads) of the queries
    q [n, H, D] (float32) over the cached cells k [n_kv, Hkv, D], v [n_kv, Hkv, Dv] (float16), query i seeing the
    cells where visible[i] is True (the mask: 0 or -inf): [n, H, Dv]. One query over 512 cells or more takes its
    split-KV path (a chunk of the cells per thread)."""
    n, H, D = q.shape
    n_kv, Hkv, Dv = v.shape
    rows = -(-n // 64) * 64  # the mask's rows padded as llama.cpp pads them (its tiled path reads whole tiles)
    mask = np.full((rows, n_kv), -np.inf, np.float16)
    mask[:n] = np.where(visible, 0, -np.inf)
    size = q.nbytes + k.nbytes + v.nbytes + mask.nbytes + 4 * n * H * Dv + (1 << 24)
    ctx = lib.ggml_init(ffi.new("struct ggml_init_params *", {"mem_size": size})[0])
    try:
        tq = lib.ggml_new_tensor_3d(ctx, GGML_F32, D, n, H)  # ne: [D, n, H]
        tk = lib.ggml_new_tensor_3d(ctx, GGML_F16, D, n_kv, Hkv)
        tv = lib.ggml_new_tensor_3d(ctx, GGML_F16, Dv, n_kv, Hkv)
        tm = lib.ggml_new_tensor_2d(ctx, GGML_F16, n_kv, rows)
        for t, a in ((tq, q.transpose(1, 0, 2)), (tk, k.transpose(1, 0, 2)), (tv, v.transpose(1, 0, 2)), (tm, mask)):
            b = np.ascontiguousarray(a).tobytes()
            ffi.memmove(lib.ggml_get_data(t), b, len(b))
        out = lib.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)  # ne: [Dv, H, n]
        graph = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(graph, out)
        assert lib.ggml_graph_compute_with_ctx(ctx, graph, threads) == 0
        return np.frombuffer(ffi.buffer(lib.ggml_get_data(out), 4 * n * H * Dv), np.float32).reshape(n, H, Dv).copy()
    finally:
        lib.ggml_free(ctx)
