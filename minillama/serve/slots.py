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
cancel flag and calls the stream's cancel() (minillama.api.Stream: no model step is asked for after it), the worker stops
after the token it is computing and closes the stream, and the slot is free again. The run's KV cache is given back
before the client can read the stream's end (a conversation's next turn, sent as soon as this one ended, finds it
idle); the slot is freed when its worker ends, not when the client has read everything: chunks a client has not
read yet wait in the stream's queue (at most one reply), so a client that stops reading holds no slot (the
server's write timeout ends its connection: minillama/serve/guard.py). A non-streamed reply is watched too: call()
asks every quarter second whether its client is still there, and when it is gone sets the cancel flag, which the
slot's session checks before each model step (the run ends with ClientGone).
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

__all__ = ["ClientGone", "Slot", "SlotPool", "valid_filename", "save_cache", "load_cache", "SLOT_FILE_FORMAT"]

R = TypeVar("R")
_END = object()  # the worker's last item on a stream's queue
WATCH_SECONDS = 0.25  # how often a non-streamed call asks whether its client is still there


class ClientGone(Exception):
    """The client of a non-streamed request left: its run stopped before the next model step."""


class _Watched:
    """What a slot's run sees as its session: the first model call picks the KV cache it runs on (the idle one
    holding the longest prefix of its prompt, prompt_cache.Caches), no model step is asked for once the slot's cancel
    flag is set, and the run's counts and times are kept for llama-server's `timings` and the request log."""

    def __init__(self, caches: Caches, cancel: threading.Event, busy: Callable[[], int] = lambda: 1) -> None:
        self._caches = caches
        self._cancel = cancel
        self._busy = busy  # the slots running now: llama-server's n_busy_slots_per_decode adds it up per call
        self.busy_sum = 0
        self.shown: dict[str, Any] | None = None  # llama.cpp's settings of the run, for /slots (the routes set it)
        self._session: Any = None  # claimed on the first model call
        self.ran_on: Any = None  # the session it ran on, once given back
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

    def _call(self, name: str, ids: Sequence[int], *args: Any, **kw: Any) -> Any:
        self.check()
        start = time.perf_counter()
        if self._session is None:
            self._session = self._caches.claim([int(i) for i in ids])
        out = getattr(self._session, name)(ids, *args, **kw)
        took = time.perf_counter() - start
        self.predicted_n += 1
        self.busy_sum += self._busy()
        if self.predicted_n == 1:
            self.prompt_n = len(ids)
            self.cache_n = len(ids) - self._session.evaluated
            self.prompt_s = took
        else:
            self.predicted_s += took
        return out

    def next_token(self, ids: Sequence[int], *args: Any, **kw: Any) -> Any:
        return self._call("next_token", ids, *args, **kw)

    def logits_next(self, ids: Sequence[int]) -> Any:
        return self._call("logits_next", ids)

    def release(self) -> None:
        """Give the claimed cache back (the run is over; ran_on keeps which it was)."""
        if self._session is not None:
            self.ran_on = self._session
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


@dataclass
class Metrics:
    """What llama-server's /metrics counts, over every finished run since the server started (the bucket: since
    the last scrape, for the throughput gauges)."""

    prompt_n: int = 0  # prompt tokens computed (not those the cache held)
    cache_n: int = 0  # prompt tokens the cache held
    prompt_s: float = 0.0
    predicted_n: int = 0
    predicted_s: float = 0.0
    n_decode: int = 0  # model calls
    busy_sum: int = 0  # slots running at each model call, added up
    n_tokens_max: int = 0  # the longest sequence a run held (prompt and reply)
    bucket: list[float] = field(default_factory=lambda: [0, 0.0, 0, 0.0])  # prompt n, s, predicted n, s

    def add(self, run: _Watched) -> None:
        """Count a finished run."""
        prompt_n = run.prompt_n - run.cache_n
        self.prompt_n += prompt_n
        self.cache_n += run.cache_n
        self.prompt_s += run.prompt_s
        self.predicted_n += run.predicted_n
        self.predicted_s += run.predicted_s
        self.n_decode += run.predicted_n
        self.busy_sum += run.busy_sum
        self.n_tokens_max = max(self.n_tokens_max, run.prompt_n + run.predicted_n - 1)
        for k, v in enumerate((prompt_n, run.prompt_s, run.predicted_n, run.predicted_s)):
            self.bucket[k] += v


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
        self.metrics = Metrics()
        self.tasks = 0  # requests run so far: a run's id_task
        #: each KV cache's last run: (its id_task, what it saw), for llama-server's /slots
        self.last: dict[int, tuple[int, _Watched]] = {}

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
        slot.run = _Watched(self.caches, slot.cancel, lambda: self.busy)
        return slot

    def _release(self, slot: Slot) -> None:
        run = slot.run
        if run is not None:
            run.release()
            if run.predicted_n and run.ran_on is not None:
                self.tasks += 1
                self.metrics.add(run)
                self.last[self.caches.sessions.index(run.ran_on)] = (self.tasks, run)
        slot.task = ""
        self._queue().put_nowait(slot)

    @property
    def busy(self) -> int:
        """Slots running a request now."""
        return sum(1 for s in self.slots if s.task)

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
        run = slot.run
        assert run is not None
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
                items = slot.items = fn(run)
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
                # the cache is free before the client can see the end: its next turn, sent on the last chunk, finds
                # this run's cache idle (not still claimed until the loop runs _release) and resumes from it
                run.release()
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
                cancel = getattr(slot.items, "cancel", None)  # the API's Stream: no model step is asked for after this
                if cancel is not None:
                    cancel()

    async def on_cache(self, task: str, k: int, fn: Callable[[Any], R],
                       gone: Callable[[], Awaitable[bool]] | None = None) -> R:
        """fn(KV cache k) in a free slot's thread once no request runs on that cache (llama-server defers a slot
        action on a busy slot the same way); the cache is held for fn alone."""
        def work(run: _Watched) -> R:
            while True:
                session = self.caches.take(k)
                if session is not None:
                    run._session = session  # given back when the slot is released
                    return fn(session)
                run.check()
                time.sleep(0.02)

        return await self.call(task, work, gone)

    def close(self) -> None:
        """Cancel what runs and stop the worker threads (at server shutdown)."""
        for slot in self.slots:
            slot.cancel.set()
            slot.executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Failure:
    """An exception raised in a worker, carried to the consumer."""

    exc: BaseException


