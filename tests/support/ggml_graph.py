"""llama.cpp's own matrix product through its CPU backend (a one-node ggml graph), via cffi on the xllamacpp wheel:
the reference a quantized kernel's n-row product is held to."""

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
    struct ggml_tensor *ggml_mul_mat(struct ggml_context *ctx, struct ggml_tensor *a, struct ggml_tensor *b);
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
