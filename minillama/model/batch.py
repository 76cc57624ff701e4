"""Batched decode steps across sessions: the single-token steps that several sessions (a server's slots, each in
its own thread) ask for at about the same time go through the model as one [B, d] pass.

A decode step is bound by reading the weights from memory (SmolLM2's are 540 MB as float32), so B rows cost about
what one row does: B sessions decoding together get up to B times the tokens per second of one. A session's
step joins the pending batch; the first thread to find no pass running leads: it waits up to `window` seconds for
the other busy sessions' steps to arrive (`busy()` says how many there are; none are waited for when it is one),
runs the pass for all that arrived and hands each its logits (the window grows with the time a pass takes). Prompt passes (more than one new token) and
architectures without a `blocks_step` (gemma3) run in their own session as before. The arithmetic is the
per-session step's (llama.blocks_step), row for row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import AUTO, DEFAULT_THREADS, Model, Session
from .cache import KVCache
from .layers import rmsnorm
from .threads import AutoThreads, limited

__all__ = ["DecodeBatcher", "BatchedSession"]

#: How long a leading step waits for the other busy sessions' steps (seconds) at least, and as a share of the last
#: pass's time: a sampling step between two decode steps takes about a millisecond on a quiet machine, a decode step
#: of a small model tens of them; on a busy machine both stretch alike, so the wait scales with the pass.
WINDOW = 0.004
WINDOW_SHARE = 0.5


@dataclass(eq=False)
class _Step:
    cache: KVCache
    token: int
    logits: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


class DecodeBatcher:
    """Groups the decode steps of its sessions (made by .session()) into one pass of the model."""

    def __init__(self, model: Model, busy: Callable[[], int] | None = None, window: float = WINDOW) -> None:
        self.model, self.window = model, window
        self._busy = busy or (lambda: 1)
        self._cv = threading.Condition()
        self._pending: list[_Step] = []
        self._running = False
        self._auto = AutoThreads(DEFAULT_THREADS) if model.threads == AUTO else None
        self._last_pass = 0.0  # seconds the last pass took
        #: Sizes of the batches run so far (count per size), e.g. for a benchmark's report.
        self.batches: dict[int, int] = {}

    @property
    def batches_enabled(self) -> bool:
        """True when the model's architecture has a batched step (llama does; gemma3 not yet)."""
        return hasattr(self.model._arch, "blocks_step") and hasattr(self.model._arch, "few_rows")

    def session(self, n_ctx: int | None = None) -> Session:
        """A session whose decode steps are batched with the other sessions' (a plain Session when they cannot)."""
        return BatchedSession(self, n_ctx) if self.batches_enabled else Session(self.model, n_ctx)

    def step(self, cache: KVCache, token: int) -> np.ndarray:
        """The logits [n_vocab] after token, appended at the end of cache, run in a batch with other steps."""
        mine = _Step(cache, token)
        with self._cv:
            self._pending.append(mine)
            self._cv.notify_all()
            deadline = time.monotonic() + max(self.window, WINDOW_SHARE * self._last_pass)
            while not mine.done:
                if self._running:
                    self._cv.wait()
                    continue
                left = deadline - time.monotonic()
                if len(self._pending) < self._busy() and left > 0:
                    self._cv.wait(left)
                    continue
                batch, self._pending, self._running = self._pending, [], True
                break
        if not mine.done:
            self._run(batch)
        if mine.error is not None:
            raise mine.error
        assert mine.logits is not None
        return mine.logits

    def _run(self, batch: list[_Step]) -> None:
        """One pass for the batch (outside the lock), then every step's result and the next leader's turn."""
        start = time.perf_counter()
        try:
            logits = self._pass([s.token for s in batch], [s.cache for s in batch])
            for s, row in zip(batch, logits):
                s.logits = row
        except BaseException as exc:  # every waiting step raises it, not only the leader's
            for s in batch:
                s.error = exc
        with self._cv:
            for s in batch:
                s.done = True
            self.batches[len(batch)] = self.batches.get(len(batch), 0) + 1
            self._last_pass = time.perf_counter() - start
            self._running = False
            self._cv.notify_all()

    def _pass(self, tokens: list[int], caches: list[KVCache]) -> np.ndarray:
        """The model's logits [B, n_vocab] for one new token per cache (llama.blocks_step)."""
        m = self.model
        starts = [c.n for c in caches]

        def run() -> np.ndarray:
            for cache, start in zip(caches, starts):
                cache.reserve(start + 1)
            x = m._embedding.lookup(np.asarray(tokens, dtype=np.intp))
            if m._scale is not None:
                x *= np.float32(m._scale)
            x = m._arch.blocks_step(x, m._layers, m.hparams, starts, caches)
            for cache, start, token in zip(caches, starts, tokens):
                cache.ids[start:] = [token]
            return m._arch.few_rows(m._output)(rmsnorm(x, m._output_norm, m.hparams.eps))

        if self._auto is not None:
            return self._auto.run(len(tokens), run)
        return limited(m.threads, run)  # type: ignore[arg-type]


class BatchedSession(Session):
    """A Session whose single-token steps go through its DecodeBatcher; prompt passes run as a Session's."""

    def __init__(self, batcher: DecodeBatcher, n_ctx: int | None = None) -> None:
        super().__init__(batcher.model, n_ctx)
        self._batcher = batcher

    def logits_next(self, ids: Sequence[int]) -> np.ndarray:
        """Scores [n_vocab] of the token after ids: batched when the cache holds all of ids but the last."""
        cached = self._cache.ids
        if len(ids) >= 2 and len(cached) == len(ids) - 1 and cached == list(ids[:-1]):
            ids = self.model._check(ids, self.n_ctx)
            self.evaluated = 1
            return self._batcher.step(self._cache, ids[-1])
        return super().logits_next(ids)
