"""What the two merge encoders (bpe.py: by rank, spm.py: by score) share around their merge loops.

The loops themselves stay in each encoder, written out: they are the hot path, each pair's priority is
computed differently (a merge rank of "left right", or the score rank of the token left + right), and
llama.cpp's staleness tests differ with it (the same rank again; the same symbol sizes).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Iterable
from functools import partial

import numpy as np

from .base import links


def linked_list(n: int) -> tuple[list[int] | array, list[int] | array]:
    """(next, previous) of n symbols in a row, -1 past either end: the linked list a heap merge unlinks
    merged symbols from (llama.cpp's llm_symbol.n and .p)."""
    nxt = links(range(1, n + 1))
    nxt[-1] = -1
    return nxt, links(range(-1, n - 1))


def with_bytes(syms: list[str], ids: list[int | None], fallback: Callable[[str], list[int]]) -> list[int]:
    """ids (each symbol's id, None for a symbol that is no token) with each None replaced by the ids fallback
    gives for its symbol (its bytes). Callers return ids themselves when no None is in them: the usual case,
    kept free of a call."""
    out: list[int] = []
    for s, i in zip(syms, ids, strict=True):
        if i is None:
            out += fallback(s)
        else:
            out.append(i)
    return out


# Words of at least this many symbols merge through a BucketQueue instead of a heap of Python ints
# (40 bytes an entry); below it the plain heap is faster and its memory small.
BUCKET_MIN_SYMBOLS = 1 << 16


class BucketQueue:
    """A priority queue of packed int keys, rank << shift | item, for the merges of a huge word: the same
    order as a heap of those ints (smallest rank, then smallest item) in 4 or 8 bytes an entry.

    The entries of each rank wait in a machine array (its bucket); a rank's bucket is sorted in place
    (numpy) when the queue reaches that rank, then served in order. An entry pushed for the rank being
    served goes to a small heap beside it; one pushed for a smaller rank puts the served rank's rest
    back in its bucket and switches. pop() raises IndexError when the queue is empty, as heappop does.
    """

    _CHUNK = 1 << 16  # sorted entries turned into Python ints at a time

    def __init__(self, shift: int, typecode: str) -> None:
        self.shift, self.mask, self.typecode = shift, (1 << shift) - 1, typecode
        self.buckets: dict[int, array] = {}
        self.ranks: list[int] = []  # heap of the ranks that have a bucket
        self.rank = -1  # the rank being served
        self.todo = np.zeros(0, np.int64)  # its sorted items not yet served
        self.ready: list[int] = []  # the next chunk of them, in reverse order (served from the end)
        self.late: list[int] = []  # heap of its items pushed while it is served

    def push(self, key: int) -> None:
        rank, item = key >> self.shift, key & self.mask
        if rank == self.rank:
            heapq.heappush(self.late, item)
            return
        bucket = self.buckets.get(rank)
        if bucket is None:
            self.buckets[rank] = bucket = array(self.typecode)
            heapq.heappush(self.ranks, rank)
        bucket.append(item)

    def pop(self) -> int:
        while True:
            if self.ranks and self.ranks[0] < self.rank:
                self._put_back()
            if not self.ready and len(self.todo):
                self.ready = self.todo[:self._CHUNK][::-1].tolist()
                self.todo = self.todo[self._CHUNK:]
            ready, late = self.ready, self.late
            if ready and (not late or ready[-1] <= late[0]):
                return self.rank << self.shift | ready.pop()
            if late:
                return self.rank << self.shift | heapq.heappop(late)
            if not self.ranks:
                raise IndexError("pop from an empty BucketQueue")
            self._serve(heapq.heappop(self.ranks))

    def _serve(self, rank: int) -> None:
        todo = np.frombuffer(self.buckets.pop(rank), dtype=self.typecode)
        todo.sort()  # in place: the bucket's own memory
        self.rank, self.todo, self.ready, self.late = rank, todo, [], []

    def _put_back(self) -> None:
        """A smaller rank arrived: the served rank's unserved items go back to its bucket."""
        rest = array(self.typecode, self.ready)
        rest.extend(self.late)
        rest.frombytes(self.todo.tobytes())
        if rest:  # nothing left of it: the rank is done
            self.buckets[self.rank] = rest
            heapq.heappush(self.ranks, self.rank)
        self.rank, self.todo, self.ready, self.late = -1, np.zeros(0, np.int64), [], []


def merge_queue(n: int, keys: Iterable[int], shift: int) -> tuple[Callable[[], int], Callable[[int], None]]:
    """(pop, push) over the packed keys of a heap merge of n symbols: a plain heap (fastest), or for a
    word of BUCKET_MIN_SYMBOLS or more a BucketQueue (4-8 bytes an entry instead of about 40)."""
    if n < BUCKET_MIN_SYMBOLS:
        heap = list(keys)
        heapq.heapify(heap)
        return partial(heapq.heappop, heap), partial(heapq.heappush, heap)
    queue = BucketQueue(shift, "i" if shift <= 32 and n < 1 << 31 else "q")
    push = queue.push
    for key in keys:
        push(key)
    return queue.pop, push
