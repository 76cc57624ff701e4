"""One forward pass over the rows of several sequences, and the rendezvous that makes concurrent steps one pass.

A Batch says which rows of x belong to which sequence: each sequence has its first row, its first position and
its own KV cache. Everything in a block but attention works row by row, so the rows of all sequences go
through each weight matrix in one matmul (a single-token step reads every weight once; four sequences stepping
together read them once instead of four times). Attention runs per sequence, on its own cache.

StepBatcher: sessions on several threads each ask for a single-token step; the batcher's own thread takes every
step asked for so far and runs them as one Batch while the askers wait for their rows. While a pass runs, new
steps queue up for the next one (continuous batching, as llama-server's slots share a decode). Asked with the
session's sampler (Session.next_token), a step gets its token rather than its logits: the pass's thread picks
every step's token right after it, before the askers wake. Asked with `ahead` (a generation whose sampler nothing
changes between draws), the step after it is queued as soon as its token is picked, fed that token, so the next
pass starts at once rather than after the asker has handled its token (a server's streaming, stop checks and
event loop: ~0.9 ms of a 7-8 ms SmolLM2 step with one client, ~2 ms of a four-client pass), as llama-server's
decode loop does not wait for its HTTP threads. On the native backend the pass
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
    #: Called (by the pass) once its Python preparation is done, just before its long native or BLAS work:
    #: StepBatcher wakes the last pass's askers there, so their Python does not hold the GIL while this pass
    #: prepares (in a server, four askers and the event loop woke at once and stretched that to 0.6 ms).
    ready: Callable[[], None] | None = None

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
class Step:
    """One single-token step of a sequence, queued for a pass (StepBatcher.run, .take): its choice once done.

    ahead > 0 with pick: the asker will want up to `ahead` more steps, each fed the last one's choice, unless a
    choice is one `stop` says ends the run (an end-of-generation id); when this step's pass ends while its asker
    waits for it, the next of them (follow) is queued at once, so it runs while the asker handles this choice."""

    key: object  # the session asking
    token: int
    start: int
    cache: KVCache
    pick: Callable[[np.ndarray], int] | None = None  # the asker's sampler, run by the pass's thread
    ahead: int = 0
    stop: Callable[[int], bool] | None = None
    waited: bool = False  # the asker waits for it (only then is a follow-up queued: at most one step unasked for)
    follow: Step | None = None  # the step queued after it, fed its choice
    done: bool = False
    logits: np.ndarray | None = None
    chosen: int = 0  # pick(logits), when pick was given
    error: BaseException | None = None


#: Seconds the pass thread stays without work before it ends (the next step starts another): a model that is no
#: longer used is not kept alive by it.
IDLE_EXIT = 1.0


@dataclass(eq=False)
class StepBatcher:
    """Single-token steps asked for at once, from any threads, run as one pass: run(Batch, tokens) -> logits.

    The passes run in the batcher's own thread (started on the first step, ended after IDLE_EXIT idle seconds):
    askers only queue steps and wait for them, so a step queued ahead (Step.follow) starts as soon as the pass
    before it ends, without waiting for its asker to come back."""

    run_batch: Callable[[list[int], Batch], np.ndarray]
    #: How many sessions are generating now (a server sets its busy slots): a pass waits for that many steps, at
    #: most WAIT_SHARE of the last pass's time, so the sessions stay in one batch rather than splitting into
    #: alternating smaller ones. Default: one, no waiting.
    expected: Callable[[], int] = lambda: 1
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[Step] = field(default_factory=list)
    _runner: threading.Thread | None = None
    _batch: list[Step] = field(default_factory=list)  # the pass's steps (the pass thread's)
    _unwoken: bool = False  # steps are done whose askers were not woken yet
    _last_pass: float = 0.0

    def step(self, key: object, token: int, start: int, cache: KVCache,
             pick: Callable[[np.ndarray], int] | None = None) -> np.ndarray | int:
        """The logits [n_vocab] after token at position start of the sequence in cache (extending the cache), or
        with pick (a sampler's sample_logits) pick(logits), which the thread that ran the pass computes for every
        step of it before waking the askers: their samplers run back to back rather than in threads that all wake
        at once and pass the GIL to and fro (four sessions' picks took 1.5 ms each that way, 0.2 ms alone)."""
        done = self.run(key, token, start, cache, pick)
        assert done.logits is not None
        return done.logits if pick is None else done.chosen

    def run(self, key: object, token: int, start: int, cache: KVCache, pick: Callable[[np.ndarray], int] | None = None,
            ahead: int = 0, stop: Callable[[int], bool] | None = None) -> Step:
        """step()'s step, done (its error raised here), with `ahead` more queued after it one at a time (Step)."""
        me = Step(key, token, start, cache, pick, max(ahead, 0) if pick is not None else 0, stop, waited=True)
        with self._cond:
            self._pending.append(me)
            self._start()
            self._cond.notify_all()
        return self.take(me)

    def take(self, step: Step) -> Step:
        """step (a follow-up a finished step queued) once done, its error raised here; waiting for it lets the
        pass that ends it queue the next."""
        with self._cond:
            step.waited = True
            while not step.done:
                self._cond.wait()
        if step.error is not None:
            raise step.error
        return step

    def settle(self, step: Step) -> None:
        """Wait until step (a follow-up no one will take) is done, queuing none after it: its cache is then the
        asker's to change again."""
        with self._cond:
            while not step.done:
                self._cond.wait()

    def _start(self) -> None:
        """The pass thread, started if none runs (called holding _cond; after a fork the child has none)."""
        if self._runner is None or not self._runner.is_alive():
            self._runner = threading.Thread(target=self._passes, name="minillama-steps", daemon=True)
            self._runner.start()

    def _next_batch(self) -> list[Step] | None:
        """The steps of the next pass: every step queued, once as many as expected() are (or WAIT_SHARE of the
        last pass went by since the first could run); None after IDLE_EXIT seconds with none (the thread ends)."""
        with self._cond:
            deadline = None
            while True:
                if not self._pending:
                    deadline = None
                    self._wake_askers()
                    if not self._cond.wait(IDLE_EXIT) and not self._pending:
                        self._runner = None
                        return None
                    continue
                if deadline is None:
                    deadline = time.monotonic() + WAIT_SHARE * self._last_pass
                left = deadline - time.monotonic()
                if len(self._pending) < self.expected() and left > 0:  # the others are sampling: wait for them
                    self._wake_askers()
                    self._cond.wait(left)
                    continue
                self._batch, self._pending = self._pending, []
                return self._batch

    def _passes(self) -> None:
        """The pass thread: each batch run as one pass, every step's pick made right after it, the askers woken. Should
        anything else fail here (expected() raising), every queued step hears of it rather than waiting forever."""
        try:
            self._run_passes()
        except BaseException as e:  # noqa: BLE001 - handed to the askers, the thread ends
            with self._cond:
                for s in self._pending + self._batch:
                    if not s.done:
                        s.error, s.done = e, True
                self._pending, self._runner = [], None
                self._cond.notify_all()

    def _wake_askers(self) -> None:
        """Wake the askers of the steps done since the last wake (called holding _cond)."""
        if self._unwoken:
            self._unwoken = False
            self._cond.notify_all()

    def _ready(self) -> None:
        """Batch.ready: this pass is prepared; the last pass's askers may run now."""
        with self._cond:
            self._wake_askers()

    def _run_passes(self) -> None:
        while (batch := self._next_batch()) is not None:
            began = time.perf_counter()
            try:
                steps = Batch.steps([s.start for s in batch], [s.cache for s in batch])
                steps.ready = self._ready
                logits = self.run_batch([s.token for s in batch], steps)
                for s, row in zip(batch, logits, strict=True):
                    s.logits = row
            except BaseException as e:  # noqa: BLE001 - every step of the pass hears of it, in its asker's thread
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
                self._ready()  # a pass that never called it (or failed before it)
            goes_on = [False] * len(batch)  # a step after it may be queued (its choice does not end the run)
            for i, s in enumerate(batch):
                if s.error is None and s.ahead > 0:
                    try:
                        goes_on[i] = s.stop is None or not s.stop(s.chosen)
                    except BaseException as e:  # noqa: BLE001 - raised in the asking thread
                        s.error = e
            with self._cond:
                for s, more in zip(batch, goes_on, strict=True):
                    if more and s.waited:
                        s.follow = Step(s.key, s.chosen, s.start + 1, s.cache, s.pick, s.ahead - 1, s.stop)
                        self._pending.append(s.follow)
                    s.done = True
                self._last_pass = time.perf_counter() - began
                # the askers are woken once the next pass is prepared (Batch.ready), or now if none is ready
                self._unwoken = True
