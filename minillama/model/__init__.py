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
the architecture's blocks (one file per architecture: llama.py, gemma3.py, built from layers.py), apply
the final RMSNorm and multiply by the output matrix. On the native backend the weight matrices stay quantized in
the memory map and the C kernels multiply them (layers.QuantLinear); on the pure one they are dequantized to
float32 once, at load, so every step is a few BLAS matmuls. next_token keeps a key/value cache and reuses the longest prefix the new
ids share with the cached ones: a generated token costs one single-token step, a prompt one batched pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np

from ..embedding import Embedding
from ..errors import ArgumentError, ContextLengthError, UnsupportedError
from ..generate import Sampler
from . import gemma3, llama
from .cache import KVCache
from .layers import Linear, QuantLinear, rmsnorm
from .threads import AutoThreads, limited, usable_cores
from .weights import HParams, TensorSpec, Weights

__all__ = ["Model", "ARCHITECTURES"]

#: general.architecture -> the module that implements it (LAYER_TENSORS, prepare, embed_scale, blocks).
ARCHITECTURES: dict[str, ModuleType] = {"llama": llama, "gemma3": gemma3}

#: Tensors outside the blocks. output.weight is optional: without it the output matrix is the embedding (tied).
TOKEN_EMBD: TensorSpec = ("token_embd.weight", ("n_embd", "n_vocab"))
OUTPUT_NORM: TensorSpec = ("output_norm.weight", ("n_embd",))
OUTPUT: TensorSpec = ("output.weight", ("n_embd", "n_vocab"))

#: The most BLAS threads the default ("auto") uses: the cores this process may use, up to four, as llama.cpp uses
#: the cores. A single-token step is a string of matrix-vector products bound by memory bandwidth; a second core
#: reads it faster on a quiet machine (SmolLM2 16 -> 23 tokens/s, Gemma 3 9 -> 17 here), more than four gain
#: little on matrices this small. On a busy machine spinning BLAS threads are slower than one (5x seen here), so
#: "auto" times both and runs the faster (minillama/model/threads.py).
DEFAULT_THREADS = max(1, min(4, usable_cores()))

#: threads="auto": between 1 and DEFAULT_THREADS BLAS threads, whichever is faster now (AutoThreads).
AUTO = "auto"

Threads = int | Literal["auto"] | None

#: Most tokens one batched pass takes; longer inputs go in chunks of this many.
CHUNK = 256

#: Called during load with (weights dequantized so far, weights in all), e.g. to draw a progress bar.
Progress = Callable[[int, int], None]


