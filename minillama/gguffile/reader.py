"""Read the metadata of a GGUF file (v2/v3) without touching tensor data.

The gguf package's GGUFReader builds a numpy view per array item, which takes seconds on a
128k-token vocab; here string arrays are parsed in one pass over a memory map, numeric arrays
become one numpy view each, and every length is checked against the bytes that remain before
anything is allocated, so a hostile file fails with FormatError instead of a memory bomb.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from ..errors import FormatError, UnsupportedError
from ..fileio import input_path
from .constants import GGUF_MAGIC, GGUFValueType, Keys
from .dtypes import FILE_DTYPES

SUPPORTED_VERSIONS = (2, 3)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

#: The string arrays read_gguf(lazy=True) keeps as one joined text until an item is asked for (JoinedStrings):
#: a BPE vocab's merges, which the native core reads as one text (llama 3's 280k: one object, not 280k to make
#: and, later, to free: 10-14 ms of a fresh tokenizer's life).
LAZY_STRING_ARRAYS = frozenset({Keys.Tokenizer.MERGES})


class JoinedStrings(Sequence[str]):
    """n strings, none holding a NUL, kept as one text joined by NUL; split into a list on first item access."""

    __slots__ = ("_text", "_n", "_items")

    def __init__(self, text: str, n: int) -> None:
        self._text, self._n, self._items = text, n, None

    def joined(self, sep: str) -> str:
        """The strings joined by sep (without splitting them first)."""
        return self._text.replace("\x00", sep) if self._items is None else sep.join(self._items)

    def _list(self) -> list[str]:
        if self._items is None:
            self._items = self._text.split("\x00") if self._n else []
        return self._items

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        return self._list()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._list())

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JoinedStrings):
            return self._n == other._n and self.joined("\x00") == other.joined("\x00")
        return isinstance(other, (list, tuple)) and self._list() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JoinedStrings({self._n} strings)"


def join_strings(items: Sequence[str], sep: str) -> str:
    """sep.join(items), without splitting a JoinedStrings first."""
    return items.joined(sep) if isinstance(items, JoinedStrings) else sep.join(items)


@dataclass
class TensorInfo:
    """One entry of the tensor table: where a tensor's data lies, not the data."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the data section


@dataclass
class GGUFFile:
    """Metadata of a GGUF file: key/value pairs in file order and the tensor table."""

    path: str
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, GGUFValueType]
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0
    alignment: int = 32


class _Cursor:
    """Bounds-checked little-endian reads over a buffer, naming the key being read on failure."""

    def __init__(self, buf: memoryview | bytes, path: str, lazy: frozenset[str] = frozenset()) -> None:
        self.buf, self.pos, self.size, self.path, self.lazy = buf, 0, len(buf), path, lazy
        self.key: str | None = None

    def fail(self, message: str) -> FormatError:
        return FormatError(message, path=self.path, offset=self.pos, key=self.key)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated file (an incomplete download?): {what} needs {n} bytes, {self.size - self.pos} "
                            "remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def string(self, what: str) -> str:
        return self.raw_string(what).decode("utf-8", "surrogateescape")

    def value_type(self, what: str) -> GGUFValueType:
        t = self.u32(what)
        try:
            return GGUFValueType(t)
        except ValueError:
            raise self.fail(f"unknown value type {t} for {what}, expected 0..12") from None

    def scalar(self, vtype: GGUFValueType) -> Any:
        dt = FILE_DTYPES[vtype]
        self.need(dt.itemsize, vtype.name)
        v = np.frombuffer(self.buf, dt, 1, self.pos)[0].item()
        self.pos += dt.itemsize
        return bool(v) if vtype == GGUFValueType.BOOL else v

    def string_array(self, n: int) -> list[str] | JoinedStrings:
        # Each item is at least its 8-byte length: reject impossible counts before allocating.
        self.need(8 * n, f"array of {n} strings")
        if n >= 1024:
            fast = self._string_array_fast(n)
            if fast is not None:
                return fast
        buf, pos, out = self.buf, self.pos, []
        append, unpack, size = out.append, _U64.unpack_from, self.size
        for _ in range(n):
            if pos + 8 > size:
                self.pos = pos
                raise self.fail(f"truncated file: array of {n} strings ends after {len(out)}")
            ln = unpack(buf, pos)[0]
            pos += 8
            end = pos + ln
            if end > size:
                self.pos = pos
                raise self.fail(f"truncated file: string of {ln} bytes, {size - pos} remain")
            append(str(buf[pos:end], "utf-8", "surrogateescape"))
            pos = end
        self.pos = pos
        return out

    def _string_array_fast(self, n: int) -> list[str] | JoinedStrings | None:
        """Vocab-sized string arrays in a few numpy passes (None: use the plain loop).

        When every string is under 64 KiB and holds no NUL byte, the only zero bytes are in the
        length prefixes, and the six high bytes of each prefix end a run of at least six zeros:
        the first n such runs locate all n prefixes at once, the chain
        start[i+1] = start[i] + 8 + len[i] and a count of zeros check that reading, and one
        decode plus one split yields the strings. Any surprise falls back to the plain loop.
        """
        start, avail = self.pos, self.size - self.pos
        width = min(avail, n * 20)
        while True:
            window = np.frombuffer(self.buf, np.uint8, width, start)
            zeros = np.flatnonzero(window == 0)
            if len(zeros):
                breaks = np.flatnonzero(np.diff(zeros) != 1)
                run_end = np.append(zeros[breaks], zeros[-1])
                run_len = np.diff(np.concatenate(([-1], breaks, [len(zeros) - 1])))
                heads = run_end[run_len >= 6][:n] - 7
            else:
                heads = zeros
            if len(heads) == n or width == avail:
                break
            width = min(avail, width * 2)
        if len(heads) != n or heads[0] != 0:
            return None
        low, high = window[heads].astype(np.int64), window[heads + 1].astype(np.int64)
        ends = heads + 8 + low + (high << 8)
        if not (ends[:-1] == heads[1:]).all() or ends[-1] > width:
            return None
        end = int(ends[-1])
        if np.count_nonzero(zeros < end) != 6 * n + np.count_nonzero(low == 0) + np.count_nonzero(high == 0):
            return None  # some string holds a NUL byte
        keep = np.ones(end, bool)
        for k in range(1, 8):
            keep[heads + k] = False
        data = window[:end].copy()
        data[heads] = 0
        text = data[keep][1:].tobytes().decode("utf-8", "surrogateescape")
        if self.key in self.lazy:
            if text.count("\x00") != n - 1:
                return None
            self.pos = start + end
            return JoinedStrings(text, n)  # type: ignore[return-value]
        out = text.split("\x00")
        if len(out) != n:
            return None
        self.pos = start + end
        return out

    def value(self, vtype: GGUFValueType, depth: int = 0) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string("string value")
        if vtype != GGUFValueType.ARRAY:
            return self.scalar(vtype)
        itype = self.value_type("array item type")
        n = self.u64("array length")
        if itype == GGUFValueType.STRING:
            return self.string_array(n)
        if itype == GGUFValueType.ARRAY:
            if depth > 2:
                raise self.fail("arrays nested more than 3 deep")
            self.need(12 * n, f"array of {n} arrays")
            return [self.value(GGUFValueType.ARRAY, depth + 1) for _ in range(n)]
        dt = FILE_DTYPES[itype]
        self.need(dt.itemsize * n, f"array of {n} {itype.name}")
        # A copy: metadata must outlive the memory map it was read from.
        arr = np.frombuffer(self.buf, dt, n, self.pos).copy()
        self.pos += dt.itemsize * n
        return arr.astype(bool) if itype == GGUFValueType.BOOL else arr


