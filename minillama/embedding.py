"""The token embedding table of a GGUF model: only the rows asked for, dequantized to float32.

A 128k x 4096 table is 2 GiB as float32, so ``Embedding.from_file`` keeps the file memory-mapped
and ``lookup(ids)`` copies just the requested rows' bytes out of the map and dequantizes them, the
whole batch at once with numpy (no Python loop per block). The dequantizers and the tensor-view checks
live in minillama.quants (bit-equal to ``gguf.quants.dequantize``).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ArgumentError, ArgumentTypeError, FormatError
from .fileio import input_path
from .gguffile.reader import read_gguf
from .quants import (
    _CHUNK_VALUES,
    _DEQUANT,
    SUPPORTED_TYPES,
    check_tensor,
    check_tensor_table,
    dequantize,
    tensor_layout,
    tensor_view,
)

__all__ = ["Embedding", "SUPPORTED_TYPES", "TENSOR_NAME", "dequantize", "check_tensor", "check_tensor_table",
           "tensor_layout", "tensor_view"]

TENSOR_NAME = "token_embd.weight"
T = GGMLQuantizationType
F32 = np.float32

# ---------------------------------------------------------------------------------------------------------------------
# Random stub rows: a counter-based hash of (seed, element index), so any row is computed on its own.
# ---------------------------------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: Any) -> Any:
    """The splitmix64 finalizer, on a uint64 array (wrapping) or a Python int (masked)."""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _random_rows(key: int, ids: np.ndarray, n_embd: int) -> np.ndarray:
    """Rows `ids` of the random table `key`: uniform multiples of 2**-23 in [-1, 1)."""
    index = ids.astype(np.uint64).reshape(-1, 1) * np.uint64(n_embd) + np.arange(n_embd, dtype=np.uint64)
    z = _mix64(np.uint64(key) + index * np.uint64(_GOLDEN))
    return (z >> np.uint64(40)).astype(F32) * F32(2.0 ** -23) - F32(1)


# ---------------------------------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------------------------------

class Embedding:
    """A token embedding table (n_vocab rows of n_embd values) that dequantizes only the rows looked up."""

    def __init__(self, n_vocab: int, n_embd: int, ggml_type: GGMLQuantizationType, *,
                 table: np.ndarray | None = None, mm: mmap.mmap | None = None, seed: int | None = None,
                 path: str | None = None) -> None:
        """Use from_file or random; this wires either a mapped table of raw rows or a random seed."""
        self._n_vocab, self._n_embd, self._type = n_vocab, n_embd, ggml_type
        self._table, self._mmap, self.path = table, mm, path
        self._key = None if seed is None else _mix64(seed & _M64)
        self._dequant = _DEQUANT[ggml_type]
        self._type_size = GGML_QUANT_SIZES[ggml_type][1]

    # -- construction --------------------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Embedding:
        """Memory-map the token_embd.weight tensor of a GGUF model, checking its type and extent first."""
        path = input_path(path, "GGUF model file")
        gf = read_gguf(path)
        info = next((t for t in gf.tensors if t.name == TENSOR_NAME), None)
        if info is None:
            if not gf.tensors:
                found = "no tensors at all (a vocab-only file? Embedding.random stands in for it)"
            else:
                names = ", ".join(repr(t.name) for t in gf.tensors[:8])
                found = f"{len(gf.tensors)} tensors ({names}{', ...' if len(gf.tensors) > 8 else ''})"
            raise FormatError(f"expected a tensor {TENSOR_NAME!r} (the token embeddings), found {found}",
                              path=path)
        if len(info.shape) < 2 or any(d != 1 for d in info.shape[2:]):
            raise FormatError(f"{TENSOR_NAME} has shape {list(info.shape)}, expected 2 dimensions "
                              "[n_embd, n_vocab]", path=path, key=TENSOR_NAME)
        n_embd, n_vocab = info.shape[0], info.shape[1]
        if n_embd == 0 or n_vocab == 0:
            raise FormatError(f"{TENSOR_NAME} has shape {list(info.shape)}, expected a non-empty table",
                              path=path, key=TENSOR_NAME)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_tensor(gf, info, size)  # before mapping: a bad extent fails without touching the data
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        table, qtype = tensor_view(gf, info, mm, size)
        return cls(n_vocab, n_embd, qtype, table=table, mm=mm, path=path)

    @classmethod
    def random(cls, n_vocab: int, n_embd: int, seed: int = 0) -> Embedding:
        """A stand-in table of uniform [-1, 1) float32 values for vocab-only files and tests, fixed by seed."""
        for name, v in (("n_vocab", n_vocab), ("n_embd", n_embd)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ArgumentError(f"{name} must be a positive integer, got {v!r}")
        return cls(int(n_vocab), int(n_embd), T.F32, seed=int(seed))

    # -- properties ----------------------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of rows (tokens) in the table."""
        return self._n_vocab

    @property
    def n_embd(self) -> int:
        """Number of values in each row (the model's embedding width)."""
        return self._n_embd

    @property
    def ggml_type(self) -> str:
        """Name of the ggml type the rows are stored in ("Q8_0", "F16"...; "F32" for the random stub)."""
        return self._type.name

    def __repr__(self) -> str:
        """Shape, type and origin, for debugging."""
        origin = "random" if self._key is not None else repr(self.path)
        return f"Embedding({self._n_vocab} x {self._n_embd} {self.ggml_type}, {origin})"

    # -- lookup --------------------------------------------------------------------------------------------------

    def lookup(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows `ids` of the table as a (len(ids), n_embd) float32 array, reading and dequantizing only those."""
        idx = self._check_ids(ids)
        if len(idx) == 0:
            return np.empty((0, self._n_embd), F32)
        if len(idx) == 1:  # a decode step's token
            return self._rows(idx)
        # A repeated id (common in text) is read and dequantized once, then copied.
        uniq, inverse = np.unique(idx, return_inverse=True)
        todo = idx if len(uniq) == len(idx) else uniq
        step = max(1, _CHUNK_VALUES // self._n_embd)  # bounds the temporaries of one dequantization
        if len(todo) <= step or (self._type == T.F32 and self._key is None):  # F32: the copy is the result
            rows = self._rows(todo)
        else:
            rows = np.empty((len(todo), self._n_embd), F32)
            for s in range(0, len(todo), step):
                rows[s:s + step] = self._rows(todo[s:s + step])
        return rows if todo is idx else rows[inverse.reshape(-1)]

    def _check_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The ids as a 1-D intp array; ArgumentError naming the first id outside the table."""
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ArgumentError(f"ids must be a 1-D sequence of token ids, got an array of shape {arr.shape}")
        if arr.size == 0:
            return np.zeros(0, np.intp)
        if arr.dtype.kind == "O":  # Python ints too large for int64/uint64
            for v in arr:
                if isinstance(v, (int, np.integer)) and not 0 <= v < self._n_vocab:
                    raise self._out_of_range(v)
        if arr.dtype.kind not in "iu":
            raise ArgumentTypeError(f"token ids must be integers, got {arr.dtype}")
        bad = arr >= self._n_vocab
        if arr.dtype.kind == "i":
            bad |= arr < 0
        if bad.any():
            raise self._out_of_range(arr[bad.argmax()])
        return arr.astype(np.intp, copy=False)

    def _out_of_range(self, token_id: Any) -> ArgumentError:
        """The error for an id outside the table, naming the id and the table size."""
        n = self._n_vocab
        return ArgumentError(f"token id {token_id} is out of range for an embedding table of {n} rows "
                          f"(expected 0..{n - 1})")

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Dequantized rows for valid, distinct ids (one batch; only these rows' bytes are read)."""
        if self._key is not None:
            return _random_rows(self._key, ids, self._n_embd)
        if self._table is None:
            raise ArgumentError(f"lookup on a closed Embedding ({self.path})")
        raw = self._table[ids]  # copies just these rows out of the memory map
        blocks = raw.reshape(-1, self._type_size)
        with np.errstate(over="ignore"):  # an inf the data's scales produce is the result, as in ggml
            return self._dequant(blocks).reshape(len(ids), self._n_embd)

    # -- lifetime ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the file now instead of at garbage collection (lookups afterwards raise ArgumentError)."""
        self._table = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a view is still alive somewhere: the map closes when it goes
                pass
            self._mmap = None

    def __enter__(self) -> Embedding:
        """Use as a context manager that closes the map on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the map."""
        self.close()
