"""llama (SmolLM2, Llama 2/3, ...): pre-norm transformer blocks with rope'd grouped-query attention and SwiGLU.

Each block: h = RMSNorm(x); q, k, v = h Wq, h Wk, h Wv; rotate q and k by their positions (rope, adjacent
pairs: llama.cpp's converter permuted the q/k rows so that this "NORM" rope matches the original model);
x += softmax(q k^T / sqrt(D), causal) v Wo; then x += W_down(silu(W_gate h) * W_up h) with h = RMSNorm(x).
The token embedding starts the stream; a final RMSNorm and the output matrix (or the embedding, when tied)
give the logits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import Batch
from .layers import Linear, glu_ffn, rmsnorm, rope_angles, rope_norm, silu
from .weights import HParams, TensorSpec

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    "wq": ("blk.{i}.attn_q.weight", ("n_embd", "q_dim")),
    "wk": ("blk.{i}.attn_k.weight", ("n_embd", "k_dim")),
    "wv": ("blk.{i}.attn_v.weight", ("n_embd", "v_dim")),
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", ("n_embd",)),
    "w_gate": ("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    "w_up": ("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """Fuse q/k/v and gate/up into one matrix each: one matmul instead of three (two) per block."""
    return {"attn_norm": t["attn_norm"], "wqkv": Linear.stack([t["wq"], t["wk"], t["wv"]]), "wo": t["wo"],
            "ffn_norm": t["ffn_norm"], "w_gate_up": Linear.stack([t["w_gate"], t["w_up"]]),
            "w_down": t["w_down"]}


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


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    cos, sin = rope_angles(batch.positions, hp.n_rot, hp.rope_base)
    scale = 1.0 / np.sqrt(hp.head_dim)
    for il, w in enumerate(layers):
        q, k, v = split_heads(w["wqkv"](rmsnorm(x, w["attn_norm"], hp.eps)), hp)
        q, k = rope_norm(q, cos, sin), rope_norm(k, cos, sin)
        x = x + w["wo"](batch.attend(il, q, k, v, scale))
        x = x + glu_ffn(rmsnorm(x, w["ffn_norm"], hp.eps), w["w_gate_up"], w["w_down"], silu)
    return x

