"""gemma3 (Gemma 3): the llama block with more norms, GeGLU, and sliding-window attention on most layers.

Differences from llama.py: the embedding rows are scaled by sqrt(d); q and k are RMS-normed per head before
rope, which pairs dims i and i + D/2 ("NEOX"); q is scaled by 1/sqrt(D) (query_pre_attn_scalar = D); the
attention output and the feed-forward output are each RMS-normed again before they join the residual stream;
the feed-forward is GeGLU (tanh GELU). Five of every six layers attend only to the last `sliding_window`
positions and use rope base 10000; every sixth layer sees the whole context with the file's rope base, as
llama.cpp sets up (swa pattern 6, rope_freq_base_train_swa 10000). Norm weights in the GGUF already include
Gemma's "+1" (the converter adds it), so RMSNorm is the same function as llama's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import Batch
from .layers import Linear, gelu, glu_ffn, rmsnorm, rope_angles, rope_neox
from .llama import SEPARATE_QKV, fuse_qkv, split_heads
from .spec import ArchSpec, Native, register
from .weights import HParams, TensorSpec

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    **SEPARATE_QKV,
    "q_norm": ("blk.{i}.attn_q_norm.weight", ("head_dim",)),
    "k_norm": ("blk.{i}.attn_k_norm.weight", ("head_dim",)),
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "post_attn_norm": ("blk.{i}.post_attention_norm.weight", ("n_embd",)),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", ("n_embd",)),
    "w_gate": ("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    "w_up": ("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
    "post_ffn_norm": ("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
}

#: Tensors of block {i} loaded only when the file has them: none.
OPTIONAL_TENSORS: dict[str, TensorSpec] = {}

#: True: output.bias, when the file has it, is added to the logits (not for gemma3).
OUTPUT_BIAS = False

#: Tensors whose presence means a feature this module does not implement: name -> what it is (UnsupportedError).
UNSUPPORTED_TENSORS: dict[str, str] = {}

#: True: rope must turn the whole head (rope.dimension_count = head_dim); here it may turn fewer dims.
ROPE_WHOLE_HEAD = False

SWA_PATTERN = 6  # layers il with il % 6 < 5 use the sliding window
ROPE_BASE_SWA = 10000.0


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """Fuse q/k/v and gate/up into one matrix each."""
    fused = {"wqkv": fuse_qkv(t)["wqkv"], "w_gate_up": Linear.fuse([t.pop("w_gate"), t.pop("w_up")])}
    return {**t, **fused}


def embed_scale(hp: HParams) -> float:
    """Gemma multiplies the embedding rows by sqrt(d) (in float32, as ggml_scale(sqrtf(n_embd)))."""
    return float(np.sqrt(np.float32(hp.n_embd)))


def is_swa(hp: HParams, il: int) -> bool:
    """True for the layers that attend within the sliding window."""
    return hp.sliding_window > 0 and il % SWA_PATTERN < SWA_PATTERN - 1


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    pos = batch.positions
    angles = {False: rope_angles(pos, hp.n_rot, hp.rope_base), True: rope_angles(pos, hp.n_rot, ROPE_BASE_SWA)}
    q_scale = np.float32(1.0 / np.sqrt(np.float32(hp.head_dim)))
    for il, w in enumerate(layers):
        swa = is_swa(hp, il)
        cos, sin = angles[swa]
        q, k, v = split_heads(w["wqkv"](rmsnorm(x, w["attn_norm"], hp.eps)), hp)
        q = rope_neox(rmsnorm(q, w["q_norm"], hp.eps), cos, sin) * q_scale
        k = rope_neox(rmsnorm(k, w["k_norm"], hp.eps), cos, sin)
        a = batch.attend(il, q, k, v, 1.0, hp.sliding_window if swa else 0)
        x = x + rmsnorm(w["wo"](a), w["post_attn_norm"], hp.eps)
        f = glu_ffn(rmsnorm(x, w["ffn_norm"], hp.eps), w["w_gate_up"], w["w_down"], gelu)
        x = x + rmsnorm(f, w["post_ffn_norm"], hp.eps)
    return x


def layer_attention(hp: HParams, il: int) -> tuple[float, int]:
    """Layer il's (rope base, sliding window): ROPE_BASE_SWA and the window on the sliding-window layers."""
    return (ROPE_BASE_SWA, hp.sliding_window) if is_swa(hp, il) else (hp.rope_base, 0)


SPEC = register(ArchSpec("gemma3", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, UNSUPPORTED_TENSORS,
                         rope_whole_head=ROPE_WHOLE_HEAD, output_bias=OUTPUT_BIAS, embed_scale=embed_scale,
                         native=Native(rope_neox=True, geglu=True, scale_q=True, layer=layer_attention)))
