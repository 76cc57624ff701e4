"""olmo2 (OLMo 2): llama's attention and SwiGLU without pre-norms, each sublayer's output RMS-normed instead.

As llama.cpp's src/models/olmo2.cpp computes it: the stream x goes into the q/k/v projections as it is (no norm
before attention or the feed-forward); q and k are each RMS-normed over the whole projection (attn_q_norm of
n_embd values, attn_k_norm of n_head_kv * head_dim: one norm across all heads, not per head), then rotated
("NEOX" rope, whole heads); the attention output goes through attn_output and is RMS-normed by
post_attention_norm before it joins the stream; the feed-forward's output is RMS-normed by post_ffw_norm before it
joins. q/k/v biases, which llama.cpp's loader takes when a file has them, are added before the norms. OLMo 3's
sliding-window layers (attention.sliding_window) and rope scaling are not implemented: such files are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import llama
from .batch import Batch
from .layers import Linear, rmsnorm, rope_angles, rope_neox
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first), as llama.cpp's loader
#: takes them (output, not tied, is required: no output falls back to the embedding).
LAYER_TENSORS: dict[str, TensorSpec] = {
    **llama.SEPARATE_QKV,
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "q_norm": ("blk.{i}.attn_q_norm.weight", ("q_dim",)),
    "k_norm": ("blk.{i}.attn_k_norm.weight", ("k_dim",)),
    "post_attn_norm": ("blk.{i}.post_attention_norm.weight", ("n_embd",)),
    "w_gate": ("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    "w_up": ("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
    "post_ffn_norm": ("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
}

#: Tensors of block {i} loaded when the file has them: the q/k/v biases (llama.cpp's create_tensor_qkv).
OPTIONAL_TENSORS: dict[str, TensorSpec] = dict(llama.QKV_BIASES)

#: Metadata whose non-neutral values mean a feature not implemented here.
REFUSED_KEYS = {
    "attention.sliding_window": ((0,), "sliding-window attention layers (OLMo 3)"),
    "rope.scaling.factor": ((0.0, 1.0), "rope scaling"),
}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """q/k/v and gate/up fused into one matrix each (their biases likewise); the norms as they are."""
    fused = llama.fuse_qkv(t)  # first: it takes the separate matrices out of t
    return {**fused, "wo": t["wo"], "q_norm": t["q_norm"], "k_norm": t["k_norm"],
            "post_attn_norm": t["post_attn_norm"], "post_ffn_norm": t["post_ffn_norm"],
            "w_gate_up": Linear.fuse([t["w_gate"], t["w_up"]]), "w_down": t["w_down"]}


def project(w: dict[str, Any], h: np.ndarray, hp: HParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of the stream h [T, d]: the fused projection (plus biases), q and k RMS-normed over all their heads
    at once, then split into heads."""
    qkv = w["wqkv"](h)
    if w.get("bqkv") is not None:
        qkv = qkv + w["bqkv"]
    q = rmsnorm(qkv[:, :hp.q_dim], w["q_norm"], hp.eps)
    k = rmsnorm(qkv[:, hp.q_dim:hp.q_dim + hp.k_dim], w["k_norm"], hp.eps)
    return llama.split_heads(np.concatenate([q, k, qkv[:, hp.q_dim + hp.k_dim:]], axis=1), hp)


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    cos, sin = rope_angles(batch.positions, hp.n_rot, hp.rope_base)
    scale = 1.0 / np.sqrt(hp.head_dim)
    for il, w in enumerate(layers):
        q, k, v = project(w, x, hp)
        a = batch.attend(il, rope_neox(q, cos, sin), rope_neox(k, cos, sin), v, scale)
        x = rmsnorm(w["wo"](a), w["post_attn_norm"], hp.eps) + x
        f = llama.dense_ffn(w, x, hp)
        x = rmsnorm(f, w["post_ffn_norm"], hp.eps) + x
    return x


SPEC = register(ArchSpec("olmo2", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, refused_keys=REFUSED_KEYS))
