"""qwen35 (Qwen3.5 / Qwen3.6 dense): gated DeltaNet layers beside gated full-attention layers, SwiGLU feed-forward.

As llama.cpp's src/models/qwen35.cpp computes it (the blocks: deltanet.py). Every block's feed-forward is a dense
SwiGLU (ffn_gate, ffn_up, ffn_down) after post_attention_norm. A session keeps each sequence's recurrent state
beside its keys and values (deltanet.HybridCache). Not implemented, and refused: an explicit list of recurrent
layers (attention.recurrent_layers) and multi-token-prediction blocks (nextn_predict_layers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import deltanet, llama
from .batch import Batch
from .layers import Linear
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec

FFN: dict[str, TensorSpec] = {
    "w_gate": ("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    "w_up": ("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    "w_down": ("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
}

#: Every field a block may have (a block has the DeltaNet or the attention ones: deltanet.block_tensors).
LAYER_TENSORS: dict[str, TensorSpec] = {**deltanet.COMMON, **deltanet.DELTANET, **deltanet.ATTENTION, **FFN}

#: Keys whose values mean features minillama does not implement for the hybrid architectures.
REFUSED_KEYS: dict[str, tuple[tuple[object, ...], str]] = {
    "attention.recurrent_layers": ((), "an explicit list of the DeltaNet layers"),
    "nextn_predict_layers": ((0,), "multi-token-prediction blocks"),
}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """The mixer's matrices (deltanet.prepare) and gate/up fused into one matrix."""
    t = deltanet.prepare(t)
    t["w_gate_up"] = Linear.fuse([t.pop("w_gate"), t.pop("w_up")])
    return t


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], extending each sequence's cache and recurrent state."""
    return deltanet.blocks(x, layers, hp, batch, llama.dense_ffn)


SPEC = register(ArchSpec("qwen35", LAYER_TENSORS, prepare, blocks, refused_keys=REFUSED_KEYS,
                         rope_whole_head=False, block_tensors=deltanet.block_tensors(FFN),
                         new_cache=deltanet.new_cache))
