"""The local engine: input read in this thread, encoded by worker threads or processes, written in order.

The main thread reads the input in order as units (sources.Source.units): for text files read by
paragraph, chunks of about BATCH_CHARS raw bytes that each split into whole documents by themselves,
so it does no work per document there; for other inputs, the documents. It groups them into batches
of about BATCH_CHARS characters and hands each to a worker; at most AHEAD batches per worker are in
flight, and no more once they hold AHEAD * BATCH_CHARS characters (a long document is in flight
alone), so memory stays flat however large the input, and results are written in submission order
whatever finishes first. The writer (shards.ShardWriter) cuts shards by its fixed rule: the output does
not depend on the worker count. A worker splits chunks into documents, encodes them
(Tokenizer.encode_concat: one call a batch) and hashes each document (doc_digest).

Workers are threads where the Tokenizer's core encodes a whole batch with the GIL released
(Tokenizer.encodes_in_core: the native backend): no fork, nothing pickled, results handed over as they
are; each thread has a Tokenizer of its own made from the same vocab (the core's word cache takes one lock
per word, which threads sharing it contend for). Elsewhere (the pure backend, whose
encoding holds the GIL) they are processes (Workers), each with its own Tokenizer (inherited or pickled
as its tables); after each batch a process sends back the word-cache entries it computed
(Tokenizer.take_cache_entries), and this process passes them on at once to every other worker, which adds
them to its cache before it starts its next batch. Without that each would compute every distinct word
of the input itself. Ids do not depend on it: an entry is exactly what encoding its word gives.

With workers=1 everything runs in this thread.

Worker processes never outlive this process: each asks the kernel for SIGKILL when its parent dies
(Linux prctl PR_SET_PDEATHSIG) and, wherever that is not available, checks every PARENT_CHECK_S seconds
while idle whether its parent is still the process that started it.
"""

from __future__ import annotations

import gc
import os
import pickle
import queue
import signal
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ..errors import MinillamaError
from ..tokenizer import Tokenizer
from .shards import ShardWriter, doc_digest, doc_digests
from .sources import BadRecordError, BadRecords, Source, TextChunk

if TYPE_CHECKING:  # imported where processes start: threads and one worker need neither
    import multiprocessing

Unit = str | TextChunk  # a document, or a chunk of a text file that splits into documents where it is encoded
Encoded = tuple[np.ndarray, np.ndarray, bytes, int]  # encode_docs' result

BATCH_CHARS = 1 << 18
AHEAD = 4
PARENT_CHECK_S = 1.0
THREADS = True  # worker threads where the tokenizer encodes with the GIL released (False: processes always)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def encode_docs(tok: Tokenizer, docs: Sequence[str], add_special: bool, parse_special: bool, sep: Sequence[int],
                dtype: np.dtype) -> Encoded:
    """(id count per document, all ids concatenated, doc_digest()s concatenated, UTF-8 bytes) of a batch.

    Each document is tok.encode(doc, add_special, parse_special) followed by the separator ids, all of them
    in one call (Tokenizer.encode_concat: on the native backend the core writes them into one buffer with the
    GIL released, no list per document), and so are the digests (shards.doc_digests)."""
    ids, ends = tok.encode_concat(docs, add_special, parse_special, sep)
    digests, n_bytes = doc_digests(docs, tok.backend == "native")
    return np.diff(ends, prepend=0), ids.astype(dtype), digests, n_bytes


def encode_units(tok: Tokenizer, units: Sequence[Unit], *settings) -> Encoded:
    """encode_docs of the documents of units, in order (text chunks are split here)."""
    docs: list[str] = []
    for p in units:
        if isinstance(p, str):
            docs.append(p)
        else:
            docs += p.documents()
    return encode_docs(tok, docs, *settings)


