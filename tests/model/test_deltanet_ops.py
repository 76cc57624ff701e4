"""qwen35's gated DeltaNet ops on the native backend as ggml's CPU backend computes them, and the float32 products
and softmax of the Python blocks' experts in llama.cpp's order.

Expected values come from what ggml itself calls: libm's expf and logf (through ctypes, the same library
llama.cpp's CPU backend calls: ggml_vec_sigmoid_f32 and op_softplus take them one value at a time), and
ggml_compute_forward_gated_delta_net's loop written out here in float32 (its AVX2 build fuses every product of
ggml_vec_mad_f32 into its sum and adds the dot products' leftovers one float product at a time: llama.cpp's
intermediate tensors, read through its eval callback, show both). The whole models are held to llama.cpp's stored
log-probs in test_model_archs.py (test_native_steps_give_llamacpps_log_probs: qwen35, qwen35moe).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from minillama.model import deltanet, moe
from minillama.model.layers import Linear, QuantLinear, exp_rows, native_ops

try:
    from minillama._native import _core
except ImportError:  # pragma: no cover - the pure-Python install
    _core = None
pytestmark = pytest.mark.skipif(_core is None, reason="the native core is not built")

F32 = np.float32


@pytest.fixture(scope="module")
def libm() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for name in ("expf", "logf"):
        getattr(lib, name).restype = ctypes.c_float
        getattr(lib, name).argtypes = [ctypes.c_float]
    return lib


def f32s(lib: ctypes.CDLL, fn: str, x: np.ndarray) -> np.ndarray:
    return np.array([getattr(lib, fn)(float(v)) for v in x.ravel()], F32).reshape(x.shape)


def test_sigmoid_and_softplus_take_libms_expf_and_logf(libm: ctypes.CDLL) -> None:
    """In native_ops, sigmoid is 1 / (1 + expf(-x)) and softplus log(1 + expf(x)) (x above 20) with libm's float32
    functions to the bit, as ggml's unary ops; numpy's float32 exp is a few ulps away from expf on some inputs."""
    x = np.random.default_rng(0).normal(0, 4, 4000).astype(F32)
    x[:3] = [F32(25), F32(-30), F32(0)]
    one = F32(1)
    with native_ops(_core):
        sig, soft = deltanet.sigmoid(x.reshape(40, 100)), deltanet.softplus(x)
    assert np.array_equal(sig.ravel(), one / (one + f32s(libm, "expf", -x)))
    logs = f32s(libm, "logf", one + f32s(libm, "expf", np.minimum(x, F32(20))))
    assert np.array_equal(soft, np.where(x > F32(20), x, logs))
    assert not np.array_equal(np.exp(x), f32s(libm, "expf", x)), "numpy's exp agrees with expf: nothing is tested"


def ggml_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                   state: np.ndarray, libm: ctypes.CDLL) -> np.ndarray:
    """ggml's gated_delta_net for head sizes below 32 (no SIMD blocks: every dot product a float sum of float
    products, every ggml_vec_mad_f32 value fused), one float32 operation at a time."""
    def fma(a: F32, b: F32, c: F32) -> F32:  # a float64 product of two floats is exact
        return F32(np.float64(a) * np.float64(b) + np.float64(c))

    def dot(x: np.ndarray, y: np.ndarray) -> F32:
        s = F32(0)
        for a, b in zip(x, y, strict=True):
            s = F32(s + F32(a * b))
        return s

    n, hv, s = v.shape
    scale = F32(1) / F32(np.sqrt(F32(s)))
    out = np.empty((n, hv, s), F32)
    for h in range(hv):
        M = state[h]
        for t in range(n):
            kt, qt = k[t, h % k.shape[1]], q[t, h % q.shape[1]]
            M *= F32(libm.expf(float(g[t, h])))
            for j in range(s):
                delta = F32(F32(v[t, h, j] - dot(M[j], kt)) * beta[t, h])
                M[j] = [fma(kt[i], delta, M[j, i]) for i in range(s)]
            out[t, h] = [F32(dot(M[j], qt) * scale) for j in range(s)]
    return out


def inputs(n: int, hk: int, hv: int, s: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q = deltanet.l2_norm(rng.normal(size=(n, hk, s)).astype(F32), 1e-6)
    k = deltanet.l2_norm(rng.normal(size=(n, hk, s)).astype(F32), 1e-6)
    v = rng.normal(size=(n, hv, s)).astype(F32)
    g = -rng.uniform(0.05, 2.0, (n, hv)).astype(F32)
    beta = rng.uniform(0.1, 0.9, (n, hv)).astype(F32)
    return q, k, v, g, beta


@pytest.mark.skipif(_core is None or _core.kernels() != "avx2", reason="ggml's AVX2 order (fused mad)")
def test_gated_delta_net_kernel_gives_ggmls_bits(libm: ctypes.CDLL) -> None:
    """The native gated_delta_net (two value heads per key head, head size 16) equals ggml's loop to the bit,
    outputs and state, where numpy's (einsum sums, unfused products) does not."""
    q, k, v, g, beta = inputs(6, 2, 4, 16)
    start = np.random.default_rng(1).normal(0, 0.1, (4, 16, 16)).astype(F32)
    want_state = start.copy()
    want = ggml_delta_net(q, k, v, g, beta, want_state, libm)
    state = start.copy()
    with native_ops(_core):
        out, before = deltanet.gated_delta_net(q, k, v, g, beta, state, keep_before_last=True)
    assert np.array_equal(out, want) and np.array_equal(state, want_state)
    numpy_state = start.copy()
    numpy_out, _ = deltanet.gated_delta_net(q, k, v, g, beta, numpy_state)
    assert not np.array_equal(numpy_out, want), "numpy's twin has ggml's bits: nothing is tested"
    np.testing.assert_allclose(numpy_out, want, rtol=1e-4, atol=1e-6)
    # the state before the last token: that of the first n - 1 tokens
    first = start.copy()
    with native_ops(_core):
        deltanet.gated_delta_net(q[:-1], k[:-1], v[:-1], g[:-1], beta[:-1], first)
    assert before is not None and np.array_equal(before, first)


