"""minillama.model: run a GGUF model's forward pass in numpy, so generate() and chat talk to a real model.

    from minillama.model import Model
    from minillama.tokenizer import Tokenizer
    from minillama.generate import generate
    model = Model.from_file("SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = Tokenizer.from_file("SmolLM2-135M-Instruct.Q4_1.gguf")
    model.logits(tok.encode("The capital of France is"))  # [n_tokens, n_vocab] float32
    for chunk in generate(model, tok, "The capital of France is", 16, temperature=0):
        print(chunk, end="")

The forward pass: look up each token's embedding row (the table stays quantized: Embedding.lookup), run
the architecture's blocks (one file per architecture: llama.py, qwen2.py, qwen3.py, phi3.py, gemma3.py,
built from layers.py), apply the final RMSNorm and multiply by the output matrix. On the native backend the weight
matrices stay quantized in the memory map and the C kernels multiply them (layers.QuantLinear); on the pure one
they are dequantized to float32 once, at load, so every step is a few BLAS matmuls. next_token keeps a key/value
cache and reuses the longest prefix the new
ids share with the cached ones: a generated token costs one single-token step, a prompt one batched pass.
model.session() gives a sequence with a cache of its own (a server's slot): the weights are only read, so threads
can each drive a session at once; hidden(ids) is the final hidden state that embeddings pool.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np

from ..embedding import Embedding
from ..errors import ArgumentError, ContextLengthError, FormatError, NonFiniteError, UnsupportedError
from ..sampling import Sampler
from . import llama
from .batch import Batch, Step, StepBatcher
from .cache import KVCache, Prefix, ctx_cells, swa_cells
from .layers import Linear, QuantLinear, _Joined, native_ops, rmsnorm, rope_neox, rope_norm, yarn_angles
from .spec import ArchSpec, get, supported
from .stack import NativeStack
from .stack import build as build_stack
from .threads import AutoThreads, limited, usable_cores
from .weights import HParams, TensorSpec, Weights, map_pages

__all__ = ["Model", "Session", "ARCHITECTURES", "ArchSpec", "supported"]


def __getattr__(name: str) -> Any:
    """ARCHITECTURES, the old name of the registry: general.architecture -> its ArchSpec (spec.ARCHS), every
    architecture module found first."""
    if name == "ARCHITECTURES":
        return {arch: get(arch) for arch in supported()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Tensors outside the blocks. output.weight is optional: without it the output matrix is the embedding (tied).
TOKEN_EMBD: TensorSpec = ("token_embd.weight", ("n_embd", "n_vocab"))
OUTPUT_NORM: TensorSpec = ("output_norm.weight", ("n_embd",))
OUTPUT: TensorSpec = ("output.weight", ("n_embd", "n_vocab"))
#: Added to the logits when the file has it and the architecture takes it (OUTPUT_BIAS: qwen2, as llama.cpp).
OUTPUT_BIAS: TensorSpec = ("output.bias", ("n_vocab",))
#: A reranker's head (llama.cpp's cls_out, LLM_TENSOR_CLS_OUT), for the architectures whose loader takes it: a
#: [n_embd, n_cls_out] matrix (n_cls_out: the length of {arch}.classifier.output_labels, else 1) that rank pooling
#: applies to the last position's final hidden state (Model.rank).
RANK_HEAD = {"qwen3": "cls.output.weight"}
#: The architectures whose rank pooling ends in a softmax over the head's outputs (llama.cpp's build_pooling:
#: the Qwen3 rerankers' yes/no pair).
RANK_SOFTMAX = frozenset({"qwen3"})

#: The most BLAS threads the default ("auto") uses: the cores this process may use, up to four, as llama.cpp uses
#: the cores. A single-token step is a string of matrix-vector products bound by memory bandwidth; a second core
#: reads it faster on a quiet machine (SmolLM2 16 -> 23 tokens/s, Gemma 3 9 -> 17 here), more than four gain
#: little on matrices this small. On a busy machine spinning BLAS threads are slower than one (5x seen here), so
#: "auto" times both and runs the faster (minillama/model/threads.py).
DEFAULT_THREADS = max(1, min(4, usable_cores()))

#: threads="auto": between 1 and DEFAULT_THREADS BLAS threads, whichever is faster now (AutoThreads).
AUTO = "auto"

Threads = int | Literal["auto"] | None

#: Most tokens one batched pass takes; longer inputs go in chunks of this many: llama.cpp's default n_ubatch, so
#: that each chunk is one of llama.cpp's micro-batches (its attention takes one path for a batch of 64 rows or more
#: and another for fewer, and the native backend follows it chunk by chunk).
CHUNK = 512

#: Called during load with (weights dequantized so far, weights in all), e.g. to draw a progress bar.
Progress = Callable[[int, int], None]


class Model:
    """A GGUF model with weights, ready to score tokens: logits(ids) and next_token(ids, sampler)."""

    def __init__(self, path: str, hp: HParams, arch: ArchSpec, embedding: Embedding,
                 layers: list[dict[str, Any]], output_norm: np.ndarray, output: Linear,
                 threads: Threads = AUTO, *, output_bias: np.ndarray | None = None,
                 kv_split: int | None = None, rank_head: Linear | None = None) -> None:
        """Use from_file; this wires loaded weights together."""
        self.path, self.hparams, self._arch = path, hp, arch
        #: The file's reranker head (RANK_HEAD's tensor), or None: what rank() applies to the last hidden state.
        self.rank_head = rank_head
        #: BLAS threads for the forward pass: "auto", a number (at most the usable cores), None (numpy's default).
        self.threads = _check_threads(threads)
        self._embedding, self._layers = embedding, layers
        #: The matrix products run in the native kernels (QuantLinear), not BLAS.
        self._native = isinstance(output, QuantLinear) or any(
            isinstance(v, QuantLinear) for layer in layers[:1] for v in layer.values())
        #: The blocks in C (model.c) on the native backend (prompts and batched steps alike), else None.
        #: The thread count of the llama.cpp run whose bits the C blocks give: its one-token steps over 512 cached
        #: positions or more split the cache into one chunk per thread (from_file's kv_split).
        self.kv_split = _check_kv_split(kv_split, self.threads)
        self._stack: NativeStack | None = (build_stack(_core_of(layers), hp, arch, layers, (output_norm, output),
                                                       self.kv_split) if self._native else None)
        #: The native core whose attention (llama.cpp's flash attention over a float16 cache) the blocks use: the
        #: C blocks', or the Python blocks' on the native backend (Batch.core); None on the pure backend.
        self._attn_core = _core_of(layers) if self._native else None
        #: A pass calls BLAS (unless the C blocks run it): limited() sets its threads around each pass.
        self._blas = self._stack is None
        self._auto = self._new_auto()
        self._output_norm, self._output, self._output_bias = output_norm, output, output_bias
        self._scale = arch.embed_scale(hp)
        #: Single-token steps of sessions on several threads at once go through the weights as one pass.
        self.batcher = StepBatcher(self._run_steps)
        self._step_auto = self._new_auto()
        self._default = Session(self)  # what next_token uses: one sequence, as before sessions existed

    def _new_auto(self) -> AutoThreads | None:
        """The thread chooser of one kind of caller (threads="auto"), else None."""
        return AutoThreads(DEFAULT_THREADS, self._native, self._blas) if self.threads == AUTO else None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, progress: Progress | None = None,
                  threads: Threads = AUTO, kv_split: int | None = None) -> Model:
        """Load a GGUF model: hyper-parameters from its metadata, every tensor checked (and, on the pure backend,
        dequantized).

        threads: how many BLAS threads the forward pass uses: "auto" (default) runs 1 or up to DEFAULT_THREADS,
        whichever its timings say is faster on this machine now; a number is used as given but capped at the
        cores this process may use (os.sched_getaffinity), since more only wait on each other; None leaves numpy's
        setting.

        kv_split: the thread count of the llama.cpp run whose log-probs to give (default: threads when a number,
        else DEFAULT_THREADS). llama.cpp's one-token steps over 512 cached positions or more cut the cache into one
        chunk per thread and merge the chunks' softmax sums, so its bits there depend on its thread count.
        """
        path = os.fspath(path)
        threads = _check_threads(threads)
        _check_kv_split(kv_split, threads)
        w = Weights(path)
        name = w.arch
        arch = get(name)
        if arch is None:
            raise UnsupportedError(f"{path}: architecture {name!r} is not supported; minillama runs "
                                   f"{', '.join(supported())}")
        hp = w.hparams(name) if arch.read_hparams is None else arch.read_hparams(w, name)
        if arch.experts and hp.n_expert == 0:
            key = f"{name}.expert_count"
            raise FormatError(f"{key} is missing or 0, expected at least 1: {name} is a mixture-of-experts "
                              "architecture (llama.cpp refuses the file too)", path=path, key=key)
        for key, (neutral, what) in arch.refused_keys.items():
            value = w.gguf.metadata.get(f"{name}.{key}")
            if value is not None and not (isinstance(value, (int, float, str)) and value in neutral):  # a list too
                raise UnsupportedError(f"{path}: {name}.{key} is {value!r}: {what}, which minillama does not "
                                       f"implement for {name}; expected a file without it (or "
                                       f"{' or '.join(map(repr, neutral))})")
        if arch.rope_whole_head and hp.n_rot != hp.head_dim:
            key = f"{name}.rope.dimension_count"
            raise FormatError(f"{key} is {hp.n_rot}, expected {hp.head_dim} (the head size): llama.cpp's {name} "
                              "rotates whole heads and refuses other values", path=path, key=key)
        for tensor, what in arch.refused_tensors.items():
            if w.has(tensor):
                raise UnsupportedError(f"{path}: tensor {tensor} holds {what}, which minillama does not implement "
                                       f"for {name}; expected a file without it")
        # Check that every tensor is there with its shape before the slow part: each block's required tensors
        # and the optional ones the file has, as fields of that block.
        out_spec = OUTPUT if w.has(OUTPUT[0]) else TOKEN_EMBD
        head_spec = _rank_head_spec(w, name)
        bias_spec = [OUTPUT_BIAS] if arch.output_bias and w.has(OUTPUT_BIAS[0]) else []
        blocks = [_block_fields(arch, w, hp, il) for il in range(hp.n_layer)]
        sizes = []
        for il, fields in enumerate(blocks):
            for _, spec in fields:
                name_shape = w.spec(spec, hp, il)
                w.check(*name_shape)
                sizes.append(int(np.prod(name_shape[1])))
        for spec in [out_spec, *bias_spec, *head_spec]:
            w.check(*w.spec(spec, hp))
        extras, extra_names = arch.extras(w, hp) if arch.extras is not None else ({}, set())
        _refuse_unused(w, {w.spec(spec, hp, il)[0] for il, fields in enumerate(blocks) for _, spec in fields}
                       | {TOKEN_EMBD[0], OUTPUT_NORM[0], out_spec[0], *(s[0] for s in bias_spec + head_spec)}
                       | extra_names, name)
        embedding = w.embedding(*w.spec(TOKEN_EMBD, hp))
        output_norm = w.load(OUTPUT_NORM, hp)
        total, done = sum(sizes) + int(np.prod(w.spec(out_spec, hp)[1])), 0
        layers: list[dict[str, Any]] = []
        shared: dict[str, Any] = {}  # a tensor every block names (rope_freqs.weight): loaded once
        for il, fields in enumerate(blocks):
            block = {}
            for field, spec in fields:
                name, _ = w.spec(spec, hp, il)
                block[field] = shared[name] if name in shared else w.load(spec, hp, il)
                if "{i}" not in spec[0]:
                    shared[name] = block[field]
                done += int(np.prod(w.spec(spec, hp, il)[1]))
                if progress is not None:
                    progress(done, total)
            layers.append({**arch.prepare(block), **extras})  # stack the matrices now: the parts are freed at once
        output = w.load(out_spec, hp)
        output_bias = w.load(bias_spec[0], hp) if bias_spec else None
        rank_head = w.load(head_spec[0], hp) if head_spec else None
        if progress is not None:
            progress(total, total)
        model = cls(path, hp, arch, embedding, layers, output_norm, output, threads, output_bias=output_bias,
                    kv_split=kv_split, rank_head=rank_head)  # type: ignore[arg-type]
        mapped = w.mapping()
        del w  # the file's metadata (a large vocab's strings) goes before the weights' pages join the resident set
        if mapped is not None:
            map_pages(mapped)
        return model

    # -- properties ----------------------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of tokens the model scores."""
        return self.hparams.n_vocab

    @property
    def n_ctx(self) -> int:
        """Most tokens one sequence may hold (the context the model was trained for)."""
        return self.hparams.n_ctx

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"Model({hp.arch}, {hp.n_layer} layers, d={hp.n_embd}, {hp.n_head}/{hp.n_head_kv} heads, "
                f"vocab {hp.n_vocab}, {self.path!r})")

    # -- forward -------------------------------------------------------------------------------------------------

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Scores of every token after each prefix of ids, [len(ids), n_vocab] float32 (a fresh causal pass)."""
        ids = self._check(ids)
        return self._forward(ids, 0, self._new_cache(), last_only=False)

    def hidden(self, ids: Sequence[int]) -> np.ndarray:
        """The final hidden state (after the output norm, before the output matrix) of every position of ids,
        [len(ids), n_embd] float32 (a fresh causal pass): what llama.cpp pools into embeddings (t_embd)."""
        ids = self._check(ids)
        return self._forward(ids, 0, self._new_cache(), last_only=False, hidden=True)

    def rank(self, ids: Sequence[int]) -> np.ndarray:
        """llama.cpp's rank pooling of ids (a fresh causal pass): the last position's final hidden state through the
        file's rank head (rank_head) when it has one, then for a Qwen3 a softmax over those outputs, as ggml
        computes it (float32 exponentials, their sum in float64); [n_cls_out] float32, whose first value is
        llama-server's relevance score. Without a head the hidden state itself goes on, as in llama.cpp."""
        x = self.hidden(ids)[-1:]
        if self.rank_head is not None:
            x = self._finite(self.rank_head(x), "rank head outputs")
        v = x[0].astype(np.float32)
        if self.hparams.arch in RANK_SOFTMAX:
            e = np.exp(v - v.max())
            v = e * np.float32(1.0 / float(e.astype(np.float64).sum()))
        return v

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        """The sampler's choice of the token after ids; reuses the cache for the prefix ids share with the last call."""
        return self._default.next_token(ids, sampler)

    @property
    def _cache(self) -> KVCache:
        """The default session's cache (what next_token extends)."""
        return self._default._cache

    @property
    def evaluated(self) -> int:
        """Positions the last next_token ran through the model (the rest came from the cache)."""
        return self._default.evaluated

    def can_shift(self, n_ctx: int | None = None) -> bool:
        """Whether its sessions of n_ctx positions (None: the model's context) can shift their context
        (Session.shift_context): the C blocks run it (on the pure backend: an architecture they run, whose rope
        rope_shift applies in numpy), its cache holds keys and values only, and a sliding-window
        layers' cache is as large as the full-attention layers' (llama.cpp's llama_kv_cache_iswa::get_can_shift:
        llama-server disables context shift otherwise)."""
        n_ctx = self.n_ctx if n_ctx is None else n_ctx
        window = self.hparams.sliding_window
        rotates = self._stack is not None if self._native else self._arch.native is not None
        return rotates and self._arch.new_cache is None and (
            window == 0 or swa_cells(window, n_ctx) == ctx_cells(n_ctx))

    def _rope_shift(self, layer: int, k: np.ndarray, deltas: np.ndarray) -> None:
        """The first len(deltas) rows of a layer's cached keys k (float16 values) rotated in place by deltas
        positions, as llama.cpp's K shift (float16 to float32, ggml_rope_ext with the layer's base, scaling and
        rope_freqs, back to float16): the pure backend's twin of the C blocks' rope_shift."""
        kind, hp = self._arch.native, self.hparams
        assert kind is not None
        base, _ = kind.layer(hp, layer)
        freq_scale, ext_factor, attn_factor = kind.rope(hp)
        cos, sin = yarn_angles(deltas, hp.n_rot, base, freq_scale, ext_factor, attn_factor, hp.n_ctx_orig,
                               factors=self._layers[layer].get("rope_freqs"))
        n = deltas.shape[0]
        rotated = (rope_neox if kind.rope_neox else rope_norm)(k[:n].astype(np.float32), cos, sin)
        k[:n] = rotated.astype(np.float16)

    def session(self, n_ctx: int | None = None, batched: bool = False) -> Session:
        """A sequence of its own (its own KV cache) on this model: threads may each drive one at once. batched:
        its single-token steps share one pass with those other batched sessions ask for at the same time
        (StepBatcher); that pays from 2 sequences a pass on the native backend, about 4 on the pure one (see
        minillama/model/batch.py)."""
        return Session(self, n_ctx, batched)

    def reset(self) -> None:
        """Forget the cached sequence (and free the cache's memory)."""
        self._default.reset()

    def _new_cache(self, n_ctx: int | None = None) -> KVCache:
        """A cache for one sequence of at most n_ctx positions (None: the model's context): the context sizes
        llama.cpp's cache of the sliding-window layers (KVCache's Ring)."""
        hp = self.hparams
        # the C attention (the C blocks', and the Python blocks' on the native backend) reads float16, as llama.cpp
        dtype = np.float16 if self._attn_core is not None else np.float32
        if self._arch.new_cache is not None:  # keys and values beside recurrent state
            return self._arch.new_cache(hp, dtype)
        shapes = self._arch.cache_shapes(hp) if self._arch.cache_shapes is not None else None
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, hp.head_dim_v, dtype=dtype, shapes=shapes,
                       window=hp.sliding_window, n_ctx=self.n_ctx if n_ctx is None else n_ctx)

    def _check(self, ids: Sequence[int], n_ctx: int | None = None) -> list[int]:
        """ids as a list of ints within the vocab and the context (n_ctx, at most the model's)."""
        out = [int(i) for i in ids]
        n_ctx = self.n_ctx if n_ctx is None else n_ctx
        if not out:
            raise ArgumentError("expected at least one token id (a prompt), got none")
        if len(out) > n_ctx:
            raise ContextLengthError(f"{len(out)} tokens do not fit the model's context of {n_ctx} tokens "
                                     f"({self.path})")
        n_vocab = self.n_vocab
        if min(out) < 0 or max(out) >= n_vocab:  # in C: a step's check of its whole context stays cheap
            bad = next(i for i in out if not 0 <= i < n_vocab)
            raise ArgumentError(f"token id {bad} is out of range for this model (expected 0..{n_vocab - 1})")
        return out

    def _forward(self, ids: list[int], start: int, cache: KVCache, last_only: bool, hidden: bool = False,
                 auto: AutoThreads | None = None) -> np.ndarray:
        """Run ids (at positions start..) through the model, extending cache; logits of every (or the last) one.

        Long inputs go in chunks of CHUNK tokens, each attending to the cache, so attention scores stay
        [H, CHUNK, n] instead of [H, n, n].
        """
        def run() -> np.ndarray:
            return self._chunks(ids, start, cache, last_only, hidden)

        auto = self._auto if auto is None else auto
        if auto is not None:
            return auto.run(len(ids), run)
        return limited(self.threads, run, self._native, self._blas)  # type: ignore[arg-type]

    def _chunks(self, ids: list[int], start: int, cache: KVCache, last_only: bool, hidden: bool) -> np.ndarray:
        cache.reserve(start + len(ids))
        out = [self._run(ids[i:i + CHUNK], start + i, cache, last_only, hidden) for i in range(0, len(ids), CHUNK)]
        return out[-1] if last_only else np.concatenate(out)

    def _run(self, ids: list[int], start: int, cache: KVCache, last_only: bool, hidden: bool) -> np.ndarray:
        """One chunk of the forward pass: embedding, blocks, final norm, output matrix (not when hidden)."""
        cache.place(start, len(ids))
        x = self._embedding.lookup(np.asarray(ids, dtype=np.intp))
        if self._scale is not None:
            x *= np.float32(self._scale)
        if last_only and not hidden and self._stack is not None and self._stack.n_vocab is not None:
            logits = self._stack.logits(x, Batch.single(start, len(ids), cache))  # blocks and head: one pass
            cache.ids[start:] = ids
            return self._finite(self._bias(logits))
        batch = Batch.single(start, len(ids), cache)
        batch.tokens = np.asarray(ids, dtype=np.intp)
        if last_only and not hidden:
            batch.out_rows = np.array([len(ids) - 1])
        x = self._blocks(x, batch)
        cache.ids[start:] = ids
        if last_only:
            x = x[-1:]
        x = rmsnorm(x, self._output_norm, self.hparams.eps)
        return self._finite(x, "hidden states") if hidden else self._finite(self._logits(x))

    def _finite(self, a: np.ndarray, what: str = "scores (logits)") -> np.ndarray:
        """a, a pass's output, when every value is finite; else NonFiniteError, the same on both backends (the C
        kernels quantize an activation block holding a NaN or an infinity so that its products are NaN, as the
        float32 path's are). NaN and infinity spread through every later layer and the final norm, so the output
        alone tells; its minimum and maximum (NaN if any value is) cost one read of it."""
        with np.errstate(invalid="ignore"):
            lo, hi = (a.min(), a.max()) if a.size else (0.0, 0.0)
        if np.isfinite(lo) and np.isfinite(hi):
            return a
        found = "NaN" if np.isnan(lo) or np.isnan(hi) else "infinity"
        raise NonFiniteError(f"the model's {what} are not finite: found {found}, expected finite numbers (its weights "
                             f"hold NaN or infinity, or its activations overflow float32)", path=self.path)

    def _blocks(self, x: np.ndarray, batch: Batch) -> np.ndarray:
        """x [T, d] after every block (the C ones when the model has them): the rows of batch's sequences."""
        if self._stack is not None:
            return self._stack.forward(x, batch)
        batch.core, batch.kv_split = self._attn_core, self.kv_split
        with native_ops(self._attn_core):
            return self._arch.blocks(x, self._layers, self.hparams, batch)

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """The output matrix (and its bias, when the file has one) over the final-normed stream x."""
        return self._bias(self._output(x))

    def _bias(self, logits: np.ndarray) -> np.ndarray:
        """The output bias added (when the file has one), and the architecture's last step (finish_logits)."""
        logits = logits if self._output_bias is None else logits + self._output_bias
        finish = self._arch.finish_logits
        return logits if finish is None else finish(logits, self.hparams)

    def _run_steps(self, tokens: list[int], batch: Batch) -> np.ndarray:
        """One pass of single-token steps of several sequences (batch: one row each); logits [B, n_vocab]."""
        def run() -> np.ndarray:
            for _, start, cache in batch.seqs:
                cache.reserve(start + 1)
                cache.place(start, 1)
            x = self._embedding.lookup(np.asarray(tokens, dtype=np.intp))
            if self._scale is not None:
                x *= np.float32(self._scale)
            head = self._stack is not None and self._stack.n_vocab is not None
            if batch.ready is not None:  # prepared: the batcher wakes the last pass's askers now
                batch.ready()
            logits = self._stack.logits(x, batch) if head else None  # type: ignore[union-attr]
            batch.tokens = np.asarray(tokens, dtype=np.intp)
            if not head:
                x = self._blocks(x, batch)
            for token, (_, start, cache) in zip(tokens, batch.seqs, strict=True):
                cache.ids[start:] = [token]
            return self._finite(self._bias(logits) if head else
                                self._logits(rmsnorm(x, self._output_norm, self.hparams.eps)))

        if self._step_auto is not None:  # a kind per row count: a pass of 4 steps costs 2.5 times one of 1
            return self._step_auto.run(1, run, f"{len(tokens)} steps")
        return limited(self.threads, run, self._native, self._blas)  # type: ignore[arg-type]


