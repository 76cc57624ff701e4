"""deepseek2 (DeepSeek-V2/V3, Kimi K2): multi-head latent attention and a mixture-of-experts with shared experts.

As llama.cpp's src/models/deepseek2.cpp computes it. Attention: q comes from the normed stream through one matrix
(attn_q) or a low-rank pair with an RMSNorm between (attn_q_a, attn_q_a_norm, attn_q_b: q lora); each q head is
head_dim_mla wide, its last rope.dimension_count dims rotated ("NORM" rope, adjacent pairs), the others not.
The keys and values come from one compressed row per token (attn_kv_a_mqa: kv_lora_rank values, RMS-normed by
attn_kv_a_norm, then rope.dimension_count dims that are rotated and shared by every head). The file the current
converter writes keeps them compressed (attention.key_length_mla set): the cache holds that row (one key/value
"head" of kv_lora_rank + rope dims, rounded to float16 as llama.cpp's cache), q's unrotated part is absorbed
into the compressed space per head (attn_k_b), attention runs as multi-query attention over the compressed rows
and attn_v_b decompresses each head's result. An older file has one attn_kv_b matrix instead: the keys and values
are decompressed per head and cached as ordinary multi-head attention. Either way the scores are scaled by
1/sqrt(head_dim_mla) (the decompressed head).

Feed-forward: the first leading_dense_block_count blocks have a dense SwiGLU; the others route each token to
expert_used_count of expert_count experts (moe.route: softmax or sigmoid gating, exp_probs_b added for the choice
only, expert groups, the weights renormalised with expert_weights_norm and multiplied by expert_weights_scale)
and add expert_shared_count shared experts, one SwiGLU of expert_feed_forward_length * expert_shared_count.

Rope scaling (YaRN, as DeepSeek-V2/V3 and Kimi files have it): llama.cpp's angles and attention factor, with
rope.scaling.yarn_log_multiplier (stored as 0.1 x mscale_all_dim) scaling the scores by mscale^2 / sqrt(head_dim_mla)
(rope_and_kq_scale).

Not implemented (refused with a clear error): attention temperature tuning, the next-token prediction blocks, the
gating functions other than softmax and sigmoid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import FormatError
from .batch import Batch
from .layers import Linear, glu_ffn, rmsnorm, rope_norm, rope_scaling_params, silu, yarn_angles
from .moe import moe_ffn
from .spec import ArchSpec, register
from .weights import HParams, TensorSpec

F32 = np.float32

#: llama.cpp's expert_gating_func values -> route()'s gating (0: none given, deepseek2's default is softmax).
GATING = {1: "softmax", 2: "sigmoid"}


def is_mla(hp: HParams) -> bool:
    """The compressed form (the current converter's): attention.key_length_mla and value_length_mla set."""
    return hp.head_dim_mla != 0 and hp.head_dim_v_mla != 0


def head_dims(hp: HParams) -> tuple[int, int]:
    """(query/key head, value head) as decompressed: the MLA lengths, or the plain ones of an older file."""
    return (hp.head_dim_mla, hp.head_dim_v_mla) if is_mla(hp) else (hp.head_dim, hp.head_dim_v)


def gating(hp: HParams) -> str:
    """The experts' gating function: the file's, else softmax (sigmoid for GLM 4.7 Lite, as llama.cpp guesses)."""
    if hp.expert_gating:
        return GATING[hp.expert_gating]
    return "sigmoid" if hp.n_layer in (47, 48) and hp.n_vocab == 154880 else "softmax"


def _check(hp: HParams) -> None:
    """FormatError for the shapes llama.cpp asserts on or refuses."""
    hk, _ = head_dims(hp)
    key = f"{hp.arch}.attention.key_length_mla" if is_mla(hp) else f"{hp.arch}.attention.key_length"
    if hk - hp.n_rot < 1:
        raise FormatError(f"{key} is {hk} with rope.dimension_count {hp.n_rot}, expected a head wider than its "
                          "rotated part (llama.cpp asserts it)", key=key)
    if hp.n_lora_kv < 1:
        key = f"{hp.arch}.attention.kv_lora_rank"
        raise FormatError(f"{key} is {hp.n_lora_kv}, expected at least 1", key=key)
    if hp.n_layer_dense_lead >= hp.n_layer:
        return
    key = f"{hp.arch}.expert_count"
    if hp.n_expert == 0:
        raise FormatError(f"{key} is missing or 0 with block {hp.n_layer_dense_lead} a mixture-of-experts block, "
                          "expected at least 1 (llama.cpp refuses the file too)", key=key)
    groups, used = hp.n_expert_groups, hp.n_group_used
    if groups > 1 and (hp.n_expert % groups or groups >= hp.n_expert or not 0 < used < groups):
        key = f"{hp.arch}.expert_group_count"
        raise FormatError(f"{key} is {groups} with {hp.n_expert} experts and expert_group_used_count {used}, "
                          "expected a divisor of the experts below their count, with 1..groups-1 groups used "
                          "(llama.cpp asserts it)", key=key)


def block_tensors(hp: HParams, il: int) -> tuple[Mapping[str, TensorSpec], Mapping[str, TensorSpec]]:
    """Block il's (required, optional) tensors, as llama.cpp's loader takes them: q lora or attn_q, the compressed
    attn_k_b/attn_v_b or an older file's attn_kv_b, a dense or a mixture-of-experts feed-forward."""
    _check(hp)
    hk, hv = head_dims(hp)
    d, h, r, nope = hp.n_embd, hp.n_head, hp.n_lora_kv, hk - hp.n_rot
    t: dict[str, TensorSpec] = {"attn_norm": ("blk.{i}.attn_norm.weight", (d,))}
    if hp.n_lora_q > 0:
        t["q_a_norm"] = ("blk.{i}.attn_q_a_norm.weight", (hp.n_lora_q,))
    t["kv_a_norm"] = ("blk.{i}.attn_kv_a_norm.weight", (r,))
    if hp.n_lora_q > 0:
        t["q_a"] = ("blk.{i}.attn_q_a.weight", (d, hp.n_lora_q))
        t["q_b"] = ("blk.{i}.attn_q_b.weight", (hp.n_lora_q, h * hk))
    else:
        t["wq"] = ("blk.{i}.attn_q.weight", (d, h * hk))
    t["kv_a"] = ("blk.{i}.attn_kv_a_mqa.weight", (d, r + hp.n_rot))
    if is_mla(hp):
        t["k_b"] = ("blk.{i}.attn_k_b.weight", (nope, r, h))
        t["v_b"] = ("blk.{i}.attn_v_b.weight", (r, hv, h))
    else:
        t["kv_b"] = ("blk.{i}.attn_kv_b.weight", (r, h * (nope + hv)))
    t["wo"] = ("blk.{i}.attn_output.weight", (h * hv, d))
    t["ffn_norm"] = ("blk.{i}.ffn_norm.weight", (d,))
    req, optional = lead_or_expert_tensors(hp, il, bias_required=False)
    return {**t, **req}, optional


def lead_or_expert_tensors(hp: HParams, il: int, *, bias_required: bool) -> tuple[dict[str, TensorSpec],
                                                                                  dict[str, TensorSpec]]:
    """Block il's feed-forward (required, optional) tensors where leading blocks are dense (deepseek2, glm4moe): a
    SwiGLU below n_layer_dense_lead, else the router, its exp_probs_b (required or optional, as the architecture's
    loader says), the experts, and the shared expert when there is one."""
    d, req, opt = hp.n_embd, {}, {}
    if il < hp.n_layer_dense_lead:
        req["w_gate"] = ("blk.{i}.ffn_gate.weight", (d, hp.n_ff))
        req["w_down"] = ("blk.{i}.ffn_down.weight", (hp.n_ff, d))
        req["w_up"] = ("blk.{i}.ffn_up.weight", (d, hp.n_ff))
        return req, opt
    e, f, fs = hp.n_expert, hp.n_ff_exp, hp.n_ff_exp * hp.n_expert_shared
    req["router"] = ("blk.{i}.ffn_gate_inp.weight", (d, e))
    (req if bias_required else opt)["exp_probs_b"] = ("blk.{i}.exp_probs_b.bias", (e,))
    req["gate_exps"] = ("blk.{i}.ffn_gate_exps.weight", (d, f, e))
    req["down_exps"] = ("blk.{i}.ffn_down_exps.weight", (f, d, e))
    req["up_exps"] = ("blk.{i}.ffn_up_exps.weight", (d, f, e))
    if hp.n_expert_shared > 0:
        req["gate_shexp"] = ("blk.{i}.ffn_gate_shexp.weight", (d, fs))
        req["down_shexp"] = ("blk.{i}.ffn_down_shexp.weight", (fs, d))
        req["up_shexp"] = ("blk.{i}.ffn_up_shexp.weight", (d, fs))
    return req, opt


def fuse_gate_up(t: dict[str, Any]) -> dict[str, Any]:
    """t with gate/up fused into one matrix: the dense SwiGLU's (w_gate_up) and the shared expert's (shexp_gate_up)."""
    out = dict(t)
    for gate, up, fused in (("w_gate", "w_up", "w_gate_up"), ("gate_shexp", "up_shexp", "shexp_gate_up")):
        if gate in out:
            out[fused] = Linear.fuse([out.pop(gate), out.pop(up)])
    return out


def prepare(t: dict[str, Any]) -> dict[str, Any]:
    """gate/up fused (dense and shared experts); attn_k_b and attn_v_b as one matrix per head (dequantized once on
    the pure backend)."""
    out = dict(t)
    for name in ("k_b", "v_b"):
        if name in t:
            out[name] = [t[name].expert(h) for h in range(t[name].n_expert)]
    return fuse_gate_up(out)


def _per_head(mats: list[Linear], x: np.ndarray) -> np.ndarray:
    """x [T, H, n] through head h's matrix for each h: [T, H, m]."""
    return np.stack([m(np.ascontiguousarray(x[:, h])) for h, m in enumerate(mats)], axis=1)


def attention(w: dict[str, Any], hn: np.ndarray, hp: HParams, batch: Batch, il: int, cos: np.ndarray,
              sin: np.ndarray, scale: float) -> np.ndarray:
    """Multi-head latent attention of the normed stream hn [T, d] (before attn_output), scores times scale:
    [T, H * hv]."""
    t, r, n_rot = hn.shape[0], hp.n_lora_kv, hp.n_rot
    hk, hv = head_dims(hp)
    nope = hk - n_rot
    if "q_a" in w:
        q = w["q_b"](rmsnorm(w["q_a"](hn), w["q_a_norm"], hp.eps))
    else:
        q = w["wq"](hn)
    q = q.reshape(t, hp.n_head, hk)
    kv = w["kv_a"](hn)  # [T, r + n_rot]
    k_pe = rope_norm(np.ascontiguousarray(kv[:, None, r:]), cos, sin)  # [T, 1, n_rot]
    c = rmsnorm(kv[:, :r], w["kv_a_norm"], hp.eps)  # [T, r]
    q_pe = rope_norm(np.ascontiguousarray(q[..., nope:]), cos, sin)  # [T, H, n_rot]
    if is_mla(hp):
        absorbed = _per_head(w["k_b"], q[..., :nope])  # [T, H, r]
        out = batch.attend(il, np.concatenate([absorbed, q_pe], axis=-1), np.concatenate([c, k_pe[:, 0]], -1)[:, None],
                           c[:, None], scale)  # [T, H * r]
        return _per_head(w["v_b"], out.reshape(t, hp.n_head, r)).reshape(t, hp.n_head * hv)
    kvb = w["kv_b"](c).reshape(t, hp.n_head, nope + hv)
    k = np.concatenate([kvb[..., :nope], np.broadcast_to(k_pe, (t, hp.n_head, n_rot))], axis=-1)
    return batch.attend(il, np.concatenate([q[..., :nope], q_pe], axis=-1), k, kvb[..., nope:], scale)


def ffn(w: dict[str, Any], h: np.ndarray, hp: HParams) -> np.ndarray:
    """A dense block's SwiGLU, or the routed experts plus the shared ones (added in llama.cpp's order)."""
    if "w_gate_up" in w:
        return glu_ffn(h, w["w_gate_up"], w["w_down"], silu)
    routed = moe_ffn(h, w["router"], w["gate_exps"], w["up_exps"], w["down_exps"], hp.n_expert_used,
                     norm=hp.expert_weights_norm, gating=gating(hp), bias=w.get("exp_probs_b"),
                     n_groups=hp.n_expert_groups, n_groups_used=hp.n_group_used, scale=hp.expert_weights_scale)
    return routed + glu_ffn(h, w["shexp_gate_up"], w["down_shexp"], silu) if "shexp_gate_up" in w else routed


def rope_and_kq_scale(hp: HParams) -> tuple[float, float, float, float]:
    """(freq_scale, ext_factor, attn_factor) of the rope and the scores' scale, as llama.cpp's deepseek2 graph
    derives them in float32: the context's attention factor with the file's log multiplier (over 0.1), then
    mscale = attn_factor (1 + 0.1 ln(1/freq_scale)) (1 + 0.1 log_mul ln(1/freq_scale)), scale mscale^2/sqrt(hk)."""
    f32 = F32
    log_mul = f32(hp.yarn_log_mul) / f32(0.1)  # llama.cpp cancels the converter's factor
    freq_scale, ext_factor, attn_factor = rope_scaling_params(hp.rope_scaling, hp.rope_scale, hp.rope_attn_factor,
                                                              float(log_mul))
    ln = f32(np.log(np.float64(f32(1) / f32(freq_scale))))
    org = f32(attn_factor) * (f32(1) + f32(0.1) * ln)
    mscale = org * (f32(1) + f32(0.1) * log_mul * ln)
    hk, _ = head_dims(hp)
    return freq_scale, ext_factor, attn_factor, float(f32(1) * mscale * mscale / f32(np.sqrt(np.float64(f32(hk)))))


def blocks(x: np.ndarray, layers: list[dict[str, Any]], hp: HParams, batch: Batch) -> np.ndarray:
    """Run every block over x [T, d], the rows of batch's sequences at their positions, extending their caches."""
    freq_scale, ext_factor, attn_factor, scale = rope_and_kq_scale(hp)
    cos, sin = yarn_angles(batch.positions, hp.n_rot, hp.rope_base, freq_scale, ext_factor, attn_factor,
                           hp.n_ctx_orig)
    for il, w in enumerate(layers):
        x = x + w["wo"](attention(w, rmsnorm(x, w["attn_norm"], hp.eps), hp, batch, il, cos, sin, scale))
        x = ffn(w, rmsnorm(x, w["ffn_norm"], hp.eps), hp) + x
    return x


#: Metadata whose non-neutral values mean a feature not implemented here.
REFUSED_KEYS = {
    "attention.temperature_scale": ((0, 0.0), "attention temperature tuning"),
    "nextn_predict_layers": ((0,), "next-token prediction blocks"),
    "expert_gating_func": ((0, 1, 2), "an expert gating function other than softmax and sigmoid"),
}

SPEC = register(ArchSpec("deepseek2", {}, prepare, blocks, refused_keys=REFUSED_KEYS, rope_whole_head=False,
                         block_tensors=block_tensors))
