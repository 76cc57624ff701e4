"""smollm3 (SmolLM3): llama's blocks, but every fourth layer attends without rope.

As llama.cpp's src/models/smollm3.cpp computes it: llama's tensors (q, k, v with optional biases, or one attn_qkv;
no biases on the output or the feed-forward), rms norms, "NORM" rope (the converter permutes the q/k rows as for
llama), SwiGLU, scores scaled by 1/sqrt(head_dim). Layer il rotates q and k only when (il + 1) % 4 != 0: llama.cpp
fixes the step at 4 (n_no_rope_layer_step) and reads no key for it, so layers 3, 7, 11, ... see the keys without
positions. Rope scaling (rope.scaling.factor other than 1) is not implemented and refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import llama
from .batch import Batch
from .layers import rope_norm
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec

#: llama.cpp's n_no_rope_layer_step for smollm3: layer il has no rope when (il + 1) % NO_ROPE_STEP == 0.
NO_ROPE_STEP = 4

#: Tensors of block {i} loaded when the file has them: the q/k/v biases (llama.cpp's create_tensor_qkv), no
#: rope_freqs (smollm3 passes no rope factors).
OPTIONAL_TENSORS: dict[str, TensorSpec] = dict(llama.QKV_BIASES)


def rotates(il: int) -> bool:
    """True for a layer whose q and k are rotated (all but every NO_ROPE_STEP-th)."""
    return (il + 1) % NO_ROPE_STEP != 0


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    return llama.blocks(x, layers, hp, batch, rope_norm, rotates=rotates)


SPEC = register(ArchSpec("smollm3", llama.LAYER_TENSORS, llama.prepare, blocks, OPTIONAL_TENSORS,
                         refused_keys={"rope.scaling.factor": ((0.0, 1.0), "rope scaling")}))
