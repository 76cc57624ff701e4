"""gpt-oss (OpenAI's gpt-oss-20b and -120b; llama.cpp's LLM_ARCH_OPENAI_MOE, src/models/openai-moe.cpp).

Each block: h = RMSNorm(x); q, k, v = h Wq + bq, h Wk + bk, h Wv + bv; q and k rotated by YaRN rope ("NEOX"
pairs, rope.scaling.* keys: every layer with the file's base and scale); attention with a learned sink logit per
head (attn_sinks: one more entry of each row's softmax, with no value), over the last `sliding_window` positions
on the even layers and the whole context on the odd ones (llama.cpp's swa pattern 2); x += attn Wo + bo; then
h = RMSNorm(x) (post_attention_norm) and x += the mixture of experts: router logits plus their bias, the
expert_used_count largest taken and their weights the softmax of those logits alone (SOFTMAX_WEIGHT gating),
each expert's gate and up products plus their biases through the clamped SwiGLU (swiglu_oai: alpha 1.702, limit
7), its down product plus its bias. The experts are MXFP4 in the published files.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import llama
from .batch import Batch
from .layers import Linear, QuantLinear, rmsnorm, rope_neox, rope_scaling_params, yarn_angles
from .moe import moe_ffn, swiglu_oai
from .spec import ArchSpec, Native, register
from .weights import HParams, TensorSpec

F32 = np.float32

#: Tensors of block {i}: field -> (GGUF name, ggml shape as HParams fields, ne0 first).
LAYER_TENSORS: dict[str, TensorSpec] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", ("n_embd",)),
    **llama.SEPARATE_QKV,
    "wo": ("blk.{i}.attn_output.weight", ("o_dim", "n_embd")),
    "bo": ("blk.{i}.attn_output.bias", ("n_embd",)),
    "sinks": ("blk.{i}.attn_sinks.weight", ("n_head",)),
    # the norm before the feed-forward (llama.cpp's attn_post_norm): model.c's ffn_norm
    "ffn_norm": ("blk.{i}.post_attention_norm.weight", ("n_embd",)),
    "router": ("blk.{i}.ffn_gate_inp.weight", ("n_embd", "n_expert")),
    "router_bias": ("blk.{i}.ffn_gate_inp.bias", ("n_expert",)),
    "gate_exps": ("blk.{i}.ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    "gate_exps_bias": ("blk.{i}.ffn_gate_exps.bias", ("n_ff_exp", "n_expert")),
    "up_exps": ("blk.{i}.ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    "up_exps_bias": ("blk.{i}.ffn_up_exps.bias", ("n_ff_exp", "n_expert")),
    "down_exps": ("blk.{i}.ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert")),
    "down_exps_bias": ("blk.{i}.ffn_down_exps.bias", ("n_embd", "n_expert")),
}

#: The q, k, v biases (gpt-oss's files have them; llama.cpp loads them when present).
OPTIONAL_TENSORS: dict[str, TensorSpec] = dict(llama.QKV_BIASES)

#: Keys whose other values mean a feature not implemented here: -> (neutral values, what it is).
REFUSED_KEYS: dict[str, tuple[tuple[object, ...], str]] = {
    "attention.sliding_window_pattern": ((2,), "a sliding-window pattern other than every other layer"),
    "rope.freq_base_swa": ((), "a rope base of its own for the sliding-window layers"),
    "rope.scaling.yarn_log_multiplier": ((0.0,), "YaRN's log multiplier of the attention factor"),
}

#: From this many rows a batch takes ggml's tiled flash attention (float32 q); fewer: its row path (float16 q).
TILED_ROWS = 64

#: llama.cpp's swa pattern for gpt-oss: layers il with il % 2 < 1 use the sliding window.
SWA_PATTERN = 2


def _table(m: Any) -> np.ndarray:
    """A 2-D bias tensor [E, n] as float32 rows (dequantized when the loader left it as raw blocks)."""
    if isinstance(m, QuantLinear):
        from ..quants import dequantize

        return np.asarray(dequantize(m.w, m.ggml_type, m.n_in), F32)
    assert isinstance(m, Linear)
    return np.asarray(m.w, F32)


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """q, k, v fused into one matrix (their biases into one vector); the experts' biases as float32 rows."""
    qkv = llama.fuse_qkv(t)
    out = {**t, **qkv}
    for name in ("gate_exps_bias", "up_exps_bias", "down_exps_bias"):
        out[name] = _table(t[name])
    return out


def is_swa(hp: HParams, il: int) -> bool:
    """True for the layers that attend within the sliding window (the even ones)."""
    return hp.sliding_window > 0 and il % SWA_PATTERN < SWA_PATTERN - 1


def rope_params(hp: HParams) -> tuple[float, float, float]:
    """(freq_scale, ext_factor, attn_factor) for the file's rope scaling, as llama.cpp's context derives them."""
    return rope_scaling_params(hp.rope_scaling, hp.rope_scale, hp.rope_attn_factor)


def layer(hp: HParams, il: int) -> tuple[float, int]:
    """Layer il's (rope base, sliding window) for model.c: the file's base everywhere, the window on the even layers."""
    return hp.rope_base, hp.sliding_window if is_swa(hp, il) else 0


def ffn(w: dict[str, Any], h: np.ndarray, hp: HParams) -> np.ndarray:
    """The experts' feed-forward of the normed stream h [T, d]."""
    return moe_ffn(h, w["router"], w["gate_exps"], w["up_exps"], w["down_exps"], hp.n_expert_used,
                   router_bias=w["router_bias"], softmax_weight=True, glu=swiglu_oai,
                   gate_bias=w["gate_exps_bias"], up_bias=w["up_exps_bias"], down_bias=w["down_exps_bias"])


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    freq_scale, ext_factor, attn_factor = rope_params(hp)
    cos, sin = yarn_angles(batch.positions, hp.n_rot, hp.rope_base, freq_scale, ext_factor, attn_factor,
                           hp.n_ctx_orig)
    scale = float(F32(1) / F32(np.sqrt(np.float64(hp.n_rot))))  # 1.0f/sqrtf(float(n_rot))
    for il, w in enumerate(layers):
        q, k, v = llama.project(w, rmsnorm(x, w["attn_norm"], hp.eps), hp)
        q, k = rope_neox(q, cos, sin), rope_neox(k, cos, sin)
        if x.shape[0] < TILED_ROWS:  # ggml's flash attention rounds q to float16 on its row-by-row path
            q = q.astype(np.float16).astype(F32)
        a = batch.attend(il, q, k, v, scale, hp.sliding_window if is_swa(hp, il) else 0, w["sinks"])
        x = x + (w["wo"](a) + w["bo"])
        x = x + ffn(w, rmsnorm(x, w["ffn_norm"], hp.eps), hp)
    return x


#: How model.c runs it: NEOX rope with YaRN, the layers' windows, the sinks and the experts' biases as data, the
#: softmax-over-top-k gating and swiglu_oai as flags.
NATIVE = Native(rope_neox=True, layer=layer, softmax_weight=True, swiglu_oai=True, rope=rope_params)

SPEC = register(ArchSpec("gpt-oss", LAYER_TENSORS, prepare, blocks, OPTIONAL_TENSORS, refused_keys=REFUSED_KEYS,
                         experts=True, native=NATIVE))
