"""The mixture-of-experts feed-forward block, as llama.cpp's build_moe_ffn computes it (src/llama-graph.cpp).

A router matrix scores every expert for each token; the token goes through the n_used best experts only, each a
SwiGLU feed-forward of its own, and their outputs are summed with the router's weights. The experts' matrices are
3-D tensors in the file (ffn_gate_exps, ffn_up_exps, ffn_down_exps: one [n_ff_exp, n_embd] or [n_embd, n_ff_exp]
matrix per expert) and stay as raw ggml blocks in the memory map (Experts): a step reads, and on the pure backend
dequantizes, the chosen experts' matrices only; a prompt's rows are grouped by expert, so each chosen matrix is
read once for all the rows that chose it.

Shapes in the comments: T tokens, d the model width, E experts, k experts used per token, F an expert's width.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..quants import dequantize
from .layers import Linear, QuantLinear, current_ops, exp_rows, silu

F32 = np.float32

#: llama.cpp clamps the sum of the chosen weights to at least this (the smallest normal float16) before dividing.
MIN_WEIGHT_SUM = F32(6.103515625e-5)


class Experts:
    """The E matrices [n_out, n_in] of one 3-D expert tensor, left as their raw ggml blocks
    ([E, n_out, row bytes], a view of the mapped file). expert(e) is expert e's matrix as a Linear: a QuantLinear
    over its blocks when the native kernels multiply this type (core given), else dequantized now."""

    def __init__(self, raw: np.ndarray, ggml_type: int, n_in: int, core: ModuleType | None,
                 mm: mmap.mmap | None = None) -> None:
        self.raw, self.ggml_type, self.n_in, self._core, self._mm = raw, int(ggml_type), n_in, core, mm

    @property
    def n_expert(self) -> int:
        return self.raw.shape[0]

    @property
    def n_out(self) -> int:
        return self.raw.shape[1]

    def apply(self, e: int, h: np.ndarray) -> np.ndarray:
        """Expert e's matrix times the rows h [n, n_in] that chose it: on the native kernels one row at a time, as
        llama.cpp's mul_mat_id multiplies an expert's rows (not the tiles of rows a dense product takes, whose
        sums differ in the last bits; moe.c does the same); otherwise all at once."""
        lin = self.expert(e)
        if self._core is None or h.shape[0] == 1:
            return lin(h)
        return np.concatenate([lin(h[i:i + 1]) for i in range(h.shape[0])])

    def expert(self, e: int) -> Linear:
        """Expert e's matrix (only its blocks are read)."""
        if self._core is not None:
            return QuantLinear(self.raw[e], self.ggml_type, self.n_in, self._core, self._mm)
        return Linear(dequantize(self.raw[e], self.ggml_type, self.n_in))  # type: ignore[arg-type]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis as ggml_soft_max computes it: exp(x - max) in float32 (layers.exp_rows), summed in
    double, each multiplied by 1/sum rounded to float32. In native_ops, summed as ggml_vec_soft_max_f32's AVX2 loop
    sums them (as moe.c): each eight in float, ((e0 + e4) + (e2 + e6)) + ((e1 + e5) + (e3 + e7)), into a double."""
    e = exp_rows(logits - logits.max(axis=-1, keepdims=True))
    n8 = e.shape[-1] // 8 * 8
    if current_ops() is not None and n8:
        a = e[..., :n8].reshape(*e.shape[:-1], n8 // 8, 8)
        eights = ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))
        parts = np.concatenate([eights, e[..., n8:]], axis=-1)
    else:
        parts = e
    total = np.cumsum(parts, axis=-1, dtype=np.float64)[..., -1:]  # in order, as ggml's loop
    return e * (1.0 / total).astype(F32)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in float32, as ggml_sigmoid."""
    return F32(1) / (F32(1) + np.exp(-logits))


