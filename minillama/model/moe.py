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
from types import ModuleType

import numpy as np

from ..quants import dequantize
from .layers import Linear, QuantLinear, silu

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

    def expert(self, e: int) -> Linear:
        """Expert e's matrix (only its blocks are read)."""
        if self._core is not None:
            return QuantLinear(self.raw[e], self.ggml_type, self.n_in, self._core, self._mm)
        return Linear(dequantize(self.raw[e], self.ggml_type, self.n_in))  # type: ignore[arg-type]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis as ggml_soft_max computes it: exp(x - max) in float32, summed in double, each
    multiplied by 1/sum rounded to float32."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    total = np.cumsum(e, axis=-1, dtype=np.float64)[..., -1:]  # in order, as ggml's loop
    return e * (1.0 / total).astype(F32)


def route(logits: np.ndarray, n_used: int, norm: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts [T, k], their weights [T, k]) of router logits [T, E]: softmax over the experts, the k
    largest in descending order (ggml_argsort_top_k; ties: the lower expert first), and with norm their weights
    divided by their sum (clamped to MIN_WEIGHT_SUM), as build_moe_ffn's norm_w."""
    probs = softmax(logits.astype(F32))
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if norm:
        total = np.cumsum(weights, axis=-1, dtype=np.float64)[:, -1:].astype(F32)  # ggml_sum_rows
        weights = weights / np.maximum(total, MIN_WEIGHT_SUM)
    return chosen, weights


def moe_ffn(x: np.ndarray, router: Linear, gate: Experts, up: Experts, down: Experts, n_used: int,
            norm: bool = True) -> np.ndarray:
    """The sum over each token's k chosen experts of weight * down_e(silu(gate_e x) * up_e x), in the order of
    the choice (llama.cpp adds the experts' outputs in that order); each chosen expert's matrices multiply all
    the rows that chose it at once."""
    # x [T, d] -> [T, d]
    chosen, weights = route(router(x), n_used, norm)  # [T, k] each
    out = np.zeros((x.shape[0], n_used, down.n_out), F32)  # [T, k, d]
    for e in np.unique(chosen).tolist():
        rows, slots = np.nonzero(chosen == e)
        h = np.ascontiguousarray(x[rows])
        y = down.expert(e)(silu(gate.expert(e)(h)) * up.expert(e)(h))
        out[rows, slots] = y * weights[rows, slots, None]
    total = out[:, 0]
    for i in range(1, n_used):
        total = total + out[:, i]
    return total
