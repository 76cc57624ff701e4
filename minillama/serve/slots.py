"""The server's slot pool: --parallel N slots, each a worker thread with its own session (its own KV cache).

A request takes the first free slot, or waits for one in arrival order (an asyncio queue of free slots), and
runs in that slot's thread, so one long reply never stalls a short one in another slot: the event loop only
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["ClientGone", "Slot", "SlotPool"]

R = TypeVar("R")
_END = object()  # the worker's last item on a stream's queue
WATCH_SECONDS = 0.25  # how often a non-streamed call asks whether its client is still there


class ClientGone(Exception):
    """The client of a non-streamed request left: its run stopped before the next model step."""


class _Watched:
    """A slot's session whose next model step does not start once the slot's cancel flag is set."""

    def __init__(self, session: Any, cancel: threading.Event) -> None:
        self._session = session
        self._cancel = cancel

    def check(self) -> None:
        """ClientGone once the slot's cancel flag is set: work that is not model steps (embeddings) calls it."""
        if self._cancel.is_set():
            raise ClientGone("the client left before the reply was complete")

    def next_token(self, *args: Any, **kwargs: Any) -> Any:
        self.check()
        return self._session.next_token(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@dataclass(eq=False)
class Slot:
    """One of the pool's N places to run a request: a thread of its own and a session with its own KV cache."""

    id: int
    session: Any
    executor: ThreadPoolExecutor
    task: str = ""  # what it runs now ("" when idle), for /slots
    cancel: threading.Event = field(default_factory=threading.Event)
    items: Any = None  # the iterator the slot's thread drives now (a stream), for its cancel()


class SlotPool:
    """N slots made by make_session(); call() and stream() run work in a free slot, waiting for one in turn."""

    def __init__(self, make_session: Callable[[], Any], n: int) -> None:
        self.slots = [Slot(i, make_session(), ThreadPoolExecutor(1, thread_name_prefix=f"minillama-slot-{i}"))
                      for i in range(n)]
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
        return slot

    def _release(self, slot: Slot) -> None:
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
            future = asyncio.wrap_future(slot.executor.submit(fn, _Watched(slot.session, slot.cancel)))
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
                items = slot.items = fn(slot.session)
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