def _work(me: int, tok: Tokenizer, settings: tuple, inbox: multiprocessing.Queue,
          results: multiprocessing.Queue) -> None:
    """A worker process: takes ("batch", seq, units), ("teach", entries pickled) and None (stop) from inbox,
    puts (seq, me, ok, encode_units' result or the exception, its new cache entries pickled) on results.
    Everything that has arrived is read before each batch, so entries taught meanwhile are used at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()
    die_with_parent(parent)
    tok.take_cache_entries()  # starts the record
    backlog: deque[tuple[int, list[Unit]]] = deque()
    stop = False
    while backlog or not stop:
        while not stop:
            try:
                msg = inbox.get(timeout=PARENT_CHECK_S) if not backlog else inbox.get(block=False)
            except queue.Empty:
                if os.getppid() != parent:  # orphaned (the parent died and init took this process over)
                    os._exit(1)
                if backlog:
                    break
                continue
            if msg is None:
                stop = True
            elif msg[0] == "teach":
                tok.add_cache_entries(pickle.loads(msg[1]))
            else:
                backlog.append(msg[1:])
        if not backlog:
            continue
        seq, units = backlog.popleft()
        try:
            out: Encoded | BaseException = encode_units(tok, units, *settings)
            ok = True
        except Exception as exc:  # goes back to the main process, which raises it
            try:
                pickle.dumps(exc)
                out = exc
            except Exception:
                out = MinillamaError(f"a worker process failed: {type(exc).__name__}: {exc}")
            ok = False
        results.put((seq, me, ok, out, pickle.dumps(tok.take_cache_entries(), pickle.HIGHEST_PROTOCOL)))


class Threads:
    """`n` threads, for a tokenizer that encodes with the GIL released (Tokenizer.encodes_in_core): Workers' calls,
    with batches in flight bounded the same way in all.

    Each thread encodes with a Tokenizer of its own, made from tok's vocab (what a worker process unpickles):
    the core's word cache is guarded by one mutex taken per word, and two threads sharing it contend for it on
    every word (measured with two free cores: 0.31 s on one thread became 0.64 s on two, 0.37 s of it in the
    kernel). Each thread then computes the words it meets itself, as a worker process did."""

    def __init__(self, n: int, tok: Tokenizer, settings: tuple) -> None:
        self.n, self.settings = n, settings
        self.local = threading.local()
        make, args = tok.__reduce__()[:2]  # the vocab's tables, not pickled: shared, read only

        def own_tokenizer() -> None:
            self.local.tok = make(*args)

        self.pool = ThreadPoolExecutor(n, thread_name_prefix="minillama-dataset", initializer=own_tokenizer)
        self.in_flight: deque[tuple[Future[Encoded], int]] = deque()  # and their characters
        self.chars = 0

    def _encode(self, units: list[Unit]) -> Encoded:
        return encode_units(self.local.tok, units, *self.settings)

    @property
    def pending(self) -> int:
        """Batches submitted and not yet returned by next_result()."""
        return len(self.in_flight)

    def has_room(self) -> bool:
        """Whether another batch may go: none in flight, or fewer than AHEAD a thread holding fewer than AHEAD *
        BATCH_CHARS characters a thread (Workers.has_room's bound, over all threads)."""
        return not self.in_flight or (len(self.in_flight) < AHEAD * self.n and self.chars < AHEAD * self.n * BATCH_CHARS)

    def submit(self, units: list[Unit]) -> None:
        """Queue a batch for the next free thread (call when has_room())."""
        size = sum(map(_size, units))
        self.in_flight.append((self.pool.submit(self._encode, units), size))
        self.chars += size

    def next_result(self) -> Encoded:
        """The oldest batch's result (its exception raised here)."""
        future, size = self.in_flight.popleft()
        self.chars -= size
        return future.result()

    def close(self, ok: bool) -> None:
        """Stop the threads once the batches they encode are done (on an error the queued ones are dropped)."""
        self.pool.shutdown(wait=True, cancel_futures=not ok)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux), and exit now if it already has."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the getppid() check in _work is what remains
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Workers:
    """`n` worker processes (_work), each with an inbox of its own, and one queue for all results.

    submit() gives a batch to the worker with the fewest batches in hand; next_result() returns results
    in submission order, passing on the cache entries each result brings to the other workers."""

    def __init__(self, n: int, tok: Tokenizer, settings: tuple) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context()
        self.results: multiprocessing.Queue = ctx.Queue()
        self.inboxes: list[multiprocessing.Queue] = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_work, args=(i, tok, settings, q, self.results), daemon=True,
                                  name=f"minillama-dataset-{i}") for i, q in enumerate(self.inboxes)]
        freeze = gc.get_freeze_count() == 0  # a caller's own frozen objects are left as they are
        if freeze:
            gc.freeze()  # forked workers then leave this process's objects alone (no GC passes, fewer page copies)
        try:
            for p in self.procs:
                p.start()
        finally:
            if freeze:
                gc.unfreeze()
        self.in_hand = [0] * n  # batches
        self.chars = [0] * n  # their characters (bytes of text chunks)
        self.size_of: dict[int, int] = {}  # seq -> its characters, until its result is in
        self.sent = self.taken = 0
        self.done: dict[int, Encoded] = {}

    @property
    def pending(self) -> int:
        """Batches submitted and not yet returned by next_result()."""
        return self.sent - self.taken

    def _open(self, w: int) -> bool:
        return not self.in_hand[w] or (self.in_hand[w] < AHEAD and self.chars[w] < AHEAD * BATCH_CHARS)

    def has_room(self) -> bool:
        """Whether some worker may take another batch: one with nothing in hand, or fewer than AHEAD batches
        of fewer than AHEAD * BATCH_CHARS characters in all. So long documents are in flight one per worker
        at most, and memory does not grow with how many of them follow each other."""
        return any(map(self._open, range(len(self.procs))))

    def submit(self, units: list[Unit]) -> None:
        """Give a batch to the open worker with the least work in hand (call when has_room())."""
        w = min(filter(self._open, range(len(self.procs))), key=lambda i: (self.chars[i], self.in_hand[i]))
        size = sum(map(_size, units))
        self.inboxes[w].put(("batch", self.sent, units))
        self.in_hand[w] += 1
        self.chars[w] += size
        self.size_of[self.sent] = size
        self.sent += 1

    def next_result(self) -> Encoded:
        while self.taken not in self.done:
            try:
                seq, w, ok, out, learned = self.results.get(timeout=1.0)
            except queue.Empty:
                self._check_alive()
                continue
            if not ok:
                raise out
            self.in_hand[w] -= 1
            self.chars[w] -= self.size_of.pop(seq)
            self.done[seq] = out
            if len(learned) > 8:  # more than an empty list's pickle
                for i, inbox in enumerate(self.inboxes):
                    if i != w:
                        inbox.put(("teach", learned))
        self.taken += 1
        return self.done.pop(self.taken - 1)

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.exitcode is not None:
                how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit status {p.exitcode}"
                raise MinillamaError(f"a worker process ended unexpectedly ({how}; out of memory?); run the "
                                     "same command again to resume")

    def close(self, ok: bool) -> None:
        """Stop the workers: let them finish (ok) or end them at once (on an error)."""
        for inbox in self.inboxes:
            if ok:
                inbox.put(None)
            else:
                inbox.cancel_join_thread()
        for p in self.procs:
            if not ok:
                p.terminate()
            p.join()
        for q in (*self.inboxes, self.results):
            q.close()


