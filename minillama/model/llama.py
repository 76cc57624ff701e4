"""llama (SmolLM2, Llama 2/3, ...): pre-norm transformer blocks with rope'd grouped-query attention and SwiGLU.

Each block: h = RMSNorm(x); q, k, v = h Wq, h Wk, h Wv; rotate q and k by their positions (rope, adjacent
pairs: llama.cpp's converter permuted the q/k rows so that this "NORM" rope matches the original model);
x += softmax(q k^T / sqrt(D), causal) v Wo; then x += W_down(silu(W_gate h) * W_up h) with h = RMSNorm(x).
The token embedding starts the stream; a final RMSNorm and the output matrix (or the embedding, when tied)
give the logits.

Optional tensors, used when the file has them, as llama.cpp's LLM_ARCH_LLAMA loads them: rope_freqs.weight
(Llama 3.x: llama3 rope scaling baked into per-pair factors that divide each pair's angle, ggml_rope_ext's
freq_factors), and biases on the q, k, v and output projections and on the three feed-forward matrices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .batch import Batch
from .layers import Linear, glu_ffn, rmsnorm, rope_angles, rope_norm, silu
from .spec import ArchSpec, Native, register
from .weights import HParams, TensorSpec

#: The two layouts of a block's q, k and v that llama.cpp's loader (create_tensor_qkv) takes in every architecture
#: here: three matrices, each with an optional bias, or one attn_qkv matrix (q rows, then k, then v) with an
#: optional attn_qkv.bias. The file decides, block by block (Model.from_file swaps one for the other).
SEPARATE_QKV: dict[str, TensorSpec] = {
    "wq": ("blk.{i}.attn_q.weight", ("n_embd", "q_dim")),
    "wk": ("blk.{i}.attn_k.weight", ("n_embd", "k_dim")),
    "wv": ("blk.{i}.attn_v.weight", ("n_embd", "v_dim")),
}
FUSED_QKV: dict[str, TensorSpec] = {"wqkv": ("blk.{i}.attn_qkv.weight", ("n_embd", "qkv_dim"))}
FUSED_QKV_BIAS: dict[str, TensorSpec] = {"bqkv": ("blk.{i}.attn_qkv.bias", ("qkv_dim",))}

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    **SEPARATE_QKV,
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", ("n_embd",)),
    "w_gate": ("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    "w_up": ("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
}

#: Tensors of block {i} loaded only when the file has them (llama.cpp: TENSOR_NOT_REQUIRED). rope_freqs.weight
#: has no block number: one tensor serves every layer, as llama.cpp duplicates it into each.
ROPE_FREQS: TensorSpec = ("rope_freqs.weight", ("n_rot_pairs",))
QKV_BIASES: dict[str, TensorSpec] = {
    "bq": ("blk.{i}.attn_q.bias", ("q_dim",)),
    "bk": ("blk.{i}.attn_k.bias", ("k_dim",)),
    "bv": ("blk.{i}.attn_v.bias", ("v_dim",)),
}
OPTIONAL_TENSORS: dict[str, TensorSpec] = {
    "rope_freqs": ROPE_FREQS,
    **QKV_BIASES,
    "bo": ("blk.{i}.attn_output.bias", ("n_embd",)),
    "b_gate": ("blk.{i}.ffn_gate.bias", ("n_ff",)),
    "b_up": ("blk.{i}.ffn_up.bias", ("n_ff",)),
    "b_down": ("blk.{i}.ffn_down.bias", ("n_embd",)),
}

#: True: output.bias, when the file has it, is added to the logits (llama.cpp's llama loads none).
OUTPUT_BIAS = False

#: Tensors whose presence means a feature this module does not implement: name -> what it is (UnsupportedError).
UNSUPPORTED_TENSORS: dict[str, str] = {}

#: True: rope must turn the whole head (rope.dimension_count = head_dim), as llama.cpp requires for llama
#: ("invalid n_rot").
ROPE_WHOLE_HEAD = True


def fused_bias(t: dict[str, Any], names: list[str], matrices: list[str]) -> np.ndarray | None:
    """The biases `names` side by side, to add to the fused matmul of `matrices`: zeros for one the file lacks,
    None when it has none of them."""
    if all(t.get(n) is None for n in names):
        return None
    parts = [t[n] if t.get(n) is not None else np.zeros(t[m].n_out, dtype=np.float32)
             for n, m in zip(names, matrices, strict=True)]
    return np.concatenate(parts)


def fuse_qkv(t: dict[str, Any]) -> dict[str, Any]:
    """t's q, k and v as one matrix "wqkv" and one bias "bqkv" (None without biases), from either layout; the
    separate fields are taken out of t."""
    if "wqkv" in t:
        return {"wqkv": t.pop("wqkv"), "bqkv": t.pop("bqkv", None)}
    bqkv = fused_bias(t, ["bq", "bk", "bv"], ["wq", "wk", "wv"])
    for field in ("bq", "bk", "bv"):
        t.pop(field, None)
    return {"wqkv": Linear.fuse([t.pop("wq"), t.pop("wk"), t.pop("wv")]), "bqkv": bqkv}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """Fuse q/k/v and gate/up into one matrix each (one matmul instead of three (two) per block), their biases
    likewise; optional tensors the file lacks are None."""
    return {"attn_norm": t["attn_norm"], **fuse_qkv(t), "wo": t["wo"],
            "ffn_norm": t["ffn_norm"], "w_gate_up": Linear.fuse([t["w_gate"], t["w_up"]]),
            "w_down": t["w_down"], "bo": t.get("bo"), "b_gate_up": fused_bias(t, ["b_gate", "b_up"], ["w_gate", "w_up"]),
            "b_down": t.get("b_down"), "rope_freqs": t.get("rope_freqs")}


def embed_scale(hp: HParams) -> float | None:
    """llama feeds the embedding rows as they are."""
    return None


def split_heads(qkv: np.ndarray, hp: HParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fused projection [T, q_dim + k_dim + v_dim] as q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv]."""
    t = qkv.shape[0]
    q = qkv[:, :hp.q_dim].reshape(t, hp.n_head, hp.head_dim)
    k = qkv[:, hp.q_dim:hp.q_dim + hp.k_dim].reshape(t, hp.n_head_kv, hp.head_dim)
    v = qkv[:, hp.q_dim + hp.k_dim:].reshape(t, hp.n_head_kv, hp.head_dim_v)
    return q, k, v