class Model:
    """A GGUF model with weights, ready to score tokens: logits(ids) and next_token(ids, sampler)."""

    def __init__(self, path: str, hp: HParams, arch: ModuleType, embedding: Embedding,
                 layers: list[dict[str, Any]], output_norm: np.ndarray, output: Linear,
                 threads: Threads = AUTO) -> None:
        """Use from_file; this wires loaded weights together."""
        self.path, self.hparams, self._arch = path, hp, arch
        #: BLAS threads for the forward pass: "auto", a number (at most the usable cores), None (numpy's default).
        self.threads = _check_threads(threads)
        self._embedding, self._layers = embedding, layers
        #: The matrix products run in the native kernels (QuantLinear), not BLAS.
        self._native = isinstance(output, QuantLinear) or any(
            isinstance(v, QuantLinear) for layer in layers[:1] for v in layer.values())
        self._auto = AutoThreads(DEFAULT_THREADS, self._native) if self.threads == AUTO else None
        self._output_norm, self._output = output_norm, output
        self._scale = arch.embed_scale(hp)
        self._cache = self._new_cache()
        #: Positions the last next_token ran through the model (the rest came from the cache).
        self.evaluated = 0

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, progress: Progress | None = None,
                  threads: Threads = AUTO) -> Model:
        """Load a GGUF model: hyper-parameters from its metadata, every tensor checked (and, on the pure backend,
        dequantized).

        threads: how many BLAS threads the forward pass uses: "auto" (default) runs 1 or up to DEFAULT_THREADS,
        whichever its timings say is faster on this machine now; a number is used as given but capped at the
        cores this process may use (os.sched_getaffinity), since more only wait on each other; None leaves numpy's
        setting.
        """
        path = os.fspath(path)
        threads = _check_threads(threads)
        w = Weights(path)
        name = w.arch
        arch = ARCHITECTURES.get(name)
        if arch is None:
            raise UnsupportedError(f"{path}: architecture {name!r} is not supported; minillama runs "
                                   f"{', '.join(sorted(ARCHITECTURES))}")
        hp = w.hparams(name)
        # Check that every tensor is there with its shape before the slow part.
        out_spec = OUTPUT if w.has(OUTPUT[0]) else TOKEN_EMBD
        specs = [(spec, il) for il in range(hp.n_layer) for spec in arch.LAYER_TENSORS.values()] + [(out_spec, None)]
        sizes = []
        for spec, il in specs:
            name_shape = w.spec(spec, hp, il)
            w.check(*name_shape)
            sizes.append(int(np.prod(name_shape[1])))
        embedding = w.embedding(*w.spec(TOKEN_EMBD, hp))
        output_norm = w.load(OUTPUT_NORM, hp)
        total, done = sum(sizes), 0
        loaded: list[Any] = []
        layers, n_fields = [], len(arch.LAYER_TENSORS)
        for (spec, il), size in zip(specs, sizes, strict=True):
            loaded.append(w.load(spec, hp, il))
            if len(loaded) == n_fields:  # a whole block: stack its matrices now, so the parts are freed at once
                layers.append(arch.prepare(dict(zip(arch.LAYER_TENSORS, loaded, strict=True))))
                loaded = []
            done += size
            if progress is not None:
                progress(done, total)
        output = loaded[-1]
        return cls(path, hp, arch, embedding, layers, output_norm, output, threads)

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

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        """The sampler's choice of the token after ids; reuses the cache for the prefix ids share with the last call."""
        ids = self._check(ids)
        cache = self._cache
        same = 0
        for a, b in zip(cache.ids, ids, strict=False):
            if a != b:
                break
            same += 1
        same = min(same, len(ids) - 1)  # always run at least the last token, for its logits
        cache.truncate(same)
        self.evaluated = len(ids) - same
        logits = self._forward(ids[same:], same, cache, last_only=True)
        return sampler.sample_logits(logits[-1])

    def reset(self) -> None:
        """Forget the cached sequence (and free the cache's memory)."""
        self._cache = self._new_cache()

    def _new_cache(self) -> KVCache:
        hp = self.hparams
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, hp.head_dim_v)

    def _check(self, ids: Sequence[int]) -> list[int]:
        """ids as a list of ints within the vocab and the context."""
        out = [int(i) for i in ids]
        if not out:
            raise ArgumentError("expected at least one token id (a prompt), got none")
        if len(out) > self.n_ctx:
            raise ContextLengthError(f"{len(out)} tokens do not fit the model's context of {self.n_ctx} tokens "
                                     f"({self.path})")
        bad = next((i for i in out if not 0 <= i < self.n_vocab), None)
        if bad is not None:
            raise ArgumentError(f"token id {bad} is out of range for this model (expected 0..{self.n_vocab - 1})")
        return out

    def _forward(self, ids: list[int], start: int, cache: KVCache, last_only: bool) -> np.ndarray:
        """Run ids (at positions start..) through the model, extending cache; logits of every (or the last) one.

        Long inputs go in chunks of CHUNK tokens, each attending to the cache, so attention scores stay
        [H, CHUNK, n] instead of [H, n, n].
        """
        def run() -> np.ndarray:
            return self._chunks(ids, start, cache, last_only)

        if self._auto is not None:
            return self._auto.run(len(ids), run)
        return limited(self.threads, run, self._native)  # type: ignore[arg-type]

    def _chunks(self, ids: list[int], start: int, cache: KVCache, last_only: bool) -> np.ndarray:
        cache.reserve(start + len(ids))
        out = [self._run(ids[i:i + CHUNK], start + i, cache, last_only) for i in range(0, len(ids), CHUNK)]
        return out[-1] if last_only else np.concatenate(out)

    def _run(self, ids: list[int], start: int, cache: KVCache, last_only: bool) -> np.ndarray:
        """One chunk of the forward pass: embedding, blocks, final norm, output matrix."""
        x = self._embedding.lookup(np.asarray(ids, dtype=np.intp))
        if self._scale is not None:
            x *= np.float32(self._scale)
        x = self._arch.blocks(x, self._layers, self.hparams, start, cache)
        cache.ids[start:] = ids
        if last_only:
            x = x[-1:]
        return self._output(rmsnorm(x, self._output_norm, self.hparams.eps))


def _check_threads(threads: Threads) -> Threads:
    """threads as Model uses it: "auto", None, or a count capped at the usable cores; ArgumentError otherwise."""
    if threads is None or threads == AUTO:
        return threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ArgumentError(f"expected threads of at least 1, \"auto\" or None, found {threads!r}")
    return min(threads, usable_cores())