class Session:
    """One sequence on a Model: its own KV cache, so threads can each drive a session of one loaded model at once.

    The model's weights are only read; everything a step writes is the session's (its cache, its thread timings).
    n_ctx caps the context below the model's (None: the model's).
    """

    def __init__(self, model: Model, n_ctx: int | None = None, batched: bool = False) -> None:
        if n_ctx is not None and not 0 < n_ctx:
            raise ArgumentError(f"expected n_ctx of at least 1, found {n_ctx}")
        self.model = model
        #: Most tokens this session's sequence may hold.
        self.n_ctx = model.n_ctx if n_ctx is None else min(int(n_ctx), model.n_ctx)
        self._auto = model._new_auto()
        self._cache = model._new_cache(self.n_ctx)
        self.batched = batched  # single-token steps through model.batcher, with other sessions' steps
        # (the step queued ahead by the last next_token's pass, the sampler it picks with) or None
        self._ahead: tuple[Step, Sampler] | None = None
        #: Positions the last next_token ran through the model (the rest came from the cache).
        self.evaluated = 0

    @property
    def n_vocab(self) -> int:
        """Number of tokens the model scores."""
        return self.model.n_vocab

    def logits_next(self, ids: Sequence[int]) -> np.ndarray:
        """Scores [n_vocab] of the token after ids; reuses the cache for the prefix ids share with the last call."""
        return self._next(ids, None)  # type: ignore[return-value]

    @property
    def runs_ahead(self) -> bool:
        """Whether next_token takes `ahead` (a batched session's steps can be queued before they are asked for)."""
        return self.batched

    def next_token(self, ids: Sequence[int], sampler: Sampler, *, ahead: int = 0,
                   stop: Callable[[int], bool] | None = None) -> int:
        """The sampler's choice of the token after ids (the LanguageModel protocol). A batched session's step is
        picked by the thread that ran the step's pass, right after it (StepBatcher.step's pick).

        ahead > 0 (a batched session): the caller will then ask for up to `ahead` more tokens, each after the ids
        plus the last choice, with this sampler left as it is (no constraint, no penalties, no logprobs: nothing
        it changes between draws), stopping at a choice for which stop(id) is true. Each next step then starts as
        soon as this one's pass ends, while the caller handles this token; the choices are the same."""
        if self.batched:
            return self._next(ids, sampler.sample_logits, ahead, stop, sampler)  # type: ignore[return-value]
        return sampler.sample_logits(self.logits_next(ids))

    def _next(self, ids: Sequence[int], pick: Callable[[np.ndarray], int] | None, ahead: int = 0,
              stop: Callable[[int], bool] | None = None, sampler: Sampler | None = None) -> np.ndarray | int:
        """logits_next's scores, or pick(scores)."""
        queued = self._ahead
        if queued is not None:
            self._ahead = None
            step, by = queued
            n = step.start
            if (sampler is not None and by is sampler and len(ids) == n + 1 and ids[-1] == step.token
                    and list(ids[:n]) == self._cache.ids[:n]):  # the step queued for these ids: its choice
                done = self.model.batcher.take(step)
                self.evaluated = 1
                if done.follow is not None:
                    self._ahead = (done.follow, sampler)
                return done.chosen
            self.model.batcher.settle(step)  # asked for something else: the cache is this thread's again
        ids = self.model._check(ids, self.n_ctx)
        cache = self._cache
        same = 0
        for a, b in zip(cache.ids, ids, strict=False):
            if a != b:
                break
            same += 1
        same = min(same, len(ids) - 1)  # always run at least the last token, for its logits
        cache.truncate(same)
        same = cache.n  # a recurrent state goes back only to a checkpoint at or before `same`
        self.evaluated = len(ids) - same
        if self.batched and self.evaluated == 1:
            done = self.model.batcher.run(self, ids[-1], same, cache, pick, ahead if sampler is not None else 0, stop)
            if done.follow is not None and sampler is not None:
                self._ahead = (done.follow, sampler)
            assert done.logits is not None
            return done.logits if pick is None else done.chosen
        logits = self.model._forward(ids[same:], same, cache, last_only=True, auto=self._auto)[-1]
        return logits if pick is None else pick(logits)

    def _settle(self) -> None:
        """Wait for a step queued ahead, if one is (its pass writes the cache), and queue no more."""
        queued, self._ahead = self._ahead, None
        if queued is not None:
            self.model.batcher.settle(queued[0])

    @property
    def can_shift(self) -> bool:
        """Whether shift_context works here (Model.can_shift at this session's context): the C blocks rotate the
        cached keys as llama.cpp does; llama.cpp cannot shift a recurrent state, nor a sliding-window cache smaller
        than the context."""
        return self.model.can_shift(self.n_ctx)

    def shift_context(self, n_keep: int, n_discard: int) -> None:
        """llama-server's context shift (--context-shift) of this session's sequence: its cached positions
        n_keep..n_keep+n_discard-1 removed, the later ones moved back by n_discard with their keys rotated, as
        llama.cpp's seq_rm, seq_add and K shift do; the next call continues from the shorter sequence (the ids
        without those). UnsupportedError where can_shift is False."""
        if not self.can_shift:
            raise UnsupportedError(f"context shift needs an architecture model.c runs (on the native backend, its C "
                                   f"blocks in use), a cache of keys and values only and a sliding-window cache as "
                                   f"large as the context ({self.n_ctx} positions here); this session has not all "
                                   f"three")
        self._settle()
        stack = self.model._stack
        self._cache.shift(n_keep, n_discard, stack.rope_shift if stack is not None else self.model._rope_shift)

    def reset(self) -> None:
        """Forget the cached sequence (and free the cache's memory)."""
        self._settle()
        self._cache = self.model._new_cache(self.n_ctx)

    @property
    def cached_ids(self) -> list[int]:
        """The ids whose keys and values the cache holds (the next call reuses the prefix it shares with them)."""
        self._settle()
        return self._cache.ids

    def export_prefix(self, n: int | None = None) -> Prefix:
        """A copy of the first n cached positions (all: None), for another session of this model to import."""
        self._settle()
        return self._cache.export(n)

    def import_prefix(self, prefix: Prefix) -> None:
        """Replace the cache by prefix (from export_prefix on a session of this model): the next call reuses it
        exactly as if this session had computed it."""
        self._settle()
        self._cache.load(prefix)


