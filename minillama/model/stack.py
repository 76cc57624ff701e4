"""The blocks of a model run in C (minillama/_native/model.c) on the native backend: one call per pass instead of a
dozen numpy operations and four kernel calls per block.

A pass is a Batch (minillama/model/batch.py): a prompt's chunk of one sequence, or the single-token steps of
several sequences decoding together (StepBatcher), each row at its own sequence's position and attending to its
own cache; the rows of all sequences go through every weight matrix at once. A sequence gets the same bits in a
batch as alone.

The Python blocks (llama.py and the other architecture files) stay the reference: the pure backend runs them.
model.c computes the same thing from the same weights (the quantized
matrices in the map, the float32 norm weights and biases), with what differs between the architectures given as
data: the rope pairing, GeGLU or SwiGLU, gemma3's query scale, post-norms and per-layer sliding window and rope base.
A model whose matrices are not all quantized views (a type the kernels lack, the pure backend) gets no Stack.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

from . import gemma3
from .batch import Batch
from .layers import Linear, QuantLinear, _Joined
from .threads import native_threads
from .weights import HParams

__all__ = ["NativeStack", "build"]

#: general.architecture -> (rope pairs (i, i + n_rot/2), "NEOX"; GeGLU rather than SwiGLU): the architectures
#: model.c runs.
KINDS = {"llama": (False, False), "qwen2": (True, False), "qwen3": (True, False), "phi3": (True, False),
         "gemma3": (True, True)}

#: Fields of a layer tuple, in model.c's order (module.c's Stack): everything but the rope base and window is
#: the prepared block's own field, None when the file has no such tensor.
FIELDS = ("attn_norm", "wqkv", "bqkv", "q_norm", "k_norm", "wo", "bo", "post_attn_norm", "ffn_norm", "w_gate_up",
          "b_gate_up", "w_down", "b_down", "post_ffn_norm", "rope_freqs")


def _matrix(m: Any) -> tuple | None:
    """A matrix as model.c's pieces ((raw rows, ggml type, rows, cols), ...); None when it is not quantized views."""
    parts = m.parts if isinstance(m, _Joined) else [m]
    if not all(isinstance(p, QuantLinear) for p in parts):
        return None
    return tuple((p.w, p.ggml_type, p.w.shape[0], p.n_in) for p in parts)


def _vector(v: Any) -> np.ndarray | None:
    return None if v is None else np.ascontiguousarray(v, dtype=np.float32)


class NativeStack:
    """The C blocks of one model: forward(x, batch) runs every block over x [T, d], the rows of batch's sequences."""

    def __init__(self, core: Any, hp: HParams, arch: str, layers: list[dict[str, Any]],
                 head: tuple[np.ndarray, Any] | None = None) -> None:
        neox, geglu = KINDS[arch]
        gemma = arch == "gemma3"
        q_scale = float(np.float32(1.0 / np.sqrt(np.float32(hp.head_dim)))) if gemma else 1.0
        attn_scale = 1.0 if gemma else float(np.float32(1.0 / np.sqrt(hp.head_dim)))
        rows = []
        for il, w in enumerate(layers):
            fields: list[Any] = []
            for name in FIELDS:
                v = w.get(name)
                fields.append(_matrix(v) if isinstance(v, Linear) else _vector(v))
            swa = gemma and gemma3.is_swa(hp, il)
            base = gemma3.ROPE_BASE_SWA if swa else hp.rope_base
            rows.append((*fields, float(base), hp.sliding_window if swa else 0))
        out = None if head is None else _matrix(head[1])
        #: Outputs of the head, which runs in the blocks' pass (logits()); None: no head (an unquantized output).
        self.n_vocab = None if out is None else sum(piece[2] for piece in out)
        #: What the Stack was made from (the vectors' and views' owners: model.c reads them).
        self._stack_args = ((hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, hp.n_ff, hp.n_rot, hp.eps,
                             neox, geglu, gemma, q_scale, attn_scale), rows,
                            None if out is None else (_vector(head[0]), out, self.n_vocab))
        self._stack = core.Stack(*self._stack_args)

    def forward(self, x: np.ndarray, batch: Batch) -> np.ndarray:
        """x [T, d] after every block: each sequence of batch at its positions, its keys and values into its cache
        (which holds room for them)."""
        x = _writable(x)
        self._stack.forward(x, _seqs(x, batch), native_threads())
        return x

    def logits(self, x: np.ndarray, batch: Batch) -> np.ndarray:
        """Logits [sequences, n_vocab] of each sequence's last row after every block and the head, in one pass (a
        decode step wakes the threads once); the stack must have been made with the head (n_vocab not None)."""
        x = _writable(x)
        out = np.empty((len(batch.seqs), self.n_vocab), np.float32)
        self._stack.forward(x, _seqs(x, batch), native_threads(), out)
        return out


def _writable(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x if x.flags.writeable else x.copy()


def _seqs(x: np.ndarray, batch: Batch) -> list[tuple]:
    """batch's sequences as the C Stack takes them: (rows, start, key caches, value caches), rows in x in turn."""
    ends = [row for row, _, _ in batch.seqs[1:]] + [x.shape[0]]
    return [(end - row, start, cache.k, cache.v) for (row, start, cache), end in zip(batch.seqs, ends, strict=True)]


def build(core: ModuleType | None, hp: HParams, arch: str, layers: list[dict[str, Any]],
          head: tuple[np.ndarray, Any] | None = None) -> NativeStack | None:
    """The C blocks for this model, or None: no native core, an architecture model.c does not run, a matrix that
    is not quantized views, or MINILLAMA_NATIVE_BLOCKS=0 (the Python blocks, for comparison). head: (the final
    norm's weight, the output matrix), run in the blocks' pass when the matrix is quantized views."""
    if core is None or arch not in KINDS or os.environ.get("MINILLAMA_NATIVE_BLOCKS") == "0":
        return None
    for w in layers:
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            if not isinstance(w.get(name), Linear) or _matrix(w[name]) is None:
                return None
    return NativeStack(core, hp, arch, layers, head)
