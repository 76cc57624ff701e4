"""The key/value cache: every layer's keys and values for the positions processed so far, plus their token ids.

Keys and values are rounded to float16 as they are stored because llama.cpp's cache is float16: the attention then
sees the values llama.cpp's does. They are stored by position; a Ring says in which order llama.cpp's cache holds
them (its attention visits cells in cell order, and its bits depend on that order). The native blocks keep them as float16 (half the memory, and half the bytes
attention reads per step, as llama.cpp's cache); the pure backend keeps float32 arrays of float16 values for its
numpy matmuls. The arrays grow by doubling.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import ArgumentError

F32 = np.float32
F16 = np.float16


#: llama.cpp's default n_ubatch: the most rows one pass places in its cache, and what its sliding-window cache keeps
#: room for beside the window.
UBATCH = 512
#: llama.cpp pads its caches (and the cells its attention reads) to multiples of this.
PAD = 256


def _pad(n: int) -> int:
    return (n + PAD - 1) // PAD * PAD


def ctx_cells(n_ctx: int) -> int:
    """Cells of llama.cpp's cache of a context of n_ctx positions (the full-attention layers'): padded to 256."""
    return _pad(n_ctx)


def swa_cells(window: int, n_ctx: int) -> int:
    """Cells of llama-server's cache of the sliding-window layers (llama_kv_cache_iswa, swa_full off, one
    sequence): the window and one ubatch, padded, at most the (padded) context."""
    return _pad(min(_pad(n_ctx), window + UBATCH))


class Ring:
    """Which cell of llama.cpp's cache of the sliding-window layers holds which position of one sequence, as
    llama_kv_cache places the tokens of each pass (find_slot, apply_ubatch, seq_rm in src/llama-kv-cache.cpp): from
    its head, a cell is taken when empty or when its position is out of every row's window (past the window of the
    last position cached); an overwritten position purges those before it. Until positions outgrow the cells, cell c
    holds position c; after, new tokens reuse the cells of old ones, and attention (which visits cells in cell
    order, each row masking positions it does not see) sums in that order."""

    def __init__(self, size: int, window: int, n: int = 0) -> None:
        """size cells; window 0: a full-attention layers' cache (only empty cells are taken). n: positions
        0..n-1 already in cells 0..n-1, placed from an empty cache."""
        self.size, self.window = size, window
        self.pos = np.full(size, -1, np.int64)  # each cell's position, -1: empty
        self.pos[:n] = np.arange(n)
        self.head = n
        self._order: np.ndarray | None = None  # cells(), None while cell c holds position c

    def place(self, start: int, n: int) -> None:
        """Put positions start..start+n-1 (one pass) into cells as llama.cpp's find_slot and apply_ubatch do."""
        if n > self.size:
            raise ArgumentError(f"expected at most {self.size} tokens in one pass over a sliding-window cache of "
                                f"{self.size} cells, found {n}")
        pos, size = self.pos, self.size
        used = int((pos >= 0).sum())
        last = int(pos.max())  # the sequence's last cached position (seq_pos_max), -1: none
        head = 0 if self.head > used + 2 * n else self.head
        taken: list[int] = []
        tested = 0
        while len(taken) < n:
            if head >= size:
                tested += size - head
                head = 0
                continue
            p = int(pos[head])
            if p < 0 or (self.window > 0 and last + 1 - p >= self.window):
                taken.append(head)
            head += 1
            tested += 1
            if len(taken) < n and tested >= size:
                raise ArgumentError(f"no free cell for position {start + len(taken)} in a sliding-window cache of "
                                    f"{size} cells")
        cells = np.asarray(taken, np.int64)
        dropped = int(pos[cells].max())
        pos[cells] = np.arange(start, start + n)
        if dropped >= 0:  # purge the positions up to the last overwritten one (apply_ubatch keeps them contiguous)
            lo = int(pos[pos >= 0].min())
            if lo <= dropped:
                self._remove(lo, dropped + 1)
        self.head = int(cells[-1]) + 1
        self._update()

    def remove(self, p0: int, p1: int | None = None) -> None:
        """Forget positions p0..p1-1 (all from p0: None), as llama.cpp's seq_rm."""
        self._remove(p0, p1)
        self._update()

    def add(self, p0: int, delta: int) -> None:
        """Move positions from p0 on by delta (those falling below 0 leave), as llama.cpp's seq_add."""
        moved = self.pos >= p0
        self.pos[moved] += delta
        self._free(moved & (self.pos < 0))
        self._update()

    def _remove(self, p0: int, p1: int | None) -> None:
        self._free((self.pos >= p0) & (self.pos < (np.iinfo(np.int64).max if p1 is None else p1)))

    def _free(self, gone: np.ndarray) -> None:
        """Empty the cells gone marks; the head goes back to the first of them, as llama.cpp's seq_rm moves it."""
        if gone.any():
            self.pos[gone] = -1
            self.head = min(self.head, int(np.argmax(gone)))

    def _update(self) -> None:
        used = np.flatnonzero(self.pos >= 0)
        n_kv = min(self.size, max(PAD, _pad(int(used[-1]) + 1 if used.size else 0)))
        ident = np.array_equal(self.pos[:used.size], np.arange(used.size))
        self._order = None if ident and (used.size == 0 or used[-1] == used.size - 1) else self.pos[:n_kv].copy()

    def cells(self) -> np.ndarray | None:
        """The cells attention reads, in order: each one's position or -1 (llama.cpp's n_kv of them: the used
        cells padded to 256); None while cell c holds position c (the same order as positions)."""
        return self._order


