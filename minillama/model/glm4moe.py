"""glm4moe (GLM-4.5, GLM-4.5-Air): partial rope, optional q/k norms, leading dense blocks, sigmoid-gated experts with
a shared expert.

As llama.cpp's src/models/glm4-moe.cpp computes it: h = RMSNorm(x, attn_norm); q, k, v from h with their biases
(the file's, optional); q and k RMS-normed per head when the block has attn_q_norm / attn_k_norm (the 355B model
does, Air does not; either may be absent in any block); "NEOX" rope over the first rope.dimension_count dims of each
head (half of it in GLM-4.5), the rest left as is; x += attn_output(softmax(q k^T / sqrt(head_dim)) v); then h =
RMSNorm(x, post_attention_norm), the pre-feed-forward norm. The first leading_dense_block_count blocks have a dense
SwiGLU; the others route each token to expert_used_count of expert_count experts (moe.route: sigmoid gating unless
expert_gating_func says softmax, exp_probs_b added for the choice only, the weights renormalised with
expert_weights_norm and multiplied by expert_weights_scale) and add expert_shared_count shared experts, one SwiGLU of
expert_feed_forward_length * expert_shared_count. x += that.

block_count counts the next-token-prediction (MTP) blocks the converter appends (nextn_predict_layers of them, each a
block with blk.N.nextn.* tensors besides): llama.cpp's text graph skips them, and so does this module (their tensors
are read as belonging to the file, not run). Not implemented, and refused: multi-section rope (rope.dimension_sections,
the vision model) and rope scaling.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import FormatError, UnsupportedError
from .batch import Batch
from .deepseek2 import fuse_gate_up, lead_or_expert_tensors
from .layers import glu_ffn, rmsnorm, rope_angles, rope_neox, silu
from .llama import QKV_BIASES, SEPARATE_QKV, fuse_qkv, split_heads
from .moe import moe_ffn
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec, Weights

#: llama.cpp's expert_gating_func values -> route()'s gating (0: none given, glm4moe's default is sigmoid).
GATING = {0: "sigmoid", 1: "softmax", 2: "sigmoid"}

_BLOCK = re.compile(r"blk\.(\d+)\.")


def read_hparams(w: Weights, name: str) -> HParams:
    """The generic hyper-parameters with n_layer the blocks the text graph runs: block_count less
    nextn_predict_layers (0..block_count - 1); expert_count and expert_shared_count required, as llama.cpp's loader."""
    hp = w.hparams(name)
    md = w.gguf.metadata
    key = f"{name}.nextn_predict_layers"
    nextn = md.get(key, 0)
    if isinstance(nextn, bool) or not isinstance(nextn, int) or not 0 <= nextn < hp.n_layer:
        raise FormatError(f"{key} is {nextn!r}, expected an integer 0..{hp.n_layer - 1} (block_count less at least "
                          "one block the text graph runs)", path=w.path, key=key)
    for needed in ("expert_count", "expert_shared_count"):
        if md.get(f"{name}.{needed}") is None:
            raise FormatError(f"expected metadata key '{name}.{needed}' (needed to run glm4moe), not found",
                              path=w.path, key=f"{name}.{needed}")
    if any(hp.rope_sections):
        key = f"{name}.rope.dimension_sections"
        raise UnsupportedError(f"{w.path}: {key} is {list(hp.rope_sections)}: multi-section rope (the vision model), "
                               "which minillama does not implement for glm4moe; expected a file without it")
    if hp.n_layer_dense_lead < hp.n_layer - nextn and hp.n_expert_used == 0:
        key = f"{name}.expert_used_count"
        raise FormatError(f"{key} is missing or 0, expected at least 1 (llama.cpp asserts it)", path=w.path, key=key)
    return dataclasses.replace(hp, n_layer=hp.n_layer - nextn)


def extras(w: Weights, hp: HParams) -> tuple[dict[str, Any], set[str]]:
    """No fields for the blocks; the next-token-prediction blocks' tensors (blk.N, N >= n_layer), which are part of
    the file but not run."""
    skipped = {t for t in w.tensors if (m := _BLOCK.match(t)) and int(m.group(1)) >= hp.n_layer}
    return {}, skipped


def block_tensors(hp: HParams, il: int) -> tuple[Mapping[str, TensorSpec], Mapping[str, TensorSpec]]:
    """Block il's (required, optional) tensors, as llama.cpp's loader takes them: q/k/v (biases and per-head norms
    optional), attn_output, post_attention_norm, then a dense SwiGLU (leading blocks) or the router, its bias, the
    experts and the shared expert."""
    t: dict[str, TensorSpec] = {"attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)), **SEPARATE_QKV,
                                "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
                                "post_attn_norm": ("blk.{i}.post_attention_norm.weight", ("n_embd",))}
    optional: dict[str, TensorSpec] = {**QKV_BIASES, "q_norm": ("blk.{i}.attn_q_norm.weight", ("head_dim",)),
                                       "k_norm": ("blk.{i}.attn_k_norm.weight", ("head_dim",))}
    req, _ = lead_or_expert_tensors(hp, il, bias_required=True)
    return {**t, **req}, optional


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """q/k/v fused (their biases likewise), gate/up fused (dense and shared); the rest as it is."""
    out = dict(t)
    out.update(fuse_qkv(out))
    return fuse_gate_up(out)


def ffn(w: dict[str, Any], h: np.ndarray, hp: HParams) -> np.ndarray:
    """A leading block's SwiGLU, or the routed experts plus the shared one (added in llama.cpp's order)."""
    if "w_gate_up" in w:
        return glu_ffn(h, w["w_gate_up"], w["w_down"], silu)
    out = moe_ffn(h, w["router"], w["gate_exps"], w["up_exps"], w["down_exps"], hp.n_expert_used,
                  norm=hp.expert_weights_norm, gating=GATING[hp.expert_gating], bias=w["exp_probs_b"],
                  scale=hp.expert_weights_scale)
    return out + glu_ffn(h, w["shexp_gate_up"], w["down_shexp"], silu) if "shexp_gate_up" in w else out


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    cos, sin = rope_angles(batch.positions, hp.n_rot, hp.rope_base)
    scale = 1.0 / np.sqrt(hp.head_dim)
    for il, w in enumerate(layers):
        qkv = w["wqkv"](rmsnorm(x, w["attn_norm"], hp.eps))
        if w.get("bqkv") is not None:
            qkv = qkv + w["bqkv"]
        q, k, v = split_heads(qkv, hp)
        if w.get("q_norm") is not None:
            q = rmsnorm(q, w["q_norm"], hp.eps)
        if w.get("k_norm") is not None:
            k = rmsnorm(k, w["k_norm"], hp.eps)
        x = w["wo"](batch.attend(il, rope_neox(q, cos, sin), rope_neox(k, cos, sin), v, scale)) + x
        x = ffn(w, rmsnorm(x, w["post_attn_norm"], hp.eps), hp) + x
    return x


#: Metadata whose non-neutral values mean a feature not implemented here.
REFUSED_KEYS = {
    "rope.scaling.factor": ((0.0, 1.0), "rope scaling"),
    "expert_gating_func": ((0, 1, 2), "an expert gating function other than softmax and sigmoid"),
    "expert_group_count": ((0, 1), "expert groups"),
}

SPEC = register(ArchSpec("glm4moe", {}, prepare, blocks, refused_keys=REFUSED_KEYS, rope_whole_head=False,
                         experts=True, read_hparams=read_hparams, extras=extras, block_tensors=block_tensors))
