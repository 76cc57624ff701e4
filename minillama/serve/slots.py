"""The server's slot pool: --parallel N slots, each a worker thread, and N sessions (each its own KV cache).

A request takes the first free slot, or waits for one in arrival order (an asyncio queue of free slots), and
runs in that slot's thread; its first model call claims the idle session whose cache holds the longest prefix of
its prompt, as llama-server chooses its slot by prompt similarity (prompt_cache.py, with the RAM cache of
evicted prefixes), so a conversation's next turn finds its earlier turns cached whichever slot is free. Each
request runs in its own thread, so one long reply never stalls a short one in another slot: the event loop only
passes chunks along, and the forward pass spends its time in C (the native backend's blocks and kernels) or
numpy's BLAS (the pure backend), both with the GIL released. With more than one slot the slots' single-token
steps run as one pass (minillama/model/batch.py's StepBatcher, in the C blocks on the native backend). A
streamed reply hands its chunks to the loop one at a time; when the client goes away the consumer sets the slot's
cancel flag and calls the stream's cancel() (minillama.api.Stream: no model step starts after it), the worker stops
after the token it is computing and closes the stream, and the slot is free again. The slot is freed when its
worker ends, not when the client has read everything: chunks a client has not read yet wait in the stream's
queue (at most one reply), so a client that stops reading holds no slot (the server's write timeout ends its
connection: minillama/serve/guard.py). A non-streamed reply is
watched too: call() asks every quarter second whether its client is still there, and when it is gone sets the
cancel flag, which the slot's session checks before each model step (the run ends with ClientGone).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .prompt_cache import Caches

__all__ = ["ClientGone", "Slot", "SlotPool"]

R = TypeVar("R")
_END = object()  # the worker's last item on a stream's queue
WATCH_SECONDS = 0.25  # how often a non-streamed call asks whether its client is still there


class ClientGone(Exception):
    """The client of a non-streamed request left: its run stopped before the next model step."""


class _Watched:
    """What a slot's run sees as its session: the first model call picks the KV cache it runs on (the idle one
    holding the longest prefix of its prompt, prompt_cache.Caches), no model step starts once the slot's cancel
    flag is set, and the run's counts and times are kept for llama-server's `timings` and the request log."""

    def __init__(self, caches: Caches, cancel: threading.Event) -> None:
        self._caches = caches
        self._cancel = cancel
        self._session: Any = None  # claimed on the first model call
        self.prompt_n = 0  # the prompt's ids (the first call's)
        self.cache_n = 0  # of those, the ones the cache held
        self.predicted_n = 0  # model calls: generated tokens
        self.prompt_s = 0.0  # the first call: the prompt's pass and the first token
        self.predicted_s = 0.0  # the calls after it
        self.generation: Any = None  # the run's Generation (Llama.run sets it)

    def check(self) -> None:
        """ClientGone once the slot's cancel flag is set: work that is not model steps (embeddings) calls it."""
        if self._cancel.is_set():
            raise ClientGone("the client left before the reply was complete")

    def _call(self, name: str, ids: Sequence[int], *args: Any) -> Any:
        self.check()
        start = time.perf_counter()
        if self._session is None:
            self._session = self._caches.claim([int(i) for i in ids])
        out = getattr(self._session, name)(ids, *args)
        took = time.perf_counter() - start
        self.predicted_n += 1
        if self.predicted_n == 1:
            self.prompt_n = len(ids)
            self.cache_n = len(ids) - self._session.evaluated
            self.prompt_s = took
        else:
            self.predicted_s += took
        return out

    def next_token(self, ids: Sequence[int], *args: Any) -> Any:
        return self._call("next_token", ids, *args)

    def logits_next(self, ids: Sequence[int]) -> Any:
        return self._call("logits_next", ids)

    def release(self) -> None:
        """Give the claimed cache back (the run is over)."""
        if self._session is not None:
            self._caches.release(self._session)
            self._session = None

    def timings(self) -> dict[str, Any]:
        """llama-server's `timings` of the run: the prompt's tokens computed (cache_n: those the cache held) and
        the generated ones, each with milliseconds, milliseconds per token and tokens per second."""
        prompt_n = self.prompt_n - self.cache_n
        prompt_ms, predicted_ms = 1000 * self.prompt_s, 1000 * self.predicted_s
        return {"cache_n": self.cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
                "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
                "predicted_n": self.predicted_n, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / self.predicted_n if self.predicted_n else 0.0,
                "predicted_per_second": 1000 * self.predicted_n / predicted_ms if predicted_ms else 0.0}

    def __getattr__(self, name: str) -> Any:
        # n_ctx, n_vocab, model, evaluated...: the same on every session until one is claimed
        return getattr(self._session if self._session is not None else self._caches.sessions[0], name)


