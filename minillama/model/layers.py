"""The building blocks of a llama-family transformer, one plain numpy function each, as llama.cpp computes them.

Shapes in the comments: T tokens in this step, S cached positions attended to (S >= T), H query heads,
Hkv key/value heads (H is a multiple of Hkv: grouped-query attention), D the head size, d the model width.
Everything is float32; matrix products go to numpy's BLAS.
"""

from __future__ import annotations

import os

import numpy as np

F32 = np.float32


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (llama.cpp's LLM_NORM_RMS)."""
    # x [..., d], weight [d]
    ms = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=np.float64).astype(F32)
    return x * (F32(1) / np.sqrt(ms + F32(eps))) * weight


def rope_angles(positions: np.ndarray, n_rot: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of pos * base^(-2i/n_rot) for i < n_rot/2: the rotation of every pair, per position."""
    # positions [T] -> cos, sin [T, n_rot/2]
    if os.environ.get("X_ROPE32"):
        step = np.power(F32(base), F32(-2.0) / F32(n_rot), dtype=F32)
        seq = np.empty((len(positions), n_rot // 2), F32)
        seq[:, 0] = positions.astype(F32)
        seq[:, 1:] = step
        theta = np.multiply.accumulate(seq, axis=1, dtype=F32)
        return np.cos(theta), np.sin(theta)
    inv_freq = np.power(np.float64(base), -np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    theta = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(theta).astype(F32), np.sin(theta).astype(F32)


def rope_norm(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of the first n_rot dims (llama.cpp's LLAMA_ROPE_TYPE_NORM)."""
    # x [T, H, D], cos/sin [T, n_rot/2]
    n_rot = 2 * cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * c - x1 * s
    out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


def rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x[i], x[i + n_rot/2]) of the first n_rot dims (llama.cpp's LLAMA_ROPE_TYPE_NEOX)."""
    # x [T, H, D], cos/sin [T, n_rot/2]
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    x0, x1 = x[..., :half], x[..., half:2 * half]
    out[..., :half] = x0 * c - x1 * s
    out[..., half:2 * half] = x0 * s + x1 * c
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, scale: float,
              window: int = 0) -> np.ndarray:
    """Causal softmax(q k^T * scale) v with grouped-query heads; window > 0 also hides keys window or more back.

    Query head h reads key/value head h // (H / Hkv), as ggml's broadcasting matmul does. A key at position p
    is seen by a query at position t when p <= t (and t - p < window for sliding-window layers).
    """
    # q [T, H, D], k [S, Hkv, D], v [S, Hkv, Dv] -> [T, H * Dv]
    t, h, d = q.shape
    import os
    if os.environ.get("X_Q16"):
        q = q.astype(np.float16).astype(F32)
    s, hkv, dv = v.shape
    g = h // hkv
    qg = q.reshape(t, hkv, g * 1, d).transpose(1, 2, 0, 3)  # [Hkv, g, T, D]
    scores = np.matmul(qg, k.transpose(1, 2, 0)[:, None])  # [Hkv, g, T, S]
    scores *= F32(scale)
    hidden = k_pos[None, :] > q_pos[:, None]  # [T, S]
    if window > 0:
        hidden |= (q_pos[:, None] - k_pos[None, :]) >= window
    if hidden.any():
        scores[..., hidden] = -np.inf
    if os.environ.get("X_FA"):
        f16 = np.float16
        vt = v.transpose(1, 0, 2).astype(f16)  # [Hkv, S, Dv]
        m = np.full((hkv, g, t, 1), -np.inf, F32)
        ssum = np.zeros((hkv, g, t, 1), F32)
        acc = np.zeros((hkv, g, t, dv), f16)
        for j in range(s):
            sc = scores[..., j:j + 1]  # [Hkv, g, T, 1]
            live = sc > -np.inf
            up = live & (sc > m)
            ms = np.where(up, np.exp(np.where(up, m - sc, 0)), F32(1)).astype(F32)
            m_new = np.where(up, sc, m)
            vs = np.where(live, np.where(up, F32(1), np.exp(np.where(live, sc - m_new, 0))), F32(0)).astype(F32)
            acc = np.where(up, (acc.astype(F32) * ms).astype(f16), acc)
            acc = np.where(live, (acc.astype(F32) + vt[:, None, j:j + 1, :].astype(F32) * vs).astype(f16), acc)
            ssum = np.where(live, ssum * ms + vs, ssum)
            m = m_new
        out = acc.astype(F32) / ssum
        return out.transpose(2, 0, 1, 3).reshape(t, h * dv)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = np.matmul(scores, v.transpose(1, 0, 2)[:, None])  # [Hkv, g, T, Dv]
    return out.transpose(2, 0, 1, 3).reshape(t, h * dv)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x / (F32(1) + np.exp(-x))


