"""Qwen3.5's hybrid blocks: gated DeltaNet (linear attention) layers beside gated full-attention layers.

As llama.cpp computes them (src/models/qwen35.cpp, delta-net-base.cpp; ggml's ssm_conv and gated_delta_net ops,
which llama.cpp's CPU backend runs fused for a prompt and for a step alike, token after token). Layer il is full
attention when (il + 1) % full_attention_interval == 0, a DeltaNet layer otherwise. Every block:
x += mixer(RMSNorm(x)); x += ffn(RMSNorm(x)) (post_attention_norm before the feed-forward).

DeltaNet layer, for each token: qkv = h W_qkv goes through a causal depthwise convolution of ssm.conv_kernel taps
over the previous tokens' qkv (the conv state: the last kernel-1 rows), then SiLU; q and k are L2-normed per head;
beta = sigmoid(h W_beta), g = softplus(h W_alpha + dt) * a per value head; the head's state S [key, value] decays
by exp(g), takes the delta rule S += k (beta (v - S^T k))^T, and the output is S^T q / sqrt(head size). The output
is RMS-normed per head (ssm_norm), gated by SiLU(h W_gate) and projected by ssm_out. Value head h reads key head
h % key heads (ggml's broadcast), as llama.cpp's converter orders them.

Full-attention layer: q (with a per-head output gate beside it), k, v; q and k RMS-normed per head; multi-section
rope ("IMROPE") on the first rope.dimension_count dims of each head, which for text (every section at the token's
position but the fourth, at 0) is NEOX rope; softmax attention; the output times sigmoid(gate), then W_o.

HybridCache keeps, per sequence, the attention layers' keys and values and the DeltaNet layers' conv and recurrent
state. The state cannot be cut back to an earlier position as keys and values can: it keeps checkpoints of the
whole state taken at known positions (the end of each multi-token pass, and the position before its last token,
as llama-server keeps checkpoints of a recurrent model's state), and a truncation goes back to the latest
checkpoint at or before the asked position (the caller recomputes from there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ArgumentError, FormatError
from ..quants import dequantize
from .batch import Batch
from .cache import KVCache, Prefix
from .layers import Linear, QuantLinear, current_ops, rmsnorm, rope_angles, rope_neox, silu
from .weights import HParams, TensorSpec

F32 = np.float32

#: Tensors of every block.
COMMON: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    "post_norm": ("blk.{i}.post_attention_norm.weight", ("n_embd",)),
}
#: Tensors of a full-attention block (q holds each head's query and output gate).
ATTENTION: dict[str, TensorSpec] = {
    "wq": ("blk.{i}.attn_q.weight", ("n_embd", "q_gate_dim")),
    "wk": ("blk.{i}.attn_k.weight", ("n_embd", "k_dim")),
    "wv": ("blk.{i}.attn_v.weight", ("n_embd", "v_dim")),
    "wo": ("blk.{i}.attn_output.weight", ("q_dim", "n_embd")),
    "q_norm": ("blk.{i}.attn_q_norm.weight", ("head_dim",)),
    "k_norm": ("blk.{i}.attn_k_norm.weight", ("head_dim",)),
}
#: Tensors of a gated DeltaNet block.
DELTANET: dict[str, TensorSpec] = {
    "ssm_qkv": ("blk.{i}.attn_qkv.weight", ("n_embd", "ssm_conv_dim")),
    "ssm_gate": ("blk.{i}.attn_gate.weight", ("n_embd", "ssm_value_dim")),
    "ssm_conv": ("blk.{i}.ssm_conv1d.weight", ("ssm_d_conv", "ssm_conv_dim")),
    "ssm_dt": ("blk.{i}.ssm_dt.bias", ("ssm_dt_rank",)),
    "ssm_a": ("blk.{i}.ssm_a", ("ssm_dt_rank",)),
    "ssm_beta": ("blk.{i}.ssm_beta.weight", ("n_embd", "ssm_dt_rank")),
    "ssm_alpha": ("blk.{i}.ssm_alpha.weight", ("n_embd", "ssm_dt_rank")),
    "ssm_norm": ("blk.{i}.ssm_norm.weight", ("ssm_d_state",)),
    "ssm_out": ("blk.{i}.ssm_out.weight", ("ssm_value_dim", "n_embd")),
}

#: Most checkpoints of the recurrent state a sequence keeps (llama-server's default --ctx-checkpoints); the oldest
#: goes first.
MAX_CHECKPOINTS = 8

Ffn = Callable[[dict[str, Any], np.ndarray, HParams], np.ndarray]


def is_recurrent(hp: HParams, il: int) -> bool:
    """Layer il is a DeltaNet layer (llama.cpp's is_recr: every full_attention_interval-th layer is attention)."""
    return (il + 1) % hp.full_attention_interval != 0


def check_hparams(hp: HParams) -> None:
    """FormatError unless the DeltaNet sizes are usable as llama.cpp uses them."""
    a = hp.arch
    for field, key in (("ssm_d_conv", "ssm.conv_kernel"), ("ssm_d_state", "ssm.state_size"),
                       ("ssm_dt_rank", "ssm.time_step_rank"), ("ssm_n_group", "ssm.group_count")):
        if getattr(hp, field) < 1:
            raise FormatError(f"{a}.{key} is {getattr(hp, field)} (or missing), expected at least 1: {a}'s "
                              "DeltaNet layers need it", key=f"{a}.{key}")
    if hp.ssm_d_inner != hp.ssm_value_dim:
        raise FormatError(f"{a}.ssm.inner_size is {hp.ssm_d_inner}, expected {hp.ssm_value_dim} (time_step_rank "
                          f"{hp.ssm_dt_rank} value heads of state_size {hp.ssm_d_state})", key=f"{a}.ssm.inner_size")
    if hp.ssm_dt_rank % hp.ssm_n_group:
        raise FormatError(f"{a}.ssm.time_step_rank is {hp.ssm_dt_rank}, expected a multiple of ssm.group_count "
                          f"{hp.ssm_n_group} (value heads share key heads evenly)", key=f"{a}.ssm.time_step_rank")
    if hp.head_dim != hp.head_dim_v:
        raise FormatError(f"{a}.attention.value_length is {hp.head_dim_v}, expected the key length {hp.head_dim} "
                          "(llama.cpp asserts it)", key=f"{a}.attention.value_length")


def block_tensors(ffn: Mapping[str, TensorSpec]) -> Callable[[HParams, int], tuple[dict[str, TensorSpec],
                                                                                   dict[str, TensorSpec]]]:
    """ArchSpec.block_tensors of a hybrid architecture whose feed-forward tensors are ffn."""
    def tensors(hp: HParams, il: int) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
        check_hparams(hp)
        mixer = DELTANET if is_recurrent(hp, il) else ATTENTION
        return {**COMMON, **mixer, **ffn}, {}
    return tensors


def new_cache(hp: HParams, dtype: Any) -> HybridCache:
    """ArchSpec.new_cache: a sequence's keys, values and recurrent state; keys and values of the model's cache type
    (float16 for the native flash attention, float32 arrays of float16 values for numpy's)."""
    return HybridCache(hp, dtype)


def _unary(x: np.ndarray, op: int) -> np.ndarray | None:
    """op (0 sigmoid, 1 softplus, 2 exp) of x in the native core's kernels (libm's expf and logf, as ggml's unary
    ops: numpy's float32 exp is a few ulps from them), or None outside native_ops."""
    core = current_ops()
    if core is None or x.size == 0:
        return None
    x = np.ascontiguousarray(x, dtype=F32)
    out = np.empty_like(x)
    core.gdn_unary(x, out, op)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) (ggml_vec_sigmoid_f32)."""
    out = _unary(x, 0)
    return F32(1) / (F32(1) + np.exp(-x)) if out is None else out


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), x itself above 20 (ggml's op_softplus)."""
    out = _unary(x, 1)
    if out is not None:
        return out
    with np.errstate(over="ignore"):
        return np.where(x > F32(20), x, np.log(F32(1) + np.exp(x))).astype(F32)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / max(|x|, ...) over the last axis as llama.cpp's build_gdn_l2_norm: rms_norm(x, eps/n) / sqrt(n)."""
    n = x.shape[-1]
    return rmsnorm(x, F32(1), eps / n) * F32(1.0 / np.sqrt(F32(n)))