def route(logits: np.ndarray, n_used: int, norm: bool = True, *, gating: str = "softmax",
          bias: np.ndarray | None = None, n_groups: int = 0, n_groups_used: int = 0,
          scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts [T, k], their weights [T, k]) of router logits [T, E], as build_moe_ffn chooses them.

    gating: "softmax" or "sigmoid" of the logits gives each expert's probability. bias (exp_probs_b, [E]) is
    added to the probabilities for the choice only; the weights are the unbiased probabilities. n_groups > 1:
    the experts form n_groups equal groups, a group scores the sum of its two best (biased) probabilities and
    only the n_groups_used best groups' experts can be chosen. The k largest are taken in descending order
    (ggml_argsort_top_k; ties: the lower expert first); with norm their weights are divided by their sum
    (clamped to MIN_WEIGHT_SUM), as build_moe_ffn's norm_w; then multiplied by scale unless it is 0 or 1."""
    logits = logits.astype(F32)
    if gating == "softmax":
        probs = softmax(logits)
    elif gating == "sigmoid":
        probs = sigmoid(logits)
    else:
        raise ValueError(f"expected gating 'softmax' or 'sigmoid', found {gating!r}")
    selection = probs if bias is None else probs + bias.astype(F32)
    if n_groups > 1:
        t, e = selection.shape
        groups = selection.reshape(t, n_groups, e // n_groups)
        best2 = -np.sort(-groups, axis=-1, kind="stable")[..., :2]  # [T, G, 2]
        scores = best2[..., 0] + best2[..., 1] if best2.shape[-1] == 2 else best2[..., 0]
        kept = np.argsort(-scores, axis=-1, kind="stable")[:, :n_groups_used]  # [T, n_groups_used]
        masked = np.full_like(groups, -np.inf)
        np.put_along_axis(masked, kept[..., None], np.take_along_axis(groups, kept[..., None], axis=1), axis=1)
        selection = masked.reshape(t, e)
    chosen = np.argsort(-selection, axis=-1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if norm:
        total = np.cumsum(weights, axis=-1, dtype=np.float64)[:, -1:].astype(F32)  # ggml_sum_rows
        weights = weights / np.maximum(total, MIN_WEIGHT_SUM)
    if scale not in (0.0, 1.0):
        weights = weights * F32(scale)
    return chosen, weights


def route_softmax_weight(logits: np.ndarray, n_used: int) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts [T, k], their weights [T, k]) of router logits [T, E] as build_moe_ffn's
    LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT (gpt-oss): the k largest logits in descending order, their
    weights the softmax of those k logits alone."""
    logits = logits.astype(F32)
    chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :n_used]
    return chosen, softmax(np.take_along_axis(logits, chosen, axis=-1))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up: the experts' SwiGLU (ggml_swiglu_split)."""
    return silu(gate) * up


#: ggml_swiglu_oai's constants as build_moe_ffn passes them for LLM_FFN_SWIGLU_OAI_MOE (gpt-oss).
OAI_ALPHA, OAI_LIMIT = F32(1.702), F32(7.0)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: F32 = OAI_ALPHA, limit: F32 = OAI_LIMIT) -> np.ndarray:
    """gpt-oss's clamped SwiGLU as ggml-cpu's swiglu_oai computes it in float32: x = min(gate, limit),
    y = clamp(up, -limit, limit), x / (1 + exp(-alpha x)) * (y + 1) (expf through float64: correctly rounded)."""
    x = np.minimum(gate, limit)
    y = np.clip(up, -limit, limit)
    with np.errstate(over="ignore"):  # a very negative gate: exp overflows to inf, and the product is -0 as in C
        e = np.exp((alpha * -x).astype(np.float64)).astype(F32)
    return x / (F32(1) + e) * (y + F32(1))


#: ggml's type number of float32.
GGML_F32 = 0


def router_logits(router: Linear, x: np.ndarray) -> np.ndarray:
    """router(x); a float32 router left as the file's raw blocks, in native_ops, in llama.cpp's float32 order
    (Linear's: ggml_vec_dot_f32 for one row, tinyBLAS for more, as moe.c's mo_router), which the quantized kernels'
    float32 dot does not sum in: a router logit an ulp off moves the experts' weights."""
    if isinstance(router, QuantLinear) and router.ggml_type == GGML_F32 and current_ops() is not None:
        return Linear(router.w.view(F32))(x)
    return router(x)


def moe_ffn(x: np.ndarray, router: Linear, gate: Experts, up: Experts, down: Experts, n_used: int,
            norm: bool = True, *, router_bias: np.ndarray | None = None, softmax_weight: bool = False,
            glu: Callable[[np.ndarray, np.ndarray], np.ndarray] = swiglu, gate_bias: np.ndarray | None = None,
            up_bias: np.ndarray | None = None, down_bias: np.ndarray | None = None, **routing: Any) -> np.ndarray:
    """The sum over each token's k chosen experts of weight * down_e(glu(gate_e x, up_e x)), in the order of
    the choice (llama.cpp adds the experts' outputs in that order); each chosen expert's matrices multiply all
    the rows that chose it at once.

    router_bias [E]: added to the router's logits; softmax_weight: route_softmax_weight's gating instead of
    route's; gate_bias, up_bias [E, F] and down_bias [E, d]: expert e's row added after its matmul (ggml_add_id);
    routing: route()'s keywords (gating, bias, groups, scale)."""
    # x [T, d] -> [T, d]
    logits = router_logits(router, x)
    if router_bias is not None:
        logits = logits + router_bias
    chosen, weights = (route_softmax_weight(logits, n_used) if softmax_weight
                       else route(logits, n_used, norm, **routing))  # [T, k] each
    out = np.zeros((x.shape[0], n_used, down.n_out), F32)  # [T, k, d]
    for e in np.unique(chosen).tolist():
        rows, slots = np.nonzero(chosen == e)
        h = np.ascontiguousarray(x[rows])
        g, u = gate.apply(e, h), up.apply(e, h)
        if gate_bias is not None:
            g = g + gate_bias[e]
        if up_bias is not None:
            u = u + up_bias[e]
        y = down.apply(e, glu(g, u))
        if down_bias is not None:
            y = y + down_bias[e]
        out[rows, slots] = y * weights[rows, slots, None]
    total = out[:, 0]
    for i in range(1, n_used):
        total = total + out[:, i]
    return total