@dataclass(eq=False)
class Slot:
    """One of the pool's N places to run a request: a thread of its own and a session with its own KV cache."""

    id: int
    executor: ThreadPoolExecutor
    task: str = ""  # what it runs now ("" when idle), for /slots
    cancel: threading.Event = field(default_factory=threading.Event)
    items: Any = None  # the iterator the slot's thread drives now (a stream), for its cancel()
    run: _Watched | None = None  # what the request running now sees as its session

    @property
    def session(self) -> Any:
        """The KV cache (session) the running request claimed, if any."""
        return None if self.run is None else self.run._session


class SlotPool:
    """N slots, each with a session made by make_session(); call() and stream() run work in a free slot, waiting
    for one in turn, on the idle session that holds the longest prefix of the request's prompt (prompt_cache.py).
    cache_bytes: the most bytes of evicted prefixes kept in RAM for any slot to restore (0: none)."""

    def __init__(self, make_session: Callable[[], Any], n: int, cache_bytes: int = 0) -> None:
        self.caches = Caches([make_session() for _ in range(n)], cache_bytes)
        self.slots = [Slot(i, ThreadPoolExecutor(1, thread_name_prefix=f"minillama-slot-{i}")) for i in range(n)]
        self._free: asyncio.Queue[Slot] | None = None
        self.waiting = 0  # requests queued for a slot

    def _queue(self) -> asyncio.Queue[Slot]:
        if self._free is None:  # made on first use, inside the server's event loop
            self._free = asyncio.Queue()
            for slot in self.slots:
                self._free.put_nowait(slot)
        return self._free

    async def _acquire(self, task: str) -> Slot:
        self.waiting += 1
        try:
            slot = await self._queue().get()
        finally:
            self.waiting -= 1
        slot.task = task
        slot.cancel.clear()
        slot.run = _Watched(self.caches, slot.cancel)
        return slot

    def _release(self, slot: Slot) -> None:
        if slot.run is not None:
            slot.run.release()
        slot.task = ""
        self._queue().put_nowait(slot)

    @property
    def busy(self) -> int:
        """Slots running a request now."""
        return sum(1 for s in self.slots if s.task)

    def status(self) -> list[dict[str, Any]]:
        """llama.cpp's GET /slots, in short: each slot's id, whether it is processing and what."""
        return [{"id": s.id, "is_processing": bool(s.task), "task": s.task} for s in self.slots]

    async def call(self, task: str, fn: Callable[[Any], R],
                   gone: Callable[[], Awaitable[bool]] | None = None) -> R:
        """fn(session) in a free slot's thread; its result (or its exception). With gone (the request's
        is_disconnected), a client that leaves stops the run before its next model step (ClientGone)."""
        slot = await self._acquire(task)
        try:
            future = asyncio.wrap_future(slot.executor.submit(fn, slot.run))
            while gone is not None:
                done, _ = await asyncio.wait({future}, timeout=WATCH_SECONDS)
                if done:
                    break
                if await gone():
                    slot.cancel.set()
                    break
            return await future
        finally:
            self._release(slot)

    async def stream(self, task: str, fn: Callable[[Any], Iterator[R]]) -> AsyncIterator[R]:
        """The items of fn(session), produced in a free slot's thread, as they come.

        The iterator is created and driven in the slot's thread; closing this async iterator early (the
        client left) cancels it: the worker stops after the current item and closes it, freeing the slot.
        An exception in the worker is raised here.
        """
        slot = await self._acquire(task)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone (server shutting down): nobody is listening
                pass

        def work() -> None:
            items = None
            try:
                items = slot.items = fn(slot.run)
                if slot.cancel.is_set():  # the client left while the stream was being set up
                    return
                for item in items:
                    if slot.cancel.is_set():
                        break
                    put(item)
            except BaseException as exc:  # handed to the consumer, who raises it
                put(_Failure(exc))
            finally:
                slot.items = None
                close = getattr(items, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:  # noqa: BLE001 - closing a finished or broken generator
                        pass
                put(_END)

        done = loop.run_in_executor(slot.executor, work)
        # the slot is free when the worker ends, whether or not the client has read the items (they wait here)
        done.add_done_callback(lambda _: self._release(slot))
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            if not done.done():  # still running (a done worker's slot may already run another request)
                slot.cancel.set()  # it stops after the current item
                cancel = getattr(slot.items, "cancel", None)  # the API's Stream: no model step starts after this
                if cancel is not None:
                    cancel()

    def close(self) -> None:
        """Cancel what runs and stop the worker threads (at server shutdown)."""
        for slot in self.slots:
            slot.cancel.set()
            slot.executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Failure:
    """An exception raised in a worker, carried to the consumer."""

    exc: BaseException
