"""qwen2 (Qwen2, Qwen2.5): the llama block with biases on the q, k and v projections and "NEOX" rope.

Differences from llama.py, as llama.cpp's src/models/qwen2.cpp computes them: q, k and v each add a bias
(blk.N.attn_{q,k,v}.bias) after their matmul, and rope pairs dims i and i + n_rot/2 (llama.cpp's
LLAMA_ROPE_TYPE_NEOX; the converter does not permute Qwen's q/k rows as it does Llama's). The output matrix
is usually tied to the embedding (small Qwen2 models have no output.weight); an output.bias, which llama.cpp
loads when a file has one, is added to the logits.
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
LAYER_TENSORS: dict[str, TensorSpec] = dict(llama.LAYER_TENSORS)

#: Tensors of block {i} loaded only when the file has them: the q/k/v biases (every Qwen2 file has them, but
#: llama.cpp loads one without them too); no rope_freqs (llama.cpp's qwen2 passes no rope factors).
OPTIONAL_TENSORS: dict[str, TensorSpec] = dict(llama.QKV_BIASES)

#: True: output.bias, when the file has it, is added to the logits, as llama.cpp's qwen2 does.
OUTPUT_BIAS = True

#: Tensors whose presence means a feature this module does not implement: name -> what it is (UnsupportedError).
UNSUPPORTED_TENSORS: dict[str, str] = {}

#: True: rope must turn the whole head (rope.dimension_count = head_dim), as llama.cpp asserts for this arch.
ROPE_WHOLE_HEAD = True

embed_scale = llama.embed_scale


prepare = llama.prepare  # the fused q/k/v bias and its add are llama's optional-bias code


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the tokens at positions start..start+T-1, extending the cache."""
    return llama.blocks(x, layers, hp, batch, rope_neox)


SPEC = register(ArchSpec("qwen2", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, UNSUPPORTED_TENSORS,
                         rope_whole_head=ROPE_WHOLE_HEAD, output_bias=OUTPUT_BIAS, embed_scale=embed_scale,
                         native=Native(rope_neox=True)))