def _core_of(layers: list[dict[str, Any]]) -> ModuleType | None:
    """The native core the first block's quantized matrices multiply with (None: none are quantized views)."""
    for v in layers[0].values() if layers else ():
        for p in v.parts if isinstance(v, _Joined) else [v]:
            if isinstance(p, QuantLinear):
                return p._core
    return None


def _rank_head_spec(w: Weights, arch: str) -> list[TensorSpec]:
    """[the rank head's spec] when the file has RANK_HEAD's tensor for arch (n_cls_out outputs: the length of
    {arch}.classifier.output_labels, else 1, as llama.cpp reads it), else []; a file with such a tensor for an
    architecture whose loader does not take it is refused later, as an unused tensor."""
    name = RANK_HEAD.get(arch)
    if name is None or not w.has(name):
        return []
    labels = w.gguf.metadata.get(f"{arch}.classifier.output_labels")
    n_cls = len(labels) if isinstance(labels, list | tuple) and labels else 1
    return [(name, ("n_embd", n_cls))]


def _block_fields(arch: ArchSpec, w: Weights, hp: HParams, il: int) -> list[tuple[str, TensorSpec]]:
    """Block il's tensors as (field, spec): the required ones, in the q/k/v layout the file uses (llama.cpp's
    create_tensor_qkv takes attn_qkv when the block has it, else attn_q/k/v), and the optional ones it has."""
    if arch.block_tensors is not None:
        required, optional = (dict(m) for m in arch.block_tensors(hp, il))
    else:
        required, optional = dict(arch.layer_tensors), dict(arch.optional_tensors)
    separate = (llama.SEPARATE_QKV, llama.QKV_BIASES)
    fused = (llama.FUSED_QKV, llama.FUSED_QKV_BIAS)
    fused_here = w.has(w.spec(llama.FUSED_QKV["wqkv"], hp, il)[0])
    if fused_here and "wq" in required:
        required, optional = _swap(required, optional, separate, fused)
    elif not fused_here and "wqkv" in required and w.has(w.spec(llama.SEPARATE_QKV["wq"], hp, il)[0]):
        required, optional = _swap(required, optional, fused, separate)
    return list(required.items()) + [(f, spec) for f, spec in optional.items() if w.has(w.spec(spec, hp, il)[0])]


