"""The key/value cache: every layer's keys and values for the positions processed so far, plus their token ids.

Keys and values are rounded to float16 as they are stored because llama.cpp's cache is float16: the attention then
sees the values llama.cpp's does. The native blocks keep them as float16 (half the memory, and half the bytes
attention reads per step, as llama.cpp's cache); the pure backend keeps float32 arrays of float16 values for its
numpy matmuls. The arrays grow by doubling.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

F32 = np.float32
F16 = np.float16


class KVCache:
    """Keys [n, Hkv, D] and values [n, Hkv, Dv] of every layer for the first n positions, and those n ids."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, head_dim_v: int, capacity: int = 64,
                 dtype: type = F32, shapes: list[tuple[int, int, int]] | None = None) -> None:
        """shapes: each layer's (heads, key size, value size) when the layers differ (gemma4), else None: all
        (n_head_kv, head_dim, head_dim_v)."""
        self.ids: list[int] = []
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
