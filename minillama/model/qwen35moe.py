"""qwen35moe (Qwen3.5 / Qwen3.6 mixture of experts, e.g. Qwen3.5-35B-A3B): qwen35's hybrid blocks with an experts'
feed-forward and a gated shared expert.

As llama.cpp's src/models/qwen35moe.cpp computes it: the mixers are qwen35's (deltanet.py); every block's
feed-forward is build_moe_ffn with softmax gating over expert_count experts, the expert_used_count best per token,
their weights renormalised to sum to 1 (moe.py), plus a shared SwiGLU expert (expert_shared_feed_forward_length
wide, else feed_forward_length) whose output is scaled by sigmoid(h . ffn_gate_inp_shexp), one gate per token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import deltanet, qwen35
from .batch import Batch
from .layers import Linear, glu_ffn, silu
from .moe import moe_ffn
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec

F32 = np.float32

FFN: dict[str, TensorSpec] = {
    "router": ("blk.{i}.ffn_gate_inp.weight", ("n_embd", "n_expert")),
    "gate_exps": ("blk.{i}.ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    "up_exps": ("blk.{i}.ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    "down_exps": ("blk.{i}.ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert")),
    "shexp_gate_inp": ("blk.{i}.ffn_gate_inp_shexp.weight", ("n_embd",)),
    "shexp_gate": ("blk.{i}.ffn_gate_shexp.weight", ("n_embd", "n_ff_shared")),
    "shexp_up": ("blk.{i}.ffn_up_shexp.weight", ("n_embd", "n_ff_shared")),
    "shexp_down": ("blk.{i}.ffn_down_shexp.weight", ("n_ff_shared", "n_embd")),
}

LAYER_TENSORS: dict[str, TensorSpec] = {**deltanet.COMMON, **deltanet.DELTANET, **deltanet.ATTENTION, **FFN}


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """The mixer's matrices (deltanet.prepare), the shared expert's gate/up fused into one matrix, its gate vector
    a one-row float32 matrix (multiplied in ggml's float32 order on the native backend)."""
    t = deltanet.prepare(t)
    t["shexp_gate_up"] = Linear.fuse([t.pop("shexp_gate"), t.pop("shexp_up")])
    t["shexp_gate_inp"] = Linear(np.asarray(t["shexp_gate_inp"], F32).reshape(1, -1))  # a float32 matrix of 1 row
    return t


def ffn(w: dict[str, Any], h: np.ndarray, hp: HParams) -> np.ndarray:
    """The routed experts' sum plus the shared expert times its sigmoid gate, of the normed stream h [T, d]."""
    routed = moe_ffn(h, w["router"], w["gate_exps"], w["up_exps"], w["down_exps"], hp.n_expert_used, norm=True)
    shared = glu_ffn(h, w["shexp_gate_up"], w["shexp_down"], silu)
    with np.errstate(over="ignore"):  # a very negative gate: sigmoid 0
        gate = deltanet.sigmoid(w["shexp_gate_inp"](h))
    return routed + shared * gate


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], extending each sequence's cache and recurrent state."""
    return deltanet.blocks(x, layers, hp, batch, ffn)


SPEC = register(ArchSpec("qwen35moe", LAYER_TENSORS, prepare, blocks, refused_keys=qwen35.REFUSED_KEYS,
                         rope_whole_head=False, experts=True, block_tensors=deltanet.block_tensors(FFN),
                         new_cache=deltanet.new_cache))
