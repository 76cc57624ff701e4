"""SentencePiece's precompiled charsmap, the table a Unigram vocab normalises its text with.

The algorithm, plainly: the blob is a 4-byte little-endian size, that many bytes of an XOR-compressed
double array (XCDA) over UTF-8 bytes, then NUL-terminated replacement strings. Walking the array from
the root one byte at a time finds the longest key that prefixes the text; a leaf's next unit holds the
offset of its replacement. `Vocab.from_metadata` parses the blob (a blob too short for its header is a
FormatError at load); an index or offset outside the array fails when a walk reaches it, as in llama.cpp.
For the fast str normaliser, the characters that start or continue keys are found from the array itself
without listing every key.
"""

from __future__ import annotations

import numpy as np

from ...errors import FormatError
from ...gguffile.constants import Keys


class Charsmap:
    """SentencePiece's precompiled charsmap: an XOR-compressed double array (XCDA) over UTF-8 bytes
    whose leaves point at NUL-terminated replacement strings."""

    def __init__(self, blob: bytes, source: str = "<memory>") -> None:
        key = Keys.Tokenizer.PRECOMPILED_CHARSMAP
        if len(blob) < 4:
            raise FormatError("precompiled charsmap too small for its xcda size header", path=source, key=key)
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise FormatError(f"precompiled charsmap: xcda size {size} does not fit in {len(blob)} bytes",
                              path=source, key=key)
        n = size // 4
        self.units = np.frombuffer(blob, "<u4", count=n, offset=4).astype(np.int64)
        self._units: list[int] | None = None
        self.replacements = blob[4 + size:]

    # --- the XCDA as llama.cpp reads it -------------------------------------------------------
    @staticmethod
    def _base(p: int) -> int:
        return (p >> 10) << ((p & (1 << 9)) >> 6)

    def _unit(self, i: int) -> int:
        units = self._units
        if units is None:
            units = self._units = self.units.tolist()
        if i >= len(units):
            raise FormatError(f"precompiled charsmap: XCDA index {i} is out of bounds ({len(units)} units)",
                              key=Keys.Tokenizer.PRECOMPILED_CHARSMAP)
        return units[i]

    def longest_match(self, b: bytes, start: int) -> tuple[int, int]:
        """(length, replacement offset) of the longest charsmap key that prefixes b[start:], or (0, 0)."""
        unit, base = self._unit, self._base
        node = base(unit(0))
        length = offset = 0
        for i in range(start, len(b)):
            c = b[i]
            if c == 0:
                break
            node ^= c
            p = unit(node)
            if p & 0x800000FF != c:
                break
            node ^= base(p)
            if p & 0x100:  # leaf: the next node holds the replacement's offset
                length = i - start + 1
                offset = unit(node) & 0x7FFFFFFF
        return length, offset

    def replacement(self, offset: int) -> bytes:
        r = self.replacements
        key = Keys.Tokenizer.PRECOMPILED_CHARSMAP
        if offset >= len(r):
            raise FormatError(f"precompiled charsmap: replacement offset {offset} is out of bounds "
                              f"({len(r)} bytes of replacements)", key=key)
        end = r.find(b"\0", offset)
        if end < 0:
            raise FormatError(f"precompiled charsmap: the replacement at offset {offset} has no NUL terminator",
                              key=key)
        return r[offset:end]

    # --- what the fast path needs, found without listing every key ---------------------------------
    # (the array is built from a DAWG: a few ten thousand units can hold hundreds of thousands of keys)
    def _children(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every child of the nodes whose children sit at `offsets`: (row in offsets, label, unit index)."""
        u = self.units
        n = len(u)
        labels = np.arange(1, 256, dtype=np.int64)
        rows, labs, units = [], [], []
        for lo in range(0, len(offsets), 2048):
            idx = offsets[lo:lo + 2048, None] ^ labels[None, :]
            p = u[np.minimum(idx, n - 1)]
            r, c = np.nonzero((idx < n) & ((p & 0x800000FF) == labels[None, :]))
            rows.append(r + lo)
            labs.append(c + 1)
            units.append(idx[r, c])
        if not rows:
            return (np.zeros(0, np.int64),) * 3  # type: ignore[return-value]
        return np.concatenate(rows), np.concatenate(labs), np.concatenate(units)

    def next_chars(self, offsets: list[int]) -> tuple[list[tuple[int, str, int, int | None]], bool]:
        """The characters that continue the nodes at `offsets`: (row, char, child offset, replacement
        offset if a key ends with that char else None), and whether some key ends inside a character."""
        u = self.units
        n = len(u)
        out: list[tuple[int, str, int, int | None]] = []
        broken = False
        offs = np.array(offsets, np.int64)
        origin = list(range(len(offsets)))
        prefixes = [b""] * len(offsets)
        for _ in range(4):
            if not len(offs):
                break
            rows, labs, idx = self._children(offs)
            p = u[idx]
            child = idx ^ ((p >> 10) << ((p & (1 << 9)) >> 6))
            leaf = (p & 0x100) != 0
            value = np.where(child < n, u[np.minimum(child, n - 1)] & 0x7FFFFFFF, len(self.replacements))
            nxt_offs, nxt_origin, nxt_prefixes = [], [], []
            for r, lab, ch, lf, val in zip(rows.tolist(), labs.tolist(), child.tolist(), leaf.tolist(),
                                           value.tolist(), strict=True):
                pref = prefixes[r] + bytes((lab,))
                lead = pref[0]
                need = 1 if lead < 0x80 else 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else \
                    4 if 0xF0 <= lead < 0xF8 else 0
                if need == 0:
                    continue  # never at a character boundary of valid text
                if len(pref) < need:
                    broken |= lf
                    nxt_offs.append(ch)
                    nxt_origin.append(origin[r])
                    nxt_prefixes.append(pref)
                    continue
                try:
                    c = pref.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # not valid UTF-8: cannot occur in a str without surrogates
                out.append((origin[r], c, ch, val if lf else None))
            offs = np.array(nxt_offs, np.int64)
            origin, prefixes = nxt_origin, nxt_prefixes
        return out, broken

    def has_children(self, offsets: list[int]) -> list[bool]:
        rows, _, _ = self._children(np.array(offsets, np.int64))
        has = [False] * len(offsets)
        for r in set(rows.tolist()):
            has[r] = True
        return has

    @property
    def root(self) -> int:
        return self._base(int(self.units[0])) if len(self.units) else 0
