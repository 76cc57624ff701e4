"""phi3 (Phi-3 and its kin): the llama block with q/k/v in one matrix, gate and up in one, "NEOX" rope.

Differences from llama.py, as llama.cpp's src/models/phi3.cpp computes them: blk.N.attn_qkv holds the q, k
and v rows one after the other (split as llama.split_heads does; blk.N.attn_qkv.bias is added when the file
has one), blk.N.ffn_up holds the gate rows and then the up rows (2 * n_ff outputs, SwiGLU: silu of the first
half times the second), and rope pairs dims i and i + n_rot/2 (LLAMA_ROPE_TYPE_NEOX). llama.cpp scales q by
1/sqrt(head_dim) after rope and leaves the scores unscaled (the same product as scaling the scores, other bits). Phi-3 files carry attention.sliding_window, but llama.cpp disables sliding-window attention
for phi3, so every layer here sees the whole context too. rope may turn only the first n_rot dims of each
head (Phi-4-mini turns 3/4). The long-context variants (Phi-3-*-128k, Phi-3.5, Phi-4-mini) rotate with
per-dimension factors (rope_factors_long/short) chosen by the context length: not implemented, such a file
is refused with UnsupportedError rather than run with the wrong rotation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import llama
from .batch import Batch
from .layers import rope_neox
from .spec import ArchSpec, Native, register
from .weights import HParams, TensorSpec

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    **llama.FUSED_QKV,
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", ("n_embd",)),
    "w_gate_up": ("blk.{i}.ffn_up.weight", ("n_embd", "gate_up_dim")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
}

#: Tensors of block {i} loaded only when the file has them: the fused q/k/v bias (llama.cpp loads it for phi3).
OPTIONAL_TENSORS: dict[str, TensorSpec] = dict(llama.FUSED_QKV_BIAS)

#: True: output.bias, when the file has it, is added to the logits (llama.cpp's phi3 loads none).
OUTPUT_BIAS = False

#: Tensors whose presence means a feature this module does not implement: name -> what it is (UnsupportedError).
UNSUPPORTED_TENSORS: dict[str, str] = {
    "rope_factors_long.weight": "long-context rope factors (LongRoPE, Phi-3-*-128k / Phi-3.5)",
    "rope_factors_short.weight": "long-context rope factors (LongRoPE, Phi-3-*-128k / Phi-3.5)",
}

#: True: rope must turn the whole head (rope.dimension_count = head_dim); here it may turn fewer dims.
ROPE_WHOLE_HEAD = False

embed_scale = llama.embed_scale


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """The file's matrices are usually fused as the forward pass wants them; q, k and v given apart are stacked."""
    fused = llama.fuse_qkv(t)  # first: it takes the separate matrices out of t
    return {**t, **fused}


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the tokens at positions start..start+T-1, extending the cache."""
    return llama.blocks(x, layers, hp, batch, rope_neox, scale_q=True)


SPEC = register(ArchSpec("phi3", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, UNSUPPORTED_TENSORS,
                         rope_whole_head=ROPE_WHOLE_HEAD, output_bias=OUTPUT_BIAS, embed_scale=embed_scale,
                         native=Native(rope_neox=True, scale_q=True)))
