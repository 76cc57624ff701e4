"""The building blocks of a llama-family transformer, one plain numpy function each, as llama.cpp computes them.

Shapes in the comments: T tokens in this step, S cached positions attended to (S >= T), H query heads,
Hkv key/value heads (H is a multiple of Hkv: grouped-query attention), D the head size, d the model width.
Everything is float32; matrix products go to numpy's BLAS, or on the native backend (QuantLinear) to the C
kernels over the weights' raw ggml blocks, left in the memory-mapped file.
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
from collections.abc import Iterator
from types import ModuleType

import numpy as np

from .threads import native_threads

F32 = np.float32


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (llama.cpp's LLM_NORM_RMS)."""
    # x [..., d], weight [d]
    ms = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=np.float64).astype(F32)
    return x * (F32(1) / np.sqrt(ms + F32(eps))) * weight


def ggml_thetas(positions: np.ndarray, n_rot: int, base: float) -> np.ndarray:
    """Each pair's angle [T, n_rot/2] as ggml_rope_cache_init makes it, in float32: pos, then each pair's the one
    before times base^(-2/n_rot) (powf: correctly rounded through float64)."""
    theta_scale = F32(np.power(np.float64(F32(base)), np.float64(F32(-2.0) / F32(n_rot))))
    thetas = np.empty((positions.shape[0], n_rot // 2), F32)
    theta = positions.astype(F32)
    for i in range(n_rot // 2):
        thetas[:, i] = theta
        theta = theta * theta_scale
    return thetas


def rope_angles(positions: np.ndarray, n_rot: int, base: float,
                factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of pos * base^(-2i/n_rot) / factors[i] for i < n_rot/2: the rotation of every pair, per position,
    as ggml's rope computes it (ggml_rope_cache_init, and model.c): in float32, pair i + 1's angle that of pair i
    times base^(-2/n_rot), divided by factors[i], then its cosine and sine rounded to float32. (A float64 angle is
    closer to the true one, but an angle one ulp from llama.cpp's rotates q and k a little differently.)

    factors: the file's rope_freqs.weight (Llama 3.x's "llama3" rope scaling), which ggml_rope_ext takes as
    freq_factors and divides each pair's angle by; None: all 1."""
    # positions [T], factors [n_rot/2] -> cos, sin [T, n_rot/2]
    thetas = ggml_thetas(positions, n_rot, base)
    if factors is not None:
        thetas = thetas / factors.astype(F32)
    th = thetas.astype(np.float64)
    return np.cos(th).astype(F32), np.sin(th).astype(F32)


def rope_scaling_params(scaling: str, factor: float, attn_factor: float,
                        log_mul: float = 0.0) -> tuple[float, float, float]:
    """(freq_scale, ext_factor, attn_factor) as llama.cpp's context derives them from the rope.scaling keys (type,
    factor, attn_factor), in float32: "none" turns at the trained speed; a factor makes freq_scale 1/factor;
    "yarn" sets ext_factor 1 and an attention factor that cancels the 1 + 0.1 ln(factor) ggml's rope multiplies
    by (get_mscale(factor, m) / get_mscale(factor, log_mul) with m = log_mul unless it is 1, when log_mul != 0:
    deepseek2's yarn_log_multiplier over 0.1), times rope.scaling.attn_factor."""
    f32 = F32
    freq_scale = f32(1) if scaling == "none" or factor == 0 else f32(1) / f32(factor)
    ext_factor = 1.0 if scaling == "yarn" else 0.0
    attn = f32(1)
    if ext_factor != 0.0:
        scale = f32(1) / freq_scale
        log_scale = f32(np.log(np.float64(scale)))

        def get_mscale(m: F32) -> F32:  # 0.1f * mscale * logf(scale) + 1.0f
            return f32(1) if scale <= 1 else f32(0.1) * f32(m) * log_scale + f32(1)

        if log_mul != 0.0:
            attn = get_mscale(f32(log_mul) if f32(log_mul) != 1 else f32(1)) / get_mscale(f32(log_mul))
        else:
            attn = get_mscale(f32(1))
        attn = attn * (f32(1) / (f32(1) + f32(0.1) * log_scale))
    return float(freq_scale), ext_factor, float(attn * f32(attn_factor))


def yarn_angles(positions: np.ndarray, n_rot: int, base: float, freq_scale: float, ext_factor: float,
                mscale: float, n_ctx_orig: int, beta_fast: float = 32.0, beta_slow: float = 1.0,
                factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each pair's angle, times mscale, as ggml_rope_ext computes them in float32 (ggml-cpu's
    ggml_rope_cache_init and rope_yarn): pair i's angle pos * base^(-2i/n_rot), by repeated float32 products;
    YaRN (ext_factor != 0) blends freq_scale * angle (interpolated) with the angle itself (extrapolated) by a ramp
    over the pairs between its correction dims, and grows mscale by 1 + 0.1 ln(1 / freq_scale). With ext_factor 0
    it is linear scaling (freq_scale: 1 / rope.scaling.factor). factors: as rope_angles' (each pair's angle divided
    first, as ggml_rope_cache_init divides it before rope_yarn)."""
    # positions [T] -> cos, sin [T, n_rot/2]
    f32 = F32

    def logf(x: float) -> F32:  # the float32 libm function, correctly rounded (through float64)
        return f32(np.log(np.float64(f32(x))))

    thetas = ggml_thetas(positions, n_rot, base)
    if factors is not None:
        thetas = thetas / factors.astype(F32)

    def corr_dim(beta: float) -> F32:  # ggml_rope_yarn_corr_dim, in float32
        return f32(n_rot) * logf(f32(n_ctx_orig) / (f32(beta) * f32(2) * f32(np.pi))) / (f32(2) * logf(base))

    low = max(0.0, float(np.floor(f32(corr_dim(beta_fast)))))
    high = min(float(n_rot - 1), float(np.ceil(f32(corr_dim(beta_slow)))))
    interp = f32(freq_scale) * thetas
    scale = f32(mscale)
    if ext_factor != 0.0:
        y = (np.arange(n_rot // 2, dtype=f32) - f32(low)) / f32(max(0.001, high - low))
        mix = (f32(1) - np.minimum(f32(1), np.maximum(f32(0), y))) * f32(ext_factor)
        thetas = interp * (f32(1) - mix) + thetas * mix
        scale = scale * (f32(1) + f32(0.1) * logf(f32(1) / f32(freq_scale)))
    else:
        thetas = interp
    th = thetas.astype(np.float64)
    return np.cos(th).astype(f32) * scale, np.sin(th).astype(f32) * scale


def _rotate(x0: np.ndarray, x1: np.ndarray, c: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x0 c - x1 s, x0 s + x1 c) as ggml's compiled rope computes them (and model.c): the first product fused into
    the sum, fmaf(x0, c, -(x1 s)) and fmaf(x0, s, x1 c) (a float64 product of two floats is exact)."""
    f64 = np.float64
    a = (x0.astype(f64) * c - (x1 * s).astype(f64)).astype(F32)
    b = (x0.astype(f64) * s + (x1 * c).astype(f64)).astype(F32)
    return a, b


def rope_norm(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of the first n_rot dims (llama.cpp's LLAMA_ROPE_TYPE_NORM)."""
    # x [T, H, D], cos/sin [T, n_rot/2]
    n_rot = 2 * cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2], out[..., 1:n_rot:2] = _rotate(x0, x1, c, s)
    return out


def rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x[i], x[i + n_rot/2]) of the first n_rot dims (llama.cpp's LLAMA_ROPE_TYPE_NEOX)."""
    # x [T, H, D], cos/sin [T, n_rot/2]
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    x0, x1 = x[..., :half], x[..., half:2 * half]
    out[..., :half], out[..., half:2 * half] = _rotate(x0, x1, c, s)
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, scale: float,
              window: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal softmax(q k^T * scale) v with grouped-query heads; window > 0 also hides keys window or more back.

    Query head h reads key/value head h // (H / Hkv), as ggml's broadcasting matmul does. A key at position p
    is seen by a query at position t when p <= t (and t - p < window for sliding-window layers). sinks [H]:
    one more logit per head in each row's softmax, with no value (gpt-oss's attention sinks: ggml's
    flash_attn_ext_add_sinks), so a head's weights over the keys sum to less than 1.
    """
    # q [T, H, D], k [S, Hkv, D], v [S, Hkv, Dv] -> [T, H * Dv]
    t, h, d = q.shape
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
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = sinks.astype(F32).reshape(hkv, g, 1, 1)
        top = np.maximum(top, sink)
    scores -= top
    np.exp(scores, out=scores)
    # the sum in key order, in float64 (as ggml's soft_max): a row's sum is then the same whatever hidden keys
    # follow (they add exact zeros), not regrouped by numpy's pairwise summation as the row count changes
    total = np.cumsum(scores, axis=-1, dtype=np.float64)[..., -1:]
    if sinks is not None:
        total = total + np.exp(sink - top)
    scores /= total.astype(F32)
    out = np.matmul(scores, v.transpose(1, 0, 2)[:, None])  # [Hkv, g, T, Dv]
    return out.transpose(2, 0, 1, 3).reshape(t, h * dv)


#: The native core whose element-wise kernels the blocks of the pass running in this thread use (native_ops), or
#: None: numpy's (the pure backend's, and the reference).
_OPS: contextvars.ContextVar[ModuleType | None] = contextvars.ContextVar("minillama_native_ops", default=None)


@contextlib.contextmanager
def native_ops(core: ModuleType | None) -> Iterator[None]:
    """Within it (in this thread), silu, exp_rows and float32 products (Linear) run in core's kernels, llama.cpp's bits: the Python blocks on the native
    backend give llama.cpp's log-probs as the C blocks do (with core.attend for attention, Batch.core)."""
    token = _OPS.set(core)
    try:
        yield
    finally:
        _OPS.reset(token)


def current_ops() -> ModuleType | None:
    """The native core of the native_ops block running in this thread (None: numpy's ops), for element-wise ops
    of other modules that mirror ggml's the same way."""
    return _OPS.get()


def exp_rows(x: np.ndarray) -> np.ndarray:
    """e^x in float32; in native_ops, as ggml_vec_soft_max_f32 takes its exponentials along the last axis
    (ggml_v_expf eight at a time, libm's expf for the rest)."""
    core = _OPS.get()
    if core is None or x.size == 0 or x.ndim == 0:
        return np.exp(x)
    x = np.ascontiguousarray(x, dtype=F32)
    out = np.empty_like(x)
    core.exp_rows(x, out, x.shape[-1])
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x): x / (1 + e^-x) in float32; in native_ops, as ggml_vec_silu_f32 computes each row (e^-x from
    ggml_v_expf, eight at a time, not libm's: a silu one ulp apart flips an 8-bit quantum of the next product)."""
    core = _OPS.get()
    if core is None or x.size == 0 or x.ndim == 0:
        return x / (F32(1) + np.exp(-x))
    x = np.ascontiguousarray(x, dtype=F32)
    out = np.empty_like(x)
    core.silu(x, out, x.shape[-1])
    return out


_GELU_C = F32(np.sqrt(2.0 / np.pi))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation, as ggml's CPU backend computes it (GGML_GELU_FP16: ggml_vec_gelu_f32,
    ggml_vec_geglu_f32): at x rounded to float16, the result rounded to float16 (its table of every float16
    value), 0 at or below -10 and x at or above 10."""
    h = x.astype(np.float16).astype(F32)
    y = (F32(0.5) * h * (F32(1) + np.tanh(_GELU_C * h * (F32(1) + F32(0.044715) * h * h)))).astype(np.float16)
    return np.where(x <= F32(-10), F32(0), np.where(x >= F32(10), x, y.astype(F32)))


#: Up to this many rows, Linear multiplies as (w x^T)^T: OpenBLAS then reads w once, where x w^T repacks all of w
#: on every call (SmolLM2's 49152 x 576 output matrix, 1 thread, machine at load 13: one row 34 ms; four rows
#: 105 ms as x w^T, 74 ms as (w x^T)^T).
FEW_ROWS = 16


class Linear:
    """A weight matrix [out, in], kept as GGUF stores it: one row per output."""

    def __init__(self, w: np.ndarray) -> None:
        self.w = w

    @property
    def n_out(self) -> int:
        """Outputs: the matrix's rows (a fused bias gives zeros of this length to a part the file has no bias for)."""
        return self.w.shape[0]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x w^T (BLAS reads w transposed, no copy); for a few rows (batched decode steps) as (w x^T)^T."""
        # x [T, in] -> [T, out]
        core = _OPS.get()
        if core is not None and self.w.dtype == F32 and x.ndim == 2 and x.shape[0] > 0:
            x = np.ascontiguousarray(x, dtype=F32)
            out = np.empty((x.shape[0], self.w.shape[0]), F32)
            core.mul_f32(np.ascontiguousarray(self.w), x, out, self.w.shape[0], self.w.shape[1])
            return out
        if 1 < x.shape[0] <= FEW_ROWS:
            return np.ascontiguousarray((self.w @ x.T).T)
        return x @ self.w.T

    @staticmethod
    def fuse(parts: list[Linear]) -> Linear:
        """One matrix whose outputs are the parts' outputs side by side: one matmul instead of several."""
        if all(isinstance(p, QuantLinear) for p in parts):
            return QuantLinear.fuse_quant(parts)  # type: ignore[arg-type]
        return Linear(np.concatenate([p.w for p in parts]))


class QuantLinear(Linear):
    """A weight matrix left as its raw ggml blocks (n_out rows of row_bytes, a view of the mapped file),
    multiplied by the native kernels (minillama/_native/quants.c): each activation row quantized as ggml does,
    integer dot products against the blocks, nothing dequantized."""

    def __init__(self, raw: np.ndarray, ggml_type: int, n_in: int, core: ModuleType,
                 mm: mmap.mmap | None = None) -> None:
        super().__init__(raw)
        self.ggml_type, self.n_in, self._core, self._mm = int(ggml_type), n_in, core, mm

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x w^T, [T, in] -> [T, out], the rows split over the current thread count."""
        x = np.ascontiguousarray(x, dtype=F32)
        out = np.empty((x.shape[0], self.w.shape[0]), F32)
        self._core.matmul(self.w, self.ggml_type, self.w.shape[0], self.n_in, x, out, native_threads())
        return out

    @staticmethod
    def fuse_quant(parts: list[QuantLinear]) -> Linear:
        """The parts as one QuantLinear when they lie one after another in the same map with one type (GGUF
        writers put q, k, v and gate, up that way); else a Linear that runs each and joins the outputs."""
        first = parts[0]
        same = all(p.ggml_type == first.ggml_type and p.n_in == first.n_in and p._mm is first._mm for p in parts)
        if same and first._mm is not None:
            base = np.frombuffer(first._mm, np.uint8, 1).ctypes.data
            start = end = first.w.ctypes.data - base
            for p in parts:
                if p.w.ctypes.data - base != end:
                    break
                end += p.w.nbytes
            else:
                rows = sum(p.w.shape[0] for p in parts)
                raw = np.frombuffer(first._mm, np.uint8, end - start, start).reshape(rows, -1)
                return QuantLinear(raw, first.ggml_type, first.n_in, first._core, first._mm)
        return _Joined(parts)


class _Joined(Linear):
    """Several matrices' outputs side by side, each multiplied on its own (parts apart in the file)."""

    def __init__(self, parts: list[QuantLinear]) -> None:
        super().__init__(parts[0].w)
        self.parts = parts

    @property
    def n_out(self) -> int:
        return sum(p.n_out for p in self.parts)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([p(x) for p in self.parts], axis=1)


def glu_ffn(x: np.ndarray, gate_up: Linear, down: Linear, act, b_gate_up: np.ndarray | None = None,
            b_down: np.ndarray | None = None) -> np.ndarray:
    """down(act(gate x) * up x): SwiGLU with act=silu, GeGLU with act=gelu; gate and up stacked in one matrix.

    b_gate_up, b_down: biases added after the matmuls when the file has them (llama.cpp's build_ffn)."""
    # x [T, d], gate_up: d -> 2 * n_ff (gate first), down: n_ff -> d; result [T, d]
    gu = gate_up(x)
    if b_gate_up is not None:
        gu = gu + b_gate_up
    n_ff = gu.shape[1] // 2
    out = down(act(gu[:, :n_ff]) * gu[:, n_ff:])
    return out if b_down is None else out + b_down