#: The first array of a slot file (--slot-save-path): which layout the rest has.
SLOT_FILE_FORMAT = "minillama-slot-1"


def valid_filename(name: str) -> bool:
    """A slot file's name as llama.cpp's fs_validate_filename takes it: 1 to 255 bytes, no directory parts (no / or
    \\, no ..), no control or reserved characters (: * ? " < > |), no leading space nor trailing space or dot."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or 0xD800 <= c <= 0xDFFF or ch in ':*?"<>|/\\' \
                or c in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF):
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name)


def save_cache(session: Any, path: str) -> int:
    """Write session's KV cache to path (a NumPy .npz, uncompressed: `format` SLOT_FILE_FORMAT, `ids` int32, then
    `k0`.. and `v0`.. each layer's key and value rows, float as the cache keeps them), replacing it whole; the
    bytes written."""
    import os

    import numpy as np

    prefix = session.export_prefix()
    arrays = {"format": np.array(SLOT_FILE_FORMAT), "ids": np.array(prefix.ids, dtype=np.int32)}
    arrays.update({f"k{i}": k for i, k in enumerate(prefix.k)})
    arrays.update({f"v{i}": v for i, v in enumerate(prefix.v)})
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return os.path.getsize(path)


def load_cache(session: Any, path: str, n_vocab: int, n_ctx: int) -> tuple[int, int]:
    """Replace session's KV cache by the one save_cache wrote to path: (positions restored, bytes read). ValueError
    saying why for a file that is not one (another format, ids past the vocab or the context, rows that do not
    match the ids, or another model's layers and sizes); OSError when it cannot be read."""
    import os
    import zipfile

    import numpy as np

    from ..errors import MinillamaError
    from ..model.cache import Prefix

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"expected a slot file ({SLOT_FILE_FORMAT}), found one that does not load: {exc}") from None
    fmt = arrays.get("format")
    if fmt is None or fmt.shape != () or str(fmt) != SLOT_FILE_FORMAT:
        raise ValueError(f"expected a slot file of format {SLOT_FILE_FORMAT}, found "
                         f"{'none' if fmt is None else str(fmt)[:40]!r}")
    ids = arrays.get("ids")
    layers = sum(1 for name in arrays if name[:1] == "k" and name[1:].isdigit())
    if ids is None or ids.ndim != 1 or ids.dtype != np.int32:
        raise ValueError("expected the slot file's ids as a list of int32, found none or another shape")
    if len(ids) > n_ctx:
        raise ValueError(f"expected at most {n_ctx} positions (the slot's context), found {len(ids)}")
    if len(ids) and not (0 <= int(ids.min()) and int(ids.max()) < n_vocab):
        raise ValueError(f"expected token ids from 0 to {n_vocab - 1} in the slot file, found others")
    try:
        k = [arrays[f"k{i}"] for i in range(layers)]
        v = [arrays[f"v{i}"] for i in range(layers)]
    except KeyError as exc:
        raise ValueError(f"expected key and value rows for each of {layers} layers, found {exc} missing") from None
    if any(len(a) != len(ids) for a in k + v):
        raise ValueError(f"expected rows for each of the {len(ids)} positions in every layer, found others")
    try:
        session.import_prefix(Prefix([int(i) for i in ids], k, v))
    except MinillamaError as exc:
        raise ValueError(f"expected a slot file of this model: {exc}") from None
    return len(ids), os.path.getsize(path)