def project(w: dict[str, Any], h: np.ndarray, hp: HParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of the normed stream h [T, d]: one fused matmul (plus the q/k/v biases, when any), split into heads."""
    qkv = w["wqkv"](h)
    if w.get("bqkv") is not None:
        qkv = qkv + w["bqkv"]
    return split_heads(qkv, hp)


Rope = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
Project = Callable[[dict[str, Any], np.ndarray, HParams], tuple[np.ndarray, np.ndarray, np.ndarray]]
Ffn = Callable[[dict[str, Any], np.ndarray, HParams], np.ndarray]


def dense_ffn(w: dict[str, Any], h: np.ndarray, hp: HParams) -> np.ndarray:
    """The feed-forward of the normed stream h [T, d]: SwiGLU over the fused gate/up matrix, biases when any."""
    return glu_ffn(h, w["w_gate_up"], w["w_down"], silu, w.get("b_gate_up"), w.get("b_down"))


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch, rope: Rope = rope_norm,
           qkv: Project = project, ffn: Ffn = dense_ffn, scale_q: bool = False,
           rotates: Callable[[int], bool] | None = None) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches.

    rope, qkv and ffn are what the llama-like architectures (qwen2, qwen3, phi3, qwen3moe) change: the rope
    pairing, how q, k, v come from the normed stream (biases, per-head norms) and the feed-forward (experts).
    scale_q: q is multiplied by 1/sqrt(head_dim) after rope, in float32, and the scores are not scaled (llama.cpp's
    ggml_scale of Qcur before build_attn with kq_scale 1): the same product, other bits. rotates(il): False for a
    layer whose q and k are not rotated at all (smollm3's every fourth); None: every layer rotates."""
    angles: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id of the layer's rope factors -> (cos, sin)
    scale = 1.0 / np.sqrt(hp.head_dim)
    q_scale = np.float32(1.0 / np.sqrt(np.float32(hp.head_dim))) if scale_q else None
    for il, w in enumerate(layers):
        factors = w.get("rope_freqs")
        if id(factors) not in angles:  # once: every layer shares the file's one rope_freqs (or None)
            angles[id(factors)] = rope_angles(batch.positions, hp.n_rot, hp.rope_base, factors)
        cos, sin = angles[id(factors)]
        q, k, v = qkv(w, rmsnorm(x, w["attn_norm"], hp.eps), hp)
        if rotates is None or rotates(il):
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        if q_scale is not None:
            q = q * q_scale
        out = w["wo"](batch.attend(il, q, k, v, 1.0 if q_scale is not None else scale))
        x = x + (out if w.get("bo") is None else out + w["bo"])
        x = x + ffn(w, rmsnorm(x, w["ffn_norm"], hp.eps), hp)
    return x


#: The architecture as Model.from_file and the C blocks read it.
SPEC = register(ArchSpec("llama", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, UNSUPPORTED_TENSORS,
                         rope_whole_head=ROPE_WHOLE_HEAD, output_bias=OUTPUT_BIAS, embed_scale=embed_scale,
                         native=Native()))
