"""The blocks of a model run in C (minillama/_native/model.c) on the native backend: one call per pass instead of a
dozen numpy operations and four kernel calls per block.

A pass is a Batch (minillama/model/batch.py): a prompt's chunk of one sequence, or the single-token steps of
several sequences decoding together (StepBatcher), each row at its own sequence's position and attending to its
own cache; the rows of all sequences go through every weight matrix at once. A sequence gets the same bits in a
batch as alone.

The Python blocks (llama.py and the other architecture files) stay the reference: the pure backend runs them.
model.c computes the same thing from the same weights (the quantized
matrices in the map, the float32 norm weights and biases), with what differs between the architectures given as
data (ArchSpec.native): the rope pairing and scaling (YaRN), GeGLU, SwiGLU or gpt-oss's clamped SwiGLU, gemma3's
query scale, post-norms, per-layer sliding window and rope base, attention sinks, the experts' gating and biases.
Layers and hyper-parameters cross to C as dicts by name (core.Stack.FIELDS, core.Stack.HPARAMS, one list in
model.h), never by position.
A model whose matrices are not all quantized views (a type the kernels lack, the pure backend) gets no Stack.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

from .batch import Batch
from .layers import Linear, QuantLinear, _Joined
from .moe import Experts
from .spec import ArchSpec, Native
from .threads import native_threads
from .weights import HParams

__all__ = ["NativeStack", "build"]

#: Per-layer fields of core.Stack.FIELDS that are not the prepared block's own: the layer's rope base and sliding
#: window (ArchSpec.native.layer).
LAYER_SCALARS = ("rope_base", "window")


def _matrix(m: Any) -> tuple | None:
    """A matrix as model.c's pieces ((raw rows, ggml type, rows, cols), ...); None when it is not quantized views.
    Experts: one piece of all the experts' rows, one expert after another (model.h)."""
    if isinstance(m, Experts):
        if m._core is None:
            return None
        rows = m.n_expert * m.n_out
        return ((m.raw.reshape(rows, m.raw.shape[2]), m.ggml_type, rows, m.n_in),)
    parts = m.parts if isinstance(m, _Joined) else [m]
    if not all(isinstance(p, QuantLinear) for p in parts):
        return None
    return tuple((p.w, p.ggml_type, p.w.shape[0], p.n_in) for p in parts)


def _vector(v: Any) -> np.ndarray | None:
    """A vector (or a table of bias rows, one after another) as float32 values in order."""
    return None if v is None else np.ascontiguousarray(v, dtype=np.float32).reshape(-1)


def rope_hparams(kind: Native, hp: HParams) -> dict[str, float | int]:
    """ggml_rope_ext's scaling arguments as model.c's hyper-parameters (Native.rope; the betas llama.cpp's
    defaults)."""
    freq_scale, ext_factor, attn_factor = kind.rope(hp)
    return {"rope_freq_scale": freq_scale, "rope_ext_factor": ext_factor, "rope_attn_factor": attn_factor,
            "rope_beta_fast": 32.0, "rope_beta_slow": 1.0, "n_ctx_orig": max(1, hp.n_ctx_orig)}