def is_gguf(head: bytes) -> bool:
    """True when the first bytes of a file are the GGUF magic."""
    return len(head) >= 4 and struct.unpack_from("<I", head)[0] == GGUF_MAGIC


def read_gguf(path: str | os.PathLike[str], *, tensors: bool = True, lazy: bool = False) -> GGUFFile:
    """Parse the header, all metadata and (optionally) the tensor table of a GGUF file. lazy: the arrays of
    LAZY_STRING_ARRAYS come as JoinedStrings (a Sequence, not a list) where they can."""
    path = input_path(path, "GGUF file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise FormatError("empty file, expected a GGUF header", path=path, offset=0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                return _parse(buf, path, tensors, LAZY_STRING_ARRAYS if lazy else frozenset())
            finally:
                buf.release()


def _parse(buf: memoryview, path: str, want_tensors: bool, lazy: frozenset[str] = frozenset()) -> GGUFFile:
    c = _Cursor(buf, path, lazy)
    magic = c.u32("magic")
    if magic != GGUF_MAGIC:
        raise FormatError(f"not a GGUF file: magic {magic:#010x}, expected {GGUF_MAGIC:#010x} ('GGUF')",
                          path=path, offset=0)
    version = c.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version == 1:
            raise UnsupportedError(f"{path}: GGUF version 1 is not supported, expected 2 or 3")
        if version & 0xFFFF == 0 and struct.unpack(">I", struct.pack("<I", version))[0] in (1, 2, 3):
            raise UnsupportedError(f"{path}: big-endian GGUF (version field {version:#010x}) is not supported, "
                                   "expected a little-endian GGUF v2 or v3")
        raise FormatError(f"GGUF version {version}, expected 2 or 3", path=path, offset=4)
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata count")
    # Every key/value needs at least 12 bytes, every tensor info at least 24: impossible counts fail
    # here, before anything is read or allocated (whether or not the tensor table is wanted).
    c.need(12 * n_kv, f"{n_kv} metadata entries")
    c.need(12 * n_kv + 24 * n_tensors, f"{n_kv} metadata entries and {n_tensors} tensor infos")
    metadata: dict[str, Any] = {}
    types: dict[str, GGUFValueType] = {}
    for _ in range(n_kv):
        c.key = None
        at = c.pos
        key = c.string("metadata key")
        if key in metadata:  # ggml's gguf reader refuses these too
            raise FormatError(f"duplicate metadata key {key!r}", path=path, offset=at, key=key)
        c.key = key
        vtype = c.value_type("value type")
        metadata[key] = c.value(vtype)
        types[key] = vtype
    c.key = None
    alignment = metadata.get(Keys.General.ALIGNMENT, 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise FormatError(f"general.alignment {alignment!r}, expected a power of two", path=path)
    result = GGUFFile(path, version, metadata, types, alignment=alignment)
    if not want_tensors:
        return result
    c.need(24 * n_tensors, f"{n_tensors} tensor infos")
    names: set[str] = set()
    for _ in range(n_tensors):
        at = c.pos
        name = c.string("tensor name")
        if name in names:
            raise FormatError(f"duplicate tensor name {name!r}", path=path, offset=at, key=name)
        names.add(name)
        c.key = name
        n_dims = c.u32("tensor dims")
        if n_dims > 8:
            raise c.fail(f"tensor has {n_dims} dimensions, expected at most 8")
        shape = tuple(c.u64("tensor dim") for _ in range(n_dims))
        ggml_type = c.u32("tensor type")
        offset = c.u64("tensor offset")
        result.tensors.append(TensorInfo(name, shape, ggml_type, offset))
    result.data_offset = (c.pos + alignment - 1) // alignment * alignment
    return result
