"""One forward pass over the rows of several sequences, and the rendezvous that makes concurrent steps one pass.

A Batch says which rows of x belong to which sequence: each sequence has its first row, its first position and
its own KV cache. Everything in a block but attention works row by row, so the rows of all sequences go
through each weight matrix in one matmul (a single-token step reads every weight once; four sequences stepping
together read them once instead of four times). Attention runs per sequence, on its own cache.

StepBatcher: sessions on several threads each ask for a single-token step; whichever thread finds no pass
running takes every step asked for so far and runs them as one Batch, the others wait for their rows. While a
pass runs, new steps queue up for the next one (continuous batching, as llama-server's slots share a decode).
Asked with the session's sampler (Session.next_token), a step gets its token rather than its logits: the thread
that ran the pass picks every step's token right after it, before the others wake. On the native backend the pass
runs in the C blocks (minillama/model/stack.py, model.c): each weight matrix
goes through the rows kernels once for all the rows, and a step's logits are exactly those of the same step
alone. On the pure backend the Python blocks run it with numpy's BLAS, and a step's logits can differ from a lone
step's in the last bits of float32 (BLAS sums a matrix product in another order than a matrix-vector product);
a sequence alone gives exactly the unbatched result.

What a pass of B steps costs (SmolLM2 Q4_1, one thread, CPU per generated token, tools/bench/bench_batch.py):
native 18 ms alone, 14 ms two to a pass, 10 ms four, 9 ms eight (the quantized kernels do most of their work per
activation row, so four rows cost about twice one); pure 45 ms alone, 58 ms two to a pass, 30 ms four, 17 ms
eight (numpy's OpenBLAS multiplies a matrix by 2-3 rows far more slowly than by one: sgemm's small-M path).
Sessions stepping apart on threads can use a core each, so sessions are not batched unless asked
(Model.session(batched=True), Llama(batch_steps=True): a server with --parallel above 1).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from .cache import KVCache
from .layers import attention

__all__ = ["Batch", "StepBatcher"]

#: The longest a step waits for the other generating sessions' steps, as a share of the last pass's time: sampling
#: between two steps takes a fraction of a step, on a quiet machine or a busy one alike. Measured with 4 sessions
#: streaming 48 tokens each on SmolLM2, native backend: 0.5 keeps 46-47 of 48 passes at 4 steps, 12-14 ms CPU per
#: token; 0 (no wait) splits them (mostly 1-3 steps a pass) at 15-18 ms.
WAIT_SHARE = 0.5


@dataclass
class Batch:
    """Rows of one pass: seqs[i] = (first row, first position, cache), rows in order; positions of every row."""

    seqs: list[tuple[int, int, KVCache]]
    positions: np.ndarray
    #: The token ids of the rows, for blocks that read more than the embedding of each (gemma4's per-layer
    #: embeddings); None when the caller did not give them.
    tokens: np.ndarray | None = None
    #: The native core whose attention (ma_attend_seq: llama.cpp's flash attention, float16 cache) the Python blocks
    #: use on the native backend, with llama.cpp's thread count for its split-KV path; None: numpy's (the pure
    #: backend, whose float32 attention is the reference, not llama.cpp's bits).
    core: ModuleType | None = None
    kv_split: int = 1
    #: The rows whose outputs the caller keeps (llama.cpp's inp_out_ids), or None: every row. Blocks that mirror
    #: llama.cpp's graph take the last layer's feed-forward on these rows alone, as it does (a float32 router or
    #: gate multiplied for one row sums in ggml_vec_dot_f32's order, for several in tinyBLAS's).
    out_rows: np.ndarray | None = None

    @classmethod
    def single(cls, start: int, n: int, cache: KVCache) -> Batch:
        """n rows of one sequence at positions start..start+n-1."""
        return cls([(0, start, cache)], np.arange(start, start + n))

    @classmethod
    def steps(cls, starts: list[int], caches: list[KVCache]) -> Batch:
        """One row per sequence: sequence i's token at position starts[i]."""
        return cls([(i, s, c) for i, (s, c) in enumerate(zip(starts, caches, strict=True))], np.asarray(starts))

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
               window: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
        """Store each sequence's k, v [T_i, Hkv, D] in its cache and attend its q rows to its cache; [T, H * Dv].
        sinks: per-head sink logits (layers.attention)."""
        out: list[np.ndarray] = []
        ends = [row for row, _, _ in self.seqs[1:]] + [q.shape[0]]
        for (row, start, cache), end in zip(self.seqs, ends, strict=True):
            keys, values = cache.store(layer, start, k[row:end], v[row:end])
            out.append(self._attention(q[row:end], keys, values, start, scale, window, sinks, cache.cells(window)))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _attention(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, scale: float,
                   window: int, sinks: np.ndarray | None = None, cells: np.ndarray | None = None) -> np.ndarray:
        """One sequence's rows q [n, H, D] at positions start.. over its cached keys and values [start + n, ...]:
        in C as the C blocks attend (core given, a float16 cache; cells: its cell order, KVCache.cells), else
        layers.attention; [n, H * Dv]."""
        n, h, d = q.shape
        if self.core is not None and keys.dtype == np.float16:
            _, hkv, dv = values.shape
            out = np.empty((n, h * dv), np.float32)
            self.core.attend(np.ascontiguousarray(q, dtype=np.float32), keys, values, out, (n, h, hkv, d, dv),
                             start, window, scale, len(self.positions), self.kv_split,
                             None if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32), cells)
            return out
        return attention(q, keys, values, np.arange(start, start + n), np.arange(start + n), scale, window, sinks)

    def attend_cached(self, layer: int, q: np.ndarray, scale: float, window: int = 0) -> np.ndarray:
        """Attend each sequence's q rows to the keys and values an earlier block of this pass stored for `layer`
        (up to and including these rows), storing none: a block that shares another's cache (gemma4)."""
        out: list[np.ndarray] = []
        ends = [row for row, _, _ in self.seqs[1:]] + [q.shape[0]]
        for (row, start, cache), end in zip(self.seqs, ends, strict=True):
            n = end - row
            keys, values = cache.k[layer][:start + n], cache.v[layer][:start + n]
            out.append(self._attention(q[row:end], keys, values, start, scale, window, None, cache.cells(window)))
        return out[0] if len(out) == 1 else np.concatenate(out)