class NativeStack:
    """The C blocks of one model: forward(x, batch) runs every block over x [T, d], the rows of batch's sequences."""

    def __init__(self, core: Any, hp: HParams, arch: ArchSpec, layers: list[dict[str, Any]],
                 head: tuple[np.ndarray, Any] | None = None, kv_split: int = 1) -> None:
        kind = arch.native
        assert kind is not None, f"model.c does not run {arch.name}"
        q_scale = float(np.float32(1.0 / np.sqrt(np.float32(hp.head_dim)))) if kind.scale_q else 1.0
        attn_scale = 1.0 if kind.scale_q else float(np.float32(1.0 / np.sqrt(hp.head_dim)))
        names = [name for name in core.Stack.FIELDS if name not in LAYER_SCALARS]
        rows = []
        for il, w in enumerate(layers):
            row = {name: _matrix(v) if isinstance(v, (Linear, Experts)) else _vector(v)
                   for name in names for v in [w.get(name)]}
            base, window = kind.layer(hp, il)
            rows.append({**row, "rope_base": float(base), "window": int(window)})
        out = None if head is None else _matrix(head[1])
        #: Outputs of the head, which runs in the blocks' pass (logits()); None: no head (an unquantized output).
        self.n_vocab = None if out is None else sum(piece[2] for piece in out)
        hparams = {"n_embd": hp.n_embd, "n_head": hp.n_head, "n_head_kv": hp.n_head_kv, "head_dim": hp.head_dim,
                   "head_dim_v": hp.head_dim_v, "n_ff": hp.n_ff, "n_rot": hp.n_rot, "eps": hp.eps,
                   "rope_neox": kind.rope_neox, "gelu": kind.geglu, "scale_q": kind.scale_q, "q_scale": q_scale,
                   "attn_scale": attn_scale, "n_expert": hp.n_expert, "n_expert_used": hp.n_expert_used,
                   "n_ff_exp": hp.n_ff_exp, "kv_split": kv_split, "softmax_weight": kind.softmax_weight,
                   "swiglu_oai": kind.swiglu_oai, **rope_hparams(kind, hp)}
        #: What the Stack was made from, by name (core.Stack.HPARAMS, core.Stack.FIELDS): the vectors' and views'
        #: owners, which model.c reads.
        self._stack_args = (hparams, rows, None if out is None else (_vector(head[0]), out, self.n_vocab))
        self._stack = core.Stack(*self._stack_args)

    def forward(self, x: np.ndarray, batch: Batch) -> np.ndarray:
        """x [T, d] after every block: each sequence of batch at its positions, its keys and values into its cache
        (which holds room for them)."""
        x = _writable(x)
        self._stack.forward(x, _seqs(x, batch), native_threads())
        return x

    def rope_shift(self, layer: int, k: np.ndarray, deltas: np.ndarray) -> None:
        """A layer's float16 keys k rotated in place by deltas [n] positions (row by row), as llama.cpp's K shift
        after a context shift (KVCache.shift)."""
        self._stack.rope_shift(layer, k, np.ascontiguousarray(deltas, dtype=np.int64))

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
    """batch's sequences as the C Stack takes them: (rows, start, key caches, value caches, the cell orders of the
    full-attention and sliding-window layers' caches), rows in x in turn."""
    ends = [row for row, _, _ in batch.seqs[1:]] + [x.shape[0]]
    return [(end - row, start, cache.k, cache.v, cache.cells(0), cache.cells(1))
            for (row, start, cache), end in zip(batch.seqs, ends, strict=True)]


def build(core: ModuleType | None, hp: HParams, arch: ArchSpec, layers: list[dict[str, Any]],
          head: tuple[np.ndarray, Any] | None = None, kv_split: int = 1) -> NativeStack | None:
    """The C blocks for this model, or None: no native core, an architecture model.c does not run (no
    ArchSpec.native), a prepared field model.c does not know, a matrix that is not quantized views, or
    MINILLAMA_NATIVE_BLOCKS=0 (the Python blocks, for comparison). head: (the final norm's weight, the output
    matrix), run in the blocks' pass when the matrix is quantized views. kv_split: the threads of the llama.cpp run
    whose bits a single-token step over 512 cached positions or more gives (its split-KV attention cuts the cache
    into one chunk per thread)."""
    if core is None or arch.native is None or os.environ.get("MINILLAMA_NATIVE_BLOCKS") == "0":
        return None
    known = set(core.Stack.FIELDS)
    for w in layers:
        if any(v is not None and name not in known for name, v in w.items()):
            return None  # a field model.c would not read: the Python blocks compute it
        ffn = ("router", "gate_exps", "up_exps", "down_exps") if "router" in w else ("w_gate_up", "w_down")
        for name in ("wqkv", "wo", *ffn):
            if not isinstance(w.get(name), (Linear, Experts)) or _matrix(w[name]) is None:
                return None
    return NativeStack(core, hp, arch, layers, head, kv_split)