_GELU_C = F32(np.sqrt(2.0 / np.pi))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu)."""
    import os
    if os.environ.get("X_GELU16"):
        h = x.astype(np.float16).astype(F32)
        y = (F32(0.5) * h * (F32(1) + np.tanh(_GELU_C * h * (F32(1) + F32(0.044715) * h * h)))).astype(np.float16).astype(F32)
        return np.where(x <= -10, F32(0), np.where(x >= 10, x, y))
    return F32(0.5) * x * (F32(1) + np.tanh(_GELU_C * x * (F32(1) + F32(0.044715) * x * x)))


#: The activation format llama.cpp's CPU backend converts x to before its dot products with a weight of each ggml
#: type (type_traits_cpu[type].vec_dot_type), as (values per block, dtype the block's scale is stored in):
#: Q8_0 and Q8_1 blocks of 32 with an fp16 scale, Q8_K blocks of 256 with an f32 scale. Q8_1's extra block sum
#: only differs from Q8_0 by rounding, so both are Q8_0 here. F16/BF16 weights take x rounded to that dtype;
#: F32 weights (and a type not in the table) take x as it is.
Q8_0, Q8_K = (32, np.float16), (256, np.float32)
if os.environ.get("X_D32"):
    Q8_0 = (32, np.float32)
if os.environ.get("X_K32"):
    Q8_K = Q8_0
VEC_DOT_TYPE: dict[str, tuple[int, type] | type] = {
    "Q4_0": Q8_0, "Q4_1": Q8_0, "Q5_0": Q8_0, "Q5_1": Q8_0, "Q8_0": Q8_0, "IQ4_NL": Q8_0, "MXFP4": Q8_0,
    "Q2_K": Q8_K, "Q3_K": Q8_K, "Q4_K": Q8_K, "Q5_K": Q8_K, "Q6_K": Q8_K, "Q8_K": Q8_K, "IQ4_XS": Q8_K,
    "TQ1_0": Q8_K, "TQ2_0": Q8_K, "F16": np.float16,
}


def quantize_q8(x: np.ndarray, block: int, scale_dtype: type) -> np.ndarray:
    """x rounded as llama.cpp's quantize_row_q8_0 / q8_K do: per block, q = rint(x * 127 / max|x|), x' = q * d.

    d = max|x| / 127 stored as scale_dtype (Q8_0: fp16); Q8_K stores 1 / (127 / max|x|) as f32.
    """
    # x [T, n] with n a multiple of block -> [T, n]
    t, n = x.shape
    xb = x.reshape(t, n // block, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)  # [T, n/block, 1]
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
        d = (amax / F32(127)).astype(scale_dtype) if scale_dtype is np.float16 else np.where(inv > 0, F32(1) / inv, 0)
    return (np.rint(xb * inv) * d.astype(F32)).reshape(t, n)


class Linear:
    """A weight matrix [out, in], kept as GGUF stores it: one row per output, dequantized to float32.

    qtype (the weight's ggml type name) picks how x is rounded first (VEC_DOT_TYPE), so that x w^T is the product
    llama.cpp's quantized dot products compute, up to float summation order.
    """

    def __init__(self, w: np.ndarray, qtype: str = "F32") -> None:
        self.w, self.qtype = w, qtype
        self._act = VEC_DOT_TYPE.get(qtype)

    @property
    def n_out(self) -> int:
        return self.w.shape[0]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x, rounded to the activation format of the weight's type, times w^T (BLAS reads w transposed, no copy)."""
        # x [T, in] -> [T, out]
        act = self._act
        import os
        if os.environ.get("X_NOQ") or self.qtype in os.environ.get("X_NOQT", "-").split(","):
            act = None
        if isinstance(act, tuple):
            x = quantize_q8(x, *act)
        elif act is not None:
            x = x.astype(act).astype(F32)
        return x @ self.w.T

    @staticmethod
    def stack(parts: list[Linear]) -> Linear:
        """One matrix whose outputs are the parts' outputs side by side: one matmul instead of several.

        The parts must round x alike (the same VEC_DOT_TYPE entry); the stack keeps the first part's qtype.
        """
        acts = {str(VEC_DOT_TYPE.get(p.qtype)) for p in parts}
        if len(acts) > 1:
            return _Side(parts)
        return Linear(np.concatenate([p.w for p in parts]), parts[0].qtype)


class _Side(Linear):
    """Linear.stack of parts that round x differently: each part's product, side by side."""

    def __init__(self, parts: list[Linear]) -> None:
        self.parts = parts
        self.w = np.empty((sum(p.n_out for p in parts), 0), F32)  # only its shape is used

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([p(x) for p in self.parts], axis=1)


def glu_ffn(x: np.ndarray, gate_up: Linear, down: Linear, act) -> np.ndarray:
    """down(act(gate x) * up x): SwiGLU with act=silu, GeGLU with act=gelu; gate and up stacked in one matrix."""
    # x [T, d], gate_up: d -> 2 * n_ff (gate first), down: n_ff -> d; result [T, d]
    gu = gate_up(x)
    n_ff = gu.shape[1] // 2
    return down(act(gu[:, :n_ff]) * gu[:, n_ff:])