@dataclass(eq=False)
class _Step:
    key: object  # the session asking
    token: int
    start: int
    cache: KVCache
    pick: Callable[[np.ndarray], int] | None = None  # the asker's sampler, run by the pass's leader
    done: bool = False
    logits: np.ndarray | None = None
    chosen: int = 0  # pick(logits), when pick was given
    error: BaseException | None = None


@dataclass(eq=False)
class StepBatcher:
    """Single-token steps asked for at once, from any threads, run as one pass: run(Batch, tokens) -> logits."""

    run_batch: Callable[[list[int], Batch], np.ndarray]
    #: How many sessions are generating now (a server sets its busy slots): a step that finds no pass running
    #: waits for that many steps, at most WAIT_SHARE of the last pass's time, so the sessions stay in one batch
    #: rather than splitting into alternating smaller ones. Default: one, no waiting.
    expected: Callable[[], int] = lambda: 1
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[_Step] = field(default_factory=list)
    _busy: bool = False
    _last_pass: float = 0.0

    def step(self, key: object, token: int, start: int, cache: KVCache,
             pick: Callable[[np.ndarray], int] | None = None) -> np.ndarray | int:
        """The logits [n_vocab] after token at position start of the sequence in cache (extending the cache), or
        with pick (a sampler's sample_logits) pick(logits), which the thread that ran the pass computes for every
        step of it before waking the others: their samplers run back to back rather than in threads that all wake
        at once and pass the GIL to and fro (four sessions' picks took 1.5 ms each that way, 0.2 ms alone)."""
        me = _Step(key, token, start, cache, pick)
        with self._cond:
            self._pending.append(me)
            self._cond.notify_all()
            deadline = None  # counted from when this step could lead, not from when it queued behind a pass
            while not me.done:
                if self._busy:
                    self._cond.wait()
                    continue
                if deadline is None:
                    deadline = time.monotonic() + WAIT_SHARE * self._last_pass
                left = deadline - time.monotonic()
                if len(self._pending) < self.expected() and left > 0:  # the others are sampling: wait for them
                    self._cond.wait(left)
                    continue
                batch, self._pending, self._busy = self._pending, [], True  # run every step asked for so far
                break
        if not me.done:
            began = time.perf_counter()
            try:
                logits = self.run_batch([s.token for s in batch],
                                        Batch.steps([s.start for s in batch], [s.cache for s in batch]))
                for s, row in zip(batch, logits, strict=True):
                    s.logits = row
            except BaseException as e:  # every waiting step hears of it, then it goes on in this thread
                for s in batch:
                    s.error = e
            else:
                for s in batch:  # a sampler's error (NaN scores) is its own step's
                    if s.pick is not None:
                        try:
                            s.chosen = s.pick(s.logits)
                        except BaseException as e:  # noqa: BLE001 - raised in the asking thread
                            s.error = e
            finally:
                with self._cond:
                    for s in batch:
                        s.done = True
                    self._busy = False
                    self._last_pass = time.perf_counter() - began
                    self._cond.notify_all()
        if me.error is not None:
            raise me.error
        assert me.logits is not None
        return me.logits if pick is None else me.chosen
