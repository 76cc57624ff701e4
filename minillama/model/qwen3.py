"""qwen3 (Qwen3 dense): the llama block with q and k RMS-normed per head before "NEOX" rope, no biases.

Differences from llama.py, as llama.cpp's src/models/qwen3.cpp computes them: after the q and k projections
each head is RMS-normed with its own weight of head_dim values (blk.N.attn_q_norm / attn_k_norm, the same
weight for every head), then rope pairs dims i and i + n_rot/2 (LLAMA_ROPE_TYPE_NEOX). The heads may be
wider than n_embd / n_head (attention.key_length, 128 in Qwen3-0.6B whose n_embd is 1024 with 16 heads).
q/k/v biases, which Qwen3 does not have but llama.cpp loads when a file does, are added as llama's are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import llama
from .batch import Batch
from .layers import rmsnorm, rope_neox
from .spec import ArchSpec, Native, register
from .weights import HParams, TensorSpec

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    **llama.LAYER_TENSORS,
    "q_norm": ("blk.{i}.attn_q_norm.weight", ("head_dim",)),
    "k_norm": ("blk.{i}.attn_k_norm.weight", ("head_dim",)),
}

#: Tensors of block {i} loaded only when the file has them: q/k/v biases (llama.cpp's create_tensor_qkv takes
#: them for qwen3 too); no rope_freqs (llama.cpp's qwen3 passes no rope factors).
OPTIONAL_TENSORS: dict[str, TensorSpec] = dict(llama.QKV_BIASES)

#: True: output.bias, when the file has it, is added to the logits (llama.cpp's qwen3 loads none).
OUTPUT_BIAS = False

#: Tensors whose presence means a feature this module does not implement: name -> what it is (UnsupportedError).
UNSUPPORTED_TENSORS: dict[str, str] = {}

#: True: rope must turn the whole head (rope.dimension_count = head_dim), as llama.cpp asserts for this arch.
ROPE_WHOLE_HEAD = True

embed_scale = llama.embed_scale


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """llama's fused matrices (and q/k/v biases, when any), plus the two per-head norm weights."""
    return {**llama.prepare(t), "q_norm": t["q_norm"], "k_norm": t["k_norm"]}


def project(w: dict[str, Any], h: np.ndarray, hp: HParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of the normed stream, split into heads, q and k each RMS-normed per head."""
    q, k, v = llama.project(w, h, hp)
    return rmsnorm(q, w["q_norm"], hp.eps), rmsnorm(k, w["k_norm"], hp.eps), v


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the tokens at positions start..start+T-1, extending the cache."""
    return llama.blocks(x, layers, hp, batch, rope_neox, project)


SPEC = register(ArchSpec("qwen3", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, UNSUPPORTED_TENSORS,
                         rope_whole_head=ROPE_WHOLE_HEAD, output_bias=OUTPUT_BIAS, embed_scale=embed_scale,
                         native=Native(rope_neox=True)))