class KVCache:
    """Keys [n, Hkv, D] and values [n, Hkv, Dv] of every layer for the first n positions, and those n ids."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, head_dim_v: int, capacity: int = 64,
                 dtype: type = F32, shapes: list[tuple[int, int, int]] | None = None, window: int = 0,
                 n_ctx: int = 0) -> None:
        """shapes: each layer's (heads, key size, value size) when the layers differ (gemma4), else None: all
        (n_head_kv, head_dim, head_dim_v). window: the sliding-window layers' window (0: none), whose cache of
        swa_cells(window, n_ctx) cells llama.cpp reuses as a Ring."""
        self.ids: list[int] = []
        self.n_ctx = n_ctx
        #: The cell order of the sliding-window layers' cache, or None (no such layers).
        self.ring = Ring(swa_cells(window, n_ctx), window) if window > 0 and n_ctx > 0 else None
        #: The cell order of the full-attention layers' cache: None while cell c holds position c (until a context
        #: shift, which makes one from that state).
        self.base: Ring | None = None
        shapes = shapes if shapes is not None else [(n_head_kv, head_dim, head_dim_v)] * n_layer
        self._shapes_k = [(h, dk) for h, dk, _ in shapes]
        self._shapes_v = [(h, dv) for h, _, dv in shapes]
        self._shape_k, self._shape_v = self._shapes_k[0], self._shapes_v[0]
        self._cap = capacity
        self._dtype = dtype  # F32 (the numpy blocks) or F16 (the native blocks)
        self.k = [np.empty((capacity, *shape), dtype) for shape in self._shapes_k]
        self.v = [np.empty((capacity, *shape), dtype) for shape in self._shapes_v]

    @property
    def n(self) -> int:
        """Positions cached."""
        return len(self.ids)

    def truncate(self, n: int) -> None:
        """Forget every position from n on."""
        del self.ids[n:]
        for ring in self._rings():
            ring.remove(n)

    def _rings(self) -> list[Ring]:
        return [r for r in (self.base, self.ring) if r is not None]

    def place(self, start: int, n: int) -> None:
        """Note that one pass stores positions start..start+n-1 (the cell order of a Ring follows passes)."""
        for ring in self._rings():
            ring.place(start, n)

    def cells(self, window: int) -> np.ndarray | None:
        """The cell order attention visits for a layer of this window (Ring.cells), or None: by position."""
        ring = self.ring if window > 0 else self.base
        return None if ring is None else ring.cells()

    def shift(self, n_keep: int, n_discard: int, rope: Callable[[int, np.ndarray, np.ndarray], None]) -> None:
        """llama-server's context shift: positions n_keep..n_keep+n_discard-1 leave (llama.cpp's seq_rm), the later
        ones move back by n_discard (seq_add; their rows move with them) and every layer's keys are rotated by
        their position's change (rope(layer, keys, deltas): 0 for the kept ones, as llama.cpp's K shift rotates
        every cell); each Ring, the full-attention layers' one made now, follows which cell holds what."""
        n, p1 = self.n, n_keep + n_discard
        if not 0 <= n_keep <= p1 <= n:
            raise ArgumentError(f"expected 0 <= n_keep <= n_keep + n_discard <= {n} (the positions cached), found "
                                f"n_keep {n_keep} and n_discard {n_discard}")
        if self.base is None:
            self.base = Ring(ctx_cells(self.n_ctx or n), 0, n)
        for ring in self._rings():
            ring.remove(n_keep, p1)
            ring.add(p1, -n_discard)
        deltas = np.zeros(n - n_discard, np.int64)
        deltas[n_keep:] = -n_discard
        for layer, (k, v) in enumerate(zip(self.k, self.v, strict=True)):
            k[n_keep:n - n_discard] = k[p1:n].copy()
            v[n_keep:n - n_discard] = v[p1:n].copy()
            rope(layer, k, deltas)
        del self.ids[n_keep:p1]

    def reserve(self, n: int) -> None:
        """Make room for n positions, keeping what is cached."""
        if n <= self._cap:
            return
        cap = max(n, 2 * self._cap)
        for store, shapes in ((self.k, self._shapes_k), (self.v, self._shapes_v)):
            for i, old in enumerate(store):
                new = np.empty((cap, *shapes[i]), self._dtype)
                new[:self._cap] = old
                store[i] = new
        self._cap = cap

    def store(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write k, v [T, Hkv, D] at positions start.. of a layer; return the layer's keys and values 0..start+T."""
        end = start + k.shape[0]
        self.k[layer][start:end] = k.astype(np.float16)
        self.v[layer][start:end] = v.astype(np.float16)
        return self.k[layer][:end], self.v[layer][:end]

    def export(self, n: int | None = None) -> Prefix:
        """A copy of the first n cached positions (all: None): their ids and every layer's key and value rows."""
        n = self.n if n is None else max(0, min(n, self.n))
        return Prefix(list(self.ids[:n]), [k[:n].copy() for k in self.k], [v[:n].copy() for v in self.v])

    def load(self, prefix: Prefix) -> None:
        """Hold exactly prefix's positions (ids, keys, values), as if they had been computed here."""
        if len(prefix.k) != len(self.k) or any(k.shape[1:] != s for k, s in zip(prefix.k, self._shapes_k)) \
                or any(v.shape[1:] != s for v, s in zip(prefix.v, self._shapes_v)):
            raise ArgumentError(f"expected a prefix of {len(self.k)} layers of keys {self._shape_k} and values "
                                f"{self._shape_v} (this model's cache), found {len(prefix.k)} layers of keys "
                                f"{prefix.k[0].shape[1:] if prefix.k else ()}")
        n = prefix.n
        self.reserve(n)
        for store, rows in ((self.k, prefix.k), (self.v, prefix.v)):
            for layer, saved in zip(store, rows, strict=True):
                layer[:n] = saved
        self.ids[:] = prefix.ids
        self.base = None
        if self.ring is not None:  # as a prompt of those positions places them, one pass per UBATCH
            self.ring = Ring(self.ring.size, self.ring.window)
            for start in range(0, n, UBATCH):
                self.ring.place(start, min(UBATCH, n - start))


class Prefix:
    """A saved start of a sequence: its ids and each layer's key and value rows (KVCache.export / load)."""

    __slots__ = ("ids", "k", "v", "nbytes")

    def __init__(self, ids: list[int], k: list[np.ndarray], v: list[np.ndarray]) -> None:
        self.ids, self.k, self.v = ids, k, v
        #: Bytes its rows (and ids) hold: what a RAM cache of prefixes counts against its limit.
        self.nbytes = sum(a.nbytes for a in k) + sum(a.nbytes for a in v) + 8 * len(ids)

    @property
    def n(self) -> int:
        """Positions held."""
        return len(self.ids)
