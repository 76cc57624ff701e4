"""qwen3moe (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): qwen3's attention with a mixture-of-experts feed-forward.

As llama.cpp's src/models/qwen3moe.cpp computes it: the attention is qwen3's (q and k RMS-normed per head, "NEOX"
rope, heads of attention.key_length), and the feed-forward of every block is build_moe_ffn with softmax gating
over expert_count experts, the expert_used_count best of them per token, their weights renormalised to sum to 1,
SwiGLU experts of expert_feed_forward_length (moe.py). There is no shared expert and no dense block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import llama, qwen3
from .batch import Batch
from .layers import rope_neox
from .moe import moe_ffn
from .spec import ArchSpec, Native, register
from .weights import HParams, TensorSpec

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first); the experts' tensors are
#: 3-D, one matrix per expert (ne2 = expert_count).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    **llama.SEPARATE_QKV,
    "q_norm": ("blk.{i}.attn_q_norm.weight", ("head_dim",)),
    "k_norm": ("blk.{i}.attn_k_norm.weight", ("head_dim",)),
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", ("n_embd",)),
    "router": ("blk.{i}.ffn_gate_inp.weight", ("n_embd", "n_expert")),
    "gate_exps": ("blk.{i}.ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    "up_exps": ("blk.{i}.ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    "down_exps": ("blk.{i}.ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert")),
}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """q, k, v fused into one matrix (as llama's); the router and the experts as they are."""
    return {"attn_norm": t["attn_norm"], **llama.fuse_qkv(t), "q_norm": t["q_norm"], "k_norm": t["k_norm"],
            "wo": t["wo"], "ffn_norm": t["ffn_norm"], "router": t["router"], "gate_exps": t["gate_exps"],
            "up_exps": t["up_exps"], "down_exps": t["down_exps"]}


def ffn(w: dict[str, Any], h: np.ndarray, hp: HParams) -> np.ndarray:
    """The experts' feed-forward of the normed stream h [T, d]: softmax gating, top n_expert_used, renormalised."""
    return moe_ffn(h, w["router"], w["gate_exps"], w["up_exps"], w["down_exps"], hp.n_expert_used, norm=True)


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the tokens at positions start..start+T-1, extending the cache."""
    return llama.blocks(x, layers, hp, batch, rope_neox, qwen3.project, ffn)


SPEC = register(ArchSpec("qwen3moe", LAYER_TENSORS, prepare, blocks, experts=True, native=Native(rope_neox=True)))