Layout = tuple[dict[str, TensorSpec], dict[str, TensorSpec]]  # q/k/v matrices, their optional biases


def _swap(required: dict[str, TensorSpec], optional: dict[str, TensorSpec], old: Layout,
          new: Layout) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """required with the q/k/v matrices of layout old replaced, in place, by those of new; optional with old's
    biases replaced by new's when the architecture takes q/k/v biases at all."""
    at = list(required).index(next(iter(old[0])))
    kept = [item for item in required.items() if item[0] not in old[0]]
    required = dict(kept[:at] + list(new[0].items()) + kept[at:])
    if old[1].keys() & optional.keys():
        optional = {**{f: spec for f, spec in optional.items() if f not in old[1]}, **new[1]}
    return required, optional


def _refuse_unused(w: Weights, used: set[str], arch: str) -> None:
    """FormatError naming the file's first tensor the forward pass does not use: llama.cpp refuses such a file
    ("wrong number of tensors"), so minillama accepts and refuses the same files rather than run a model whose
    extra tensor may change what it computes."""
    extra = [t.name for t in w.gguf.tensors if t.name not in used]
    if extra:
        raise FormatError(f"tensor {extra[0]} is not part of a {arch} model ({len(extra)} such tensor"
                          f"{'s' if len(extra) > 1 else ''} in the file); expected only the tensors {arch} uses, "
                          "as llama.cpp requires (it refuses the file: wrong number of tensors)", path=w.path,
                          key=extra[0])


def _check_kv_split(kv_split: int | None, threads: Threads) -> int:
    """kv_split as the C blocks take it: given, else threads when a number, else DEFAULT_THREADS."""
    if kv_split is None:
        return threads if isinstance(threads, int) else DEFAULT_THREADS
    if isinstance(kv_split, bool) or not isinstance(kv_split, int) or not 1 <= kv_split <= 4096:
        raise ArgumentError(f"expected kv_split of 1 to 4096 (llama.cpp's thread count), found {kv_split!r}")
    return kv_split


def _check_threads(threads: Threads) -> Threads:
    """threads as Model uses it: "auto", None, or a count capped at the usable cores; ArgumentError otherwise."""
    if threads is None or threads == AUTO:
        return threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ArgumentError(f"expected threads of at least 1, \"auto\" or None, found {threads!r}")
    return min(threads, usable_cores())