def tick(progress, n_bytes: int, writer: ShardWriter) -> None:
    """Advance the bar (bytes of text, shown as MB/s) and show tokens/s beside it."""
    progress.update(n_bytes)
    elapsed = progress.format_dict.get("elapsed") or 0
    if elapsed:
        progress.set_postfix_str(f"{writer.total_tokens / elapsed:,.0f} tokens/s", refresh=False)


def _size(unit: Unit) -> int:
    return len(unit) if isinstance(unit, str) else len(unit.data)


def batches(units: Iterator[Unit], batch_chars: int = BATCH_CHARS) -> Iterator[list[Unit]]:
    """Pieces grouped into lists of about batch_chars characters (bytes for text chunks), in order. When
    reading fails, the units read so far still come out as a last batch before the error."""
    batch: list[Unit] = []
    size = 0
    try:
        for p in units:
            batch.append(p)
            size += _size(p)
            if size >= batch_chars:
                yield batch
                batch, size = [], 0
    except BadRecordError:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def skip_kept(units: Iterator[Unit], writer: ShardWriter) -> Iterator[Unit]:
    """units past the documents of the shards a resumed run keeps (writer.skip_docs): those are hashed
    (doc_digest, fed to the writer to check the input did not change) instead of encoded. A text chunk
    that straddles the boundary comes out as its remaining documents."""
    left = writer.skip_docs
    digests: list[bytes] = []
    for p in units:
        if left:
            docs = [p] if isinstance(p, str) else p.documents()
            digests += map(doc_digest, docs[:left])
            rest = docs[left:]
            left -= len(docs) - len(rest)
            if len(digests) >= 4096 or not left:
                writer.feed(None, None, b"".join(digests))
                digests.clear()
            yield from rest
        else:
            yield p
    if digests:
        writer.feed(None, None, b"".join(digests))


def run_local(tok: Tokenizer, source: Source, writer: ShardWriter, settings: tuple, workers: int,
              bad: BadRecords, progress) -> None:
    """Read, encode (on `workers` threads or processes) and write every document of source, in order."""
    units = skip_kept(source.units(bad, BATCH_CHARS), writer)

    def take(result: Encoded) -> None:
        lens, ids, digests, n_bytes = result
        writer.feed(lens, ids, digests)
        tick(progress, n_bytes, writer)

    failed: list[BadRecordError] = []

    def until_bad() -> Iterator[list[Unit]]:
        """The batches up to a bad record (the last one cut short there); the error is raised after they
        are written, so that the shards they complete are kept."""
        try:
            yield from batches(units)
        except BadRecordError as exc:
            failed.append(exc)

    if workers <= 1:
        for batch in until_bad():
            take(encode_units(tok, batch, *settings))
        if failed:
            raise failed[0]
        return
    parse_special = settings[1]
    kind = Threads if THREADS and tok.encodes_in_core(parse_special) else Workers
    pool: Threads | Workers = kind(workers, tok, settings)
    ok = False
    try:
        for batch in until_bad():
            while not pool.has_room():
                take(pool.next_result())
            pool.submit(batch)
        while pool.pending:
            take(pool.next_result())
        ok = True
    finally:
        pool.close(ok)
    if failed:
        raise failed[0]
