"""The local engine: documents read in this process, encoded by a pool of worker processes, written in order.

The main process reads documents in input order, groups them into batches of about BATCH_CHARS
characters, and hands each batch to a worker process that holds its own Tokenizer (sent once,
pickled as its tables). Results come back in submission order whatever finishes first, and at most
AHEAD batches per worker are in flight, so memory stays flat however large the input. The writer
(shards.ShardWriter) then cuts shards by its fixed rule: output does not depend on the worker count.
With workers=1 everything runs in this process.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np

from ..tokenizer import Tokenizer
from .shards import ShardWriter, doc_digest
from .sources import BadRecordError, BadRecords, Source

BATCH_CHARS = 1 << 18
AHEAD = 3
def encode_docs(tok: Tokenizer, docs: Sequence[str], add_special: bool, parse_special: bool, sep: Sequence[int],
                dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, bytes, int]:
    """(id count per document, all ids concatenated, doc_digest()s concatenated, UTF-8 bytes) of a batch.

    Each document is tok.encode(doc, add_special, parse_special) followed by the separator ids."""
    out: list[int] = []
    lens = np.empty(len(docs), np.int64)
    sep = list(sep)
    n_bytes = 0
    digests = []
    for i, doc in enumerate(docs):
        before = len(out)
        out += tok.encode(doc, add_special, parse_special)
        out += sep
        lens[i] = len(out) - before
        raw = doc.encode("utf-8", "surrogatepass")
        n_bytes += len(raw)
        digests.append(doc_digest(doc))
    return lens, np.array(out, dtype=dtype), b"".join(digests), n_bytes


_WORKER: dict = {}


def _init_worker(tok: Tokenizer, settings: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _WORKER["tok"], _WORKER["settings"] = tok, settings


def _encode_in_worker(docs: list[str]) -> tuple[np.ndarray, np.ndarray, bytes, int]:
    return encode_docs(_WORKER["tok"], docs, *_WORKER["settings"])


def tick(progress, n_bytes: int, writer: ShardWriter) -> None:
    """Advance the bar (bytes of text, shown as MB/s) and show tokens/s beside it."""
    progress.update(n_bytes)
    elapsed = progress.format_dict.get("elapsed") or 0
    if elapsed:
        progress.set_postfix_str(f"{writer.total_tokens / elapsed:,.0f} tokens/s", refresh=False)


def batches(docs: Iterator[str], batch_chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """Documents grouped into lists of about batch_chars characters, in order. When reading fails, the
    documents read so far still come out as a last batch before the error."""
    batch: list[str] = []
    size = 0
    try:
        for d in docs:
            batch.append(d)
            size += len(d)
            if size >= batch_chars:
                yield batch
                batch, size = [], 0
    except BadRecordError:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def run_local(tok: Tokenizer, source: Source, writer: ShardWriter, settings: tuple, workers: int,
              bad: BadRecords, progress) -> None:
    """Read, encode (on `workers` processes) and write every document of source, in order."""
    docs = source.documents(bad)
    skipped: list[bytes] = []
    for _ in range(writer.skip_docs):  # documents of kept shards: hashed, not encoded
        d = next(docs, None)
        if d is None:
            break
        skipped.append(doc_digest(d))
        if len(skipped) >= 4096:
            writer.feed(None, None, b"".join(skipped))
            skipped.clear()
    if skipped:
        writer.feed(None, None, b"".join(skipped))

    def take(result: tuple[np.ndarray, np.ndarray, bytes, int]) -> None:
        lens, ids, digests, n_bytes = result
        writer.feed(lens, ids, digests)
        tick(progress, n_bytes, writer)

    failed: list[BadRecordError] = []

    def until_bad() -> Iterator[list[str]]:
        """The batches up to a bad record (the last one cut short there); the error is raised after they
        are written, so that the shards they complete are kept."""
        try:
            yield from batches(docs)
        except BadRecordError as exc:
            failed.append(exc)

    if workers <= 1:
        for batch in until_bad():
            take(encode_docs(tok, batch, *settings))
        if failed:
            raise failed[0]
        return
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(tok, settings)) as pool:
        pending: deque[Future] = deque()
        try:
            for batch in until_bad():
                pending.append(pool.submit(_encode_in_worker, batch))
                if len(pending) >= AHEAD * workers:
                    take(pending.popleft().result())
            while pending:
                take(pending.popleft().result())
            if failed:
                raise failed[0]
        except BaseException:
            for f in pending:
                f.cancel()
            raise