# -- the cache ----------------------------------------------------------------------------------------------------

class HybridPrefix(Prefix):
    """A saved start of a sequence of a hybrid model: keys and values, and the recurrent state at its end (with
    the checkpoints taken before it)."""

    __slots__ = ("conv", "ssm", "checkpoints")

    def __init__(self, ids: list[int], k: list[np.ndarray], v: list[np.ndarray], conv: dict[int, np.ndarray],
                 ssm: dict[int, np.ndarray], checkpoints: list[tuple[int, dict, dict]]) -> None:
        super().__init__(ids, k, v)
        self.conv, self.ssm, self.checkpoints = conv, ssm, checkpoints
        self.nbytes += sum(a.nbytes for a in conv.values()) + sum(a.nbytes for a in ssm.values()) + sum(
            a.nbytes for _, c, s in checkpoints for a in (*c.values(), *s.values()))


def _copy(state: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    return {il: a.copy() for il, a in state.items()}


class HybridCache(KVCache):
    """Keys and values of the attention layers (KVCache, one slot per attention layer) and each DeltaNet layer's
    conv state [kernel - 1, channels] and recurrent state [value heads, head size (value), head size (key)] after
    the cached positions, with checkpoints of that state at earlier positions."""

    def __init__(self, hp: HParams, dtype: Any = F32) -> None:
        self.recurrent = [il for il in range(hp.n_layer) if is_recurrent(hp, il)]
        #: layer -> its slot in the key/value store (attention layers only).
        self.slot = {il: n for n, il in enumerate(il for il in range(hp.n_layer) if not is_recurrent(hp, il))}
        super().__init__(len(self.slot), hp.n_head_kv, hp.head_dim, hp.head_dim_v, dtype=dtype)
        self._conv_shape = (hp.ssm_d_conv - 1, hp.ssm_conv_dim)
        self._ssm_shape = (hp.ssm_dt_rank, hp.ssm_d_state, hp.ssm_d_state)
        self.conv: dict[int, np.ndarray] = {}
        self.ssm: dict[int, np.ndarray] = {}
        self._zero()
        #: (position, conv states, recurrent states), oldest first.
        self.checkpoints: list[tuple[int, dict[int, np.ndarray], dict[int, np.ndarray]]] = []
        #: States before the last token of the pass running now: layer -> (conv, recurrent).
        self.pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _zero(self) -> None:
        self.conv = {il: np.zeros(self._conv_shape, F32) for il in self.recurrent}
        self.ssm = {il: np.zeros(self._ssm_shape, F32) for il in self.recurrent}

    def truncate(self, n: int) -> None:
        """Forget every position from n on; the recurrent state goes back to the latest checkpoint at or before n
        (the start, when none is), so self.n may end below n: the caller runs the positions from self.n again."""
        if n >= self.n:
            return
        best = max((c for c in self.checkpoints if c[0] <= n), key=lambda c: c[0], default=None)
        if best is None:
            self._zero()
            keep = 0
        else:
            keep, conv, ssm = best
            self.conv, self.ssm = _copy(conv), _copy(ssm)
        self.checkpoints = [c for c in self.checkpoints if c[0] <= keep]
        del self.ids[keep:]

    def checkpoint(self, pos: int, conv: dict[int, np.ndarray] | None = None,
                   ssm: dict[int, np.ndarray] | None = None) -> None:
        """Keep a copy of the state at position pos (the current one unless conv and ssm are given)."""
        conv = _copy(self.conv) if conv is None else conv
        ssm = _copy(self.ssm) if ssm is None else ssm
        self.checkpoints = [c for c in self.checkpoints if c[0] != pos] + [(pos, conv, ssm)]
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def export(self, n: int | None = None) -> HybridPrefix:
        """A copy of the sequence up to n positions (all: None); the recurrent state is only known at the end and
        at the checkpoints, so below the end it is the latest checkpoint at or before n."""
        n = self.n if n is None else max(0, min(n, self.n))
        if n == self.n:
            conv, ssm = _copy(self.conv), _copy(self.ssm)
        else:
            best = max((c for c in self.checkpoints if c[0] <= n), key=lambda c: c[0], default=None)
            n, conv, ssm = (0, {}, {}) if best is None else (best[0], _copy(best[1]), _copy(best[2]))
            if best is None:
                conv = {il: np.zeros(self._conv_shape, F32) for il in self.recurrent}
                ssm = {il: np.zeros(self._ssm_shape, F32) for il in self.recurrent}
        kept = [(p, _copy(c), _copy(s)) for p, c, s in self.checkpoints if p <= n]
        return HybridPrefix(list(self.ids[:n]), [k[:n].copy() for k in self.k], [v[:n].copy() for v in self.v],
                            conv, ssm, kept)

    def load(self, prefix: Prefix) -> None:
        """Hold exactly prefix's positions and state (a HybridPrefix of this model)."""
        if not isinstance(prefix, HybridPrefix) or set(prefix.conv) != set(self.recurrent) or any(
                a.shape != self._ssm_shape for a in prefix.ssm.values()):
            raise ArgumentError(f"expected a saved sequence of this hybrid model (keys, values and the recurrent "
                                f"state of layers {self.recurrent}), found {type(prefix).__name__} without it")
        super().load(prefix)
        self.conv, self.ssm = _copy(prefix.conv), _copy(prefix.ssm)
        self.checkpoints = [(p, _copy(c), _copy(s)) for p, c, s in prefix.checkpoints]


def _caches(batch: Batch) -> list[tuple[int, int, int, HybridCache]]:
    """(first row, end row, first position, cache) of each sequence of batch."""
    ends = [row for row, _, _ in batch.seqs[1:]] + [len(batch.positions)]
    return [(row, end, start, cache) for (row, start, cache), end in zip(batch.seqs, ends, strict=True)]  # type: ignore[misc]


# -- the layers ---------------------------------------------------------------------------------------------------

def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                    state: np.ndarray, keep_before_last: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """ggml's gated_delta_net over n tokens, the state [Hv, S, S] (value-major: state[h, j, i] = S[i][j]) updated
    in place; returns (outputs [n, Hv, S], a copy of the state before the last token when asked).

    q, k [n, Hk, S] (L2-normed), v [n, Hv, S], g and beta [n, Hv]. In native_ops, in the core's kernel, in ggml's
    order (expf of g, ggml_vec_dot_f32 and ggml_vec_mad_f32 as its AVX2 build sums); numpy's otherwise."""
    n, hv, s = v.shape
    core = current_ops()
    if core is not None:
        out = np.empty((n, hv, s), F32)
        before = np.empty_like(state) if keep_before_last else None
        c = [np.ascontiguousarray(a, dtype=F32) for a in (q, k, v, g, beta)]
        core.gated_delta_net(*c, state, out, before, (n, hv, q.shape[1], s))
        return out, before
    heads = np.arange(hv) % q.shape[1]
    scale = F32(1.0 / np.sqrt(F32(s)))
    out = np.empty((n, hv, s), F32)
    before = None
    decay = np.exp(g.astype(F32))
    for t in range(n):
        if keep_before_last and t == n - 1:
            before = state.copy()
        kt, qt = k[t, heads], q[t, heads]  # [Hv, S]
        state *= decay[t][:, None, None]
        sk = np.einsum("hji,hi->hj", state, kt)
        delta = (v[t] - sk) * beta[t][:, None]
        state += delta[:, :, None] * kt[:, None, :]
        out[t] = np.einsum("hji,hi->hj", state, qt) * scale
    return out, before


def short_conv(rows: np.ndarray, conv_state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml_ssm_conv over rows [n, C] after conv_state [K-1, C] (weight [C, K]): out[t, c] = sum_i
    in[t + i, c] w[c, i], summed in float32 in tap order; returns (out [n, C], the input [K-1+n, C])."""
    x = np.concatenate([conv_state, rows.astype(F32)])
    n, taps = rows.shape[0], weight.shape[1]
    acc = np.zeros(rows.shape, F32)
    for i in range(taps):
        acc += x[i:i + n] * weight[:, i]
    return acc, x


def deltanet_layer(w: dict[str, Any], h: np.ndarray, hp: HParams, batch: Batch, il: int) -> np.ndarray:
    """A gated DeltaNet layer over the normed stream h [T, d], each sequence of batch on its own state."""
    t = h.shape[0]
    hk, hv, s, kd = hp.ssm_n_group, hp.ssm_dt_rank, hp.ssm_d_state, hp.ssm_key_dim
    qkv = w["ssm_qkv"](h)
    z = w["ssm_gate"](h)
    beta = sigmoid(w["ssm_beta"](h))
    g = softplus(w["ssm_alpha"](h) + w["ssm_dt"]) * w["ssm_a"]
    core = np.empty((t, hv, s), F32)
    for row, end, _, cache in _caches(batch):
        n = end - row
        conv, x = short_conv(qkv[row:end], cache.conv[il], w["ssm_conv_t"])
        cache.conv[il] = x[n:].copy()
        conv = silu(conv)
        q = l2_norm(conv[:, :kd].reshape(n, hk, s), hp.eps)
        k = l2_norm(conv[:, kd:2 * kd].reshape(n, hk, s), hp.eps)
        v = conv[:, 2 * kd:].reshape(n, hv, s)
        state = cache.ssm[il]
        core[row:end], before = gated_delta_net(q, k, v, g[row:end], beta[row:end], state, keep_before_last=n > 1)
        if before is not None:
            cache.pending[il] = (x[n - 1:n - 1 + hp.ssm_d_conv - 1].copy(), before)
    out = rmsnorm(core, w["ssm_norm"], hp.eps) * silu(z.reshape(t, hv, s))
    return w["ssm_out"](out.reshape(t, hv * s))


def rope_cos_sin(hp: HParams, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, n_rot/2] of the multi-section rope llama.cpp runs for qwen35 (IMROPE) on text: a pair takes
    the token's position unless its section is the fourth one, whose position is 0 for text."""
    cos, sin = rope_angles(positions, hp.n_rot, hp.rope_base)
    sec = hp.rope_sections
    if sec and sum(sec) > 0:
        total = sum(sec)
        sector = np.arange(hp.n_rot // 2) % total
        t = (sector % 3 == 0) & (sector < 3 * sec[0])
        h = (sector % 3 == 1) & (sector < 3 * sec[1])
        w = (sector % 3 == 2) & (sector < 3 * sec[2])
        fourth = ~(t | h | w)
        cos[:, fourth], sin[:, fourth] = F32(1), F32(0)
    return cos, sin


def attention_layer(w: dict[str, Any], h: np.ndarray, hp: HParams, batch: Batch, il: int,
                    angles: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A gated full-attention layer over the normed stream h [T, d]."""
    t, nh, d = h.shape[0], hp.n_head, hp.head_dim
    qkv = w["wqkv"](h)
    qg = qkv[:, :2 * hp.q_dim].reshape(t, nh, 2 * d)
    q, gate = qg[:, :, :d], qg[:, :, d:].reshape(t, nh * d)
    k = qkv[:, 2 * hp.q_dim:2 * hp.q_dim + hp.k_dim].reshape(t, hp.n_head_kv, d)
    v = qkv[:, 2 * hp.q_dim + hp.k_dim:].reshape(t, hp.n_head_kv, hp.head_dim_v)
    q, k = rmsnorm(q, w["q_norm"], hp.eps), rmsnorm(k, w["k_norm"], hp.eps)
    cos, sin = angles
    q, k = rope_neox(q, cos, sin), rope_neox(k, cos, sin)
    return w["wo"](attend(batch, il, q, k, v, 1.0 / np.sqrt(d)) * sigmoid(gate))


def attend(batch: Batch, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Batch.attend on each sequence's cache slot of layer il (in C as the C blocks attend on the native backend)."""
    return batch.attend(_caches(batch)[0][3].slot[il], q, k, v, scale)


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """An attention block's q (with its gate), k, v fused into one matrix; the conv weight as [C, K]."""
    if "wq" in t:
        t["wqkv"] = Linear.fuse([t.pop("wq"), t.pop("wk"), t.pop("wv")])
    if "ssm_conv" in t:  # [C, K] as ggml stores it, float32 (ggml_ssm_conv takes no other type)
        conv = t.pop("ssm_conv")
        w = dequantize(conv.w, conv.ggml_type, conv.n_in) if isinstance(conv, QuantLinear) else conv.w
        t["ssm_conv_t"] = np.ascontiguousarray(w, dtype=F32).reshape(-1, conv.n_in if isinstance(
            conv, QuantLinear) else w.shape[1])
    return t


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch, ffn: Ffn) -> np.ndarray:
    """Run every block over x [T, d], extending each sequence's keys, values and recurrent state; a
    multi-token pass leaves checkpoints of the state at its last two positions. The result has the rows of
    batch.out_rows (all when None): llama.cpp takes the last layer's residual and feed-forward on those alone."""
    angles = rope_cos_sin(hp, batch.positions)
    for il, w in enumerate(layers):
        h = rmsnorm(x, w["attn_norm"], hp.eps)
        if "ssm_qkv" in w:
            mixed = deltanet_layer(w, h, hp, batch, il)
        else:
            mixed = attention_layer(w, h, hp, batch, il, angles)
        if il == len(layers) - 1 and batch.out_rows is not None:  # the rest on the kept rows only, as llama.cpp
            x, mixed = x[batch.out_rows], mixed[batch.out_rows]
        x = x + mixed
        x = x + ffn(w, rmsnorm(x, w["post_norm"], hp.eps), hp)
    for row, end, start, cache in _caches(batch):
        if end - row > 1:
            pending, cache.pending = cache.pending, {}
            if pending:
                cache.checkpoint(start + end - row - 1, {il: c for il, (c, _) in pending.items()},
                                 {il: s for il, (_, s) in pending.items()})
            cache.checkpoint(start + end - row)
    return x