def test_gated_delta_net_kernel_agrees_with_numpys_at_real_widths() -> None:
    """Head size 128 (Qwen3.5's: the AVX2 kernels' blocks of 32), 16 value heads on 4 key heads: the kernel and
    the numpy twin agree to float32 rounding."""
    q, k, v, g, beta = inputs(5, 4, 16, 128, seed=2)
    a, b = np.zeros((16, 128, 128), F32), np.zeros((16, 128, 128), F32)
    with native_ops(_core):
        out, _ = deltanet.gated_delta_net(q, k, v, g, beta, a)
    ref, _ = deltanet.gated_delta_net(q, k, v, g, beta, b)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_gated_delta_net_kernel_refuses_wrong_sizes() -> None:
    """The binding checks every buffer against the sizes it is given."""
    q, k, v, g, beta = inputs(3, 2, 4, 16)
    state, out = np.zeros((4, 16, 16), F32), np.empty((3, 4, 16), F32)
    with pytest.raises(ValueError, match="gated_delta_net: expected"):
        _core.gated_delta_net(q, k, v, g, beta, state, out, None, (3, 4, 2, 32))
    with pytest.raises(ValueError, match="Hv a multiple of Hk"):
        _core.gated_delta_net(q, k, v, g, beta, state, out, None, (3, 4, 3, 16))
    with pytest.raises(ValueError, match="gdn_unary"):
        _core.gdn_unary(q, np.empty(3, F32), 0)


def test_float32_router_of_the_file_multiplies_in_llamacpps_float32_order() -> None:
    """A float32 router left as raw blocks (ffn_gate_inp) in native_ops multiplies as Linear's float32 matrices do
    there (ggml_vec_dot_f32 for one row, tinyBLAS for more: llama.cpp's router logits to the bit, as moe.c's), not
    in the quantized kernels' float32 dot order."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 256)).astype(F32)
    raw = np.frombuffer(w.tobytes(), np.uint8).reshape(8, -1)
    ql = QuantLinear(raw, moe.GGML_F32, 256, _core)
    differs = False
    for rows in (1, 5):
        x = rng.normal(size=(rows, 256)).astype(F32)
        with native_ops(_core):
            got, want = moe.router_logits(ql, x), Linear(w)(x)
        assert np.array_equal(got, want)
        differs |= not np.array_equal(ql(x), want)
    assert differs, "the quantized kernels' float32 dot sums as llama.cpp's: nothing is tested"


def test_expert_softmax_sums_eights_in_float_as_ggmls_avx2_loop() -> None:
    """In native_ops the router's softmax adds each eight exponentials in float32 as ggml_vec_soft_max_f32's AVX2
    loop reduces a vector (high half + low half, then lanes 0 + 2 and 1 + 3, then those two) before its double
    sum, not all of them in double: the probabilities move by an ulp on some rows, which flipped a deepseek2
    position and moved qwen35moe's expert weights."""
    logits = np.random.default_rng(4).normal(0, 3, (2000, 8)).astype(F32)
    with native_ops(_core):
        p = moe.softmax(logits)
        e = exp_rows(logits - logits.max(axis=-1, keepdims=True))
    lanes = (e[:, 4:] + e[:, :4])  # _mm_add_ps(high, low)
    eight = (lanes[:, 0] + lanes[:, 2]) + (lanes[:, 1] + lanes[:, 3])
    want = e * (1.0 / eight.astype(np.float64)).astype(F32)[:, None]
    assert np.array_equal(p, want)
    double = e * (1.0 / e.astype(np.float64).sum(axis=-1)).astype(F32)[:, None]
    assert not np.array_equal(p, double), "the float sums agree with the double sum: nothing is tested"
