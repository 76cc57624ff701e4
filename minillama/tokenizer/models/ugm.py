"""Unigram (SentencePiece unigram, T5-style) as llama.cpp runs it: llm_tokenizer_ugm.

The algorithm, plainly: normalize the fragment (user-defined token prefixes kept verbatim, then the
longest match in the precompiled charsmap replaced, invalid UTF-8 bytes turned into U+FFFD; then
spaces become U+2581, with a dummy prefix and/or runs of spaces merged as the vocab says); then a
Viterbi pass over the normalized text, one UTF-8 code point at a time: the best-scoring split into
normal / user-defined (score 0) / unused tokens, where a code point no single token covers may be
the unknown token at (lowest normal score - 10); consecutive unknowns are emitted as one.

llama.cpp does this on UTF-8 bytes. For text that is valid Unicode (no surrogates) and a vocab whose
charsmap and user-defined tokens are valid UTF-8, working on str characters gives the same result,
which is the fast path. Everything else (lone surrogates in the text, which stand for raw bytes as
with surrogateescape, odd vocabs, a user-defined token sharing only part of a character's bytes
with the text) goes through a byte-level port of the same steps.

Made fast without changing an id: the normalized text is cut before each U+2581 whose left neighbour
never precedes U+2581 inside a token. No token spans such a cut, so every path of the lattice passes
through it, and the best path is the best path of each segment, joined (a run of unknowns across a
cut still becomes one). That holds for llama.cpp's double-precision sums too, provably, as long as no
sum is rounded: token scores are float32, so each is a multiple of 2**(e-24) for its exponent e; with
q the smallest such quantum over the vocab and M the largest |score|, every partial sum over n
characters is a multiple of q below n*M in magnitude, exact in a double when n*M <= 2**53 * q. Then
the order of additions cannot matter, and every comparison (ties included) is the one llama.cpp
makes. Fragments longer than that bound (`split_limit`, about 10**8 characters for a usual vocab) are
not cut. Segments are short and repeat, so their ids are cached.
"""

from __future__ import annotations

import math
import re
import sys
from array import array
from itertools import chain
from typing import TypeVar

import numpy as np
from gguf import Keys

from ...errors import FormatError
from ..vocab import TYPE_TO_ATTR, Attr, Vocab
from . import base
from .base import Model, last_cut_before

SPACE = "\u2581"
DBL_LOWEST = -sys.float_info.max  # llama.cpp's -DBL_MAX: the score of a position not reached yet
UNKNOWN_PENALTY = np.float32(10.0)
FFFD = "\ufffd".encode()

T = TypeVar("T", str, bytes)
_SURROGATE = re.compile("[\ud800-\udfff]")
_NO = object()  # "no such prefix" in the token prefix tables


def _utf8_len(lead: int) -> int:
    """unicode_len_utf8: the length a lead byte announces (continuation bytes count as 1)."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


def _utf8_valid_len(b: bytes, i: int) -> int:
    """Bytes in the code point at b[i] as llama.cpp's unicode_cpt_from_utf8 accepts it, 0 if it throws."""
    c, n = b[i], len(b)
    if c < 0x80:
        return 1
    if not c & 0x40:
        return 0
    k = 2 if not c & 0x20 else 3 if not c & 0x10 else 4 if not c & 0x08 else 0
    if k == 0 or i + k - 1 >= n:
        return 0
    return k if all(b[i + j] & 0xC0 == 0x80 for j in range(1, k)) else 0


def _to_bytes(text: str) -> bytes:
    """The UTF-8 bytes of text; surrogate escapes (U+DC80..U+DCFF) stand for raw bytes."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return b"".join(c.encode("utf-8", "surrogateescape" if "\udc80" <= c <= "\udcff" else "surrogatepass")
                        for c in text)


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


PREFIX_MAX = 64
"""Token prefixes are listed up to this many characters (bytes on the byte path); longer tokens are
found through their first PREFIX_MAX characters, so the tables grow linearly with the vocab's size
even for a token of 100,000 characters (every prefix of it would take gigabytes)."""


def _prefix_table(items: list[tuple[T, object]]) -> tuple[dict[T, object], dict[T, list[tuple[T, object]]]]:
    """(table, long): table maps every token of at most PREFIX_MAX units to its entry and every shorter
    prefix of a token to None (unless it is a token itself); long maps the first PREFIX_MAX units of each
    longer token to those tokens and their entries."""
    table: dict = {}
    long: dict = {}
    for t, entry in items:
        for k in range(1, min(len(t), PREFIX_MAX + 1)):
            table.setdefault(t[:k], None)
        if len(t) > PREFIX_MAX:
            table.setdefault(t[:PREFIX_MAX], None)
            long.setdefault(t[:PREFIX_MAX], []).append((t, entry))
        else:
            table[t] = entry
    return table, long


class _ByteTables:
    """Byte-level versions of the token and user-defined tables, for the exact slow path."""

    def __init__(self, model: UGMModel) -> None:
        self.tokens, self.long = _prefix_table([(_to_bytes(t), e) for t, e in model.byte_token_entries])
        self.max_len = max((len(k) for k in self.tokens), default=0)
        self.user: dict[int, dict] = {}
        for text in model.user_texts:
            node = self.user
            for c in _to_bytes(text):
                node = node.setdefault(c, {})


def _char_class(chars: set[str], ranges: list[tuple[int, int]], astral: bool = False) -> str:
    """A regex matching any of chars or of the code point ranges (inclusive).

    Consecutive code points become ranges and the BMP part gets its own class: sre tests a class
    that reaches past U+FFFF item by item, but a BMP-only one through a bitmap. With astral=True the
    result is one class of the BMP part and every astral code point (one item after the bitmap), a
    superset the caller narrows down."""
    spans = sorted([(ord(c), ord(c)) for c in chars] + [(a, min(b, 0x10FFFF)) for a, b in ranges])
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    bmp = [(a, min(b, 0xFFFF)) for a, b in merged if a <= 0xFFFF]
    far = [(max(a, 0x10000), b) for a, b in merged if b > 0xFFFF]

    def items(rs: list[tuple[int, int]]) -> str:
        return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in rs)

    if astral:
        return f"[{items(bmp)}{items([(0x10000, 0x10FFFF)])}]"
    return "|".join(f"[{items(rs)}]" for rs in (bmp, far) if rs)


def _freeze(root: dict) -> tuple[dict, frozenset[int]]:
    """A character trie as nodes (children, first UTF-8 bytes of the children), built without recursion
    (a user-defined token may be thousands of characters long)."""
    frozen: dict[int, tuple[dict, frozenset[int]]] = {}
    order, stack = [], [root]
    while stack:
        d = stack.pop()
        order.append(d)
        stack.extend(d.values())
    for d in reversed(order):  # children before their parents
        frozen[id(d)] = ({c: frozen[id(sub)] for c, sub in d.items()}, frozenset(c.encode()[0] for c in d))
    return frozen[id(root)]


def _exact_sum_limit(scores: list[float]) -> int:
    """The longest text (in characters) over which every sum of these float32 scores is exact in a double,
    0 when some score is not finite."""
    v = np.array(scores, np.float64)
    if not len(v) or not np.all(np.isfinite(v)):
        return 0
    top = float(np.abs(v).max())
    nz = v[v != 0]
    if not len(nz) or top == 0:
        return sys.maxsize
    _, e = np.frexp(nz)
    q = math.ldexp(1.0, int(e.min()) - 24)  # every score is a multiple of q
    return int(math.ldexp(q, 53) / top)


class UGMModel(Model):
    """llama.cpp's UGM (Unigram) tokenizer over a vocab with scores and a precompiled charsmap."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        md = vocab.metadata
        n = vocab.n_vocab
        # llama.cpp builds its tables from the attributes the token types give, before the
        # special-token-by-text pass adds bits; the runtime checks (user-defined score 0) use the final ones.
        types = md.get(Keys.Tokenizer.TOKEN_TYPE)
        if isinstance(types, np.ndarray) and len(types) >= n:
            init_attrs = [int(TYPE_TO_ATTR.get(int(t), Attr.UNDEFINED)) for t in types[:n].tolist()]
        else:
            init_attrs = [int(Attr.NORMAL)] * n
        scores = vocab.scores
        normal = np.fromiter((a & Attr.NORMAL for a in init_attrs), bool, n)
        normal_scores = scores[normal]
        normal_scores = normal_scores[~np.isnan(normal_scores)]  # std::min never picks a NaN
        min_score = np.float32(normal_scores.min() if len(normal_scores) else np.finfo(np.float32).max)
        self.unknown_score = float(np.float32(min_score - UNKNOWN_PENALTY))
        unk = vocab.special.get("unk")
        self.unk_id = -1 if unk is None else unk

        in_trie = int(Attr.NORMAL | Attr.USER_DEFINED | Attr.UNUSED)
        user = int(Attr.USER_DEFINED)
        score_list = scores.tolist()
        entries = []  # (token text, (id, score as llama.cpp adds it))
        for i, (t, a) in enumerate(zip(vocab.tokens, init_attrs, strict=True)):
            if a & in_trie:
                entries.append((t, (i, 0.0 if vocab.attrs[i] & user else score_list[i])))
        self.byte_token_entries = entries
        self.user_texts = [t for t, a in zip(vocab.tokens, init_attrs, strict=True) if a & user]

        # str-level tables (fast path): every token prefix -> (id, score) for tokens, None for mere prefixes
        # (surrogates can only match text that is not valid UTF-8: the byte path handles those)
        self.table, self.long = _prefix_table([(t, e) for t, e in entries if not _SURROGATE.search(t)])
        self.split_limit = _exact_sum_limit([e[1] for _, e in entries] + [self.unknown_score])
        keep = {t[k - 1] for t, _ in entries for k in range(1, len(t)) if t[k] == SPACE}
        left = f"[^{''.join(re.escape(c) for c in sorted(keep))}]" if keep else "."
        self._cut = re.compile(f"(?<={left})(?={SPACE})", re.DOTALL)
        self._cut_all = not keep

        self.escape_whitespaces = vocab.escape_whitespaces
        self.add_space_prefix = vocab.add_space_prefix
        self.remove_extra_whitespaces = vocab.remove_extra_whitespaces
        self.treat_whitespace_as_suffix = False  # llama.cpp never reads it from a GGUF

        blob = md.get(Keys.Tokenizer.PRECOMPILED_CHARSMAP)
        self.charsmap: Charsmap | None = None
        if blob is not None and not (isinstance(blob, np.ndarray) and blob.size == 0):
            arr = blob if isinstance(blob, np.ndarray) else None
            if arr is None or arr.ndim != 1 or arr.dtype.itemsize != 1 or arr.dtype.kind not in "iu":
                found = f"an array of {arr.dtype}" if arr is not None else type(blob).__name__
                raise FormatError(f"precompiled charsmap is {found}, expected an int8/uint8 array",
                                  key=Keys.Tokenizer.PRECOMPILED_CHARSMAP)
            self.charsmap = Charsmap(np.ascontiguousarray(arr).view(np.uint8).tobytes())
        self._bytes: _ByteTables | None = None
        self._build_fast_normalizer()

    # --- fast (str) normalizer ---------------------------------------------------------------
    def _build_fast_normalizer(self) -> None:
        """What normalizing str needs: the characters the charsmap maps on their own (single), those
        that start longer keys (multi), the characters that can follow in a longer key (seconds), the
        user-defined trie; and a regex finding every place where something other than copying may
        happen: a single or user-defined character, or a `seconds` one (a key may start just before it)."""
        self.fast_ok = True
        self.single: dict[str, str | None] = {}
        self.multi: set[str] = set()
        starts: set[str] = set()
        seconds: set[str] = set()
        ranges: list[tuple[int, int]] = []
        cm = self.charsmap
        if cm is not None and len(cm.units):
            firsts, broken = cm.next_chars([cm.root])
            for _, c, _, val in firsts:
                if val is not None:
                    self.single[c] = self._replacement_str(val)
                    starts.add(c)
            has = cm.has_children([ch for _, _, ch, _ in firsts])
            nodes = sorted({ch for (_, _, ch, _), h in zip(firsts, has, strict=True) if h})
            self.multi = {c for (_, c, _, _), h in zip(firsts, has, strict=True) if h}
            if nodes:
                nexts, broken2 = cm.next_chars(nodes)
                seconds = {c for _, c, _, _ in nexts}
                broken |= broken2
            if broken:  # a key ending inside a character: only the byte path follows llama.cpp there
                self.fast_ok = False
                return
        # user-defined trie over characters; each node also knows the first UTF-8 bytes of its
        # children, to notice llama.cpp's byte-wise partial matches (which go to the byte path)
        self.user_trie: tuple[dict, frozenset[int]] | None = None
        if self.user_texts:
            if any(_SURROGATE.search(t) for t in self.user_texts):
                self.fast_ok = False
                return
            root: dict = {}
            for t in self.user_texts:
                node = root
                for c in t:
                    node = node.setdefault(c, {})

            self.user_trie = _freeze(root)
            for c in root:
                lead = c.encode()[0]
                starts.add(c)
                if lead >= 0xF0:
                    lo = (lead & 0x07) << 18
                    ranges.append((lo, lo + 0x3FFFF))
                elif lead >= 0xE0:
                    lo = (lead & 0x0F) << 12
                    ranges.append((lo, lo + 0xFFF))
                elif lead >= 0xC0:
                    lo = (lead & 0x1F) << 6
                    ranges.append((lo, lo + 0x3F))
        self.seconds = seconds
        self.plain_map: dict[str, str] = {}
        self._plain_ascii: frozenset[str] = frozenset()
        self._plain_rx: re.Pattern[str] | None = None
        if cm is not None and len(cm.units) and self.user_trie is None:
            self.plain_map = {c: r for c, r in self._plain_map(cm).items() if c <= "\uffff"}
            starts -= set(self.plain_map)
            self._plain_ascii = frozenset(c for c in self.plain_map if c < "\x80")
            rest = set(self.plain_map) - self._plain_ascii
            if rest:
                self._plain_rx = re.compile(_char_class(rest, []))
        cls = _char_class(starts | seconds, ranges)
        self.candidates = re.compile(cls) if cls else None
        # What the scan searches for: the BMP candidates and every astral character, in one class (sre
        # scans a BMP bitmap fast; an alternation or a long list of astral ranges would be tested at every
        # position); an astral match that is no candidate is copied as it is.
        self._scan = re.compile(_char_class(starts | seconds, ranges, astral=True)) if cls else None

    def _plain_map(self, cm: Charsmap) -> dict[str, str]:
        """The characters one str.translate may replace before the scan, the result unchanged: a character
        whose key is itself alone (no key starts with it or holds it after its first character) and whose
        replacement holds no character the scan would act on."""
        firsts, _ = cm.next_chars([cm.root])
        inner: set[str] = set()
        level = sorted({ch for _, _, ch, _ in firsts})
        seen = set(level)
        while level:
            nexts, _ = cm.next_chars(level)
            level = []
            for _, c, ch, _ in nexts:
                inner.add(c)
                if ch not in seen:
                    seen.add(ch)
                    level.append(ch)
        active = set(self.single) | self.multi | inner
        return {c: r for c, r in self.single.items()  # type: ignore[misc]
                if r is not None and c not in self.multi and c not in inner and not (set(r) & active)}

    def _replacement_str(self, offset: int) -> str | None:
        """A charsmap replacement as str; None when it is broken or not UTF-8 (the byte path then decides)."""
        assert self.charsmap is not None
        try:
            return self.charsmap.replacement(offset).decode("utf-8")
        except (FormatError, UnicodeDecodeError):
            return None

    def _normalize_chars(self, text: str) -> str | None:
        """Charsmap and user-defined prefixes applied to str; None when only the byte path is exact."""
        plain = self.plain_map
        for c in self._plain_ascii.intersection(text):  # a few str.replace (\n, \t) beat a callback per match
            text = text.replace(c, plain[c])
        if self._plain_rx is not None:
            text = self._plain_rx.sub(lambda m: plain[m.group()], text)
        rx = self._scan
        if rx is None:
            return text
        cand = self.candidates.match  # type: ignore[union-attr]
        out: list[str] = []
        single, multi, seconds, user = self.single, self.multi, self.seconds, self.user_trie
        pos, n = 0, len(text)
        search = rx.search
        while True:
            m = search(text, pos)
            if m is None:
                out.append(text[pos:])
                break
            j = m.start()
            if text[j] > "\uffff" and not cand(text, j):
                out.append(text[pos:j + 1])
                pos = j + 1
                continue
            if j > pos and text[j] in seconds and text[j - 1] in multi:
                j -= 1  # a longer key may start just before
            out.append(text[pos:j])
            c = text[j]
            if user is not None and (c in user[0] or c.encode()[0] in user[1]):
                node, k = user, j
                while k < n and text[k] in node[0]:
                    node = node[0][text[k]]
                    k += 1
                if k < n and text[k].encode()[0] in node[1]:
                    return None  # the byte-wise walk would stop inside a character
                out.append(text[j:k])
                pos = k
                continue
            if c in multi and j + 1 < n and text[j + 1] in seconds:
                k, offset = self._longest_key(text, j)
                if k < 0:
                    return None
                if k > j:
                    r = self._replacement_str(offset)
                    if r is None:
                        return None
                    out.append(r)
                    pos = k
                    continue
            r = single.get(c, _NO)  # type: ignore[arg-type]
            if r is _NO:
                out.append(c)
            elif r is None:
                return None
            else:
                out.append(r)  # type: ignore[arg-type]
            pos = j + 1
        return "".join(out)

    def _longest_key(self, text: str, j: int) -> tuple[int, int]:
        """(end, replacement offset) of the longest charsmap key at text[j:] by the byte walk itself:
        end is j when there is none, -1 when it ends inside a character."""
        assert self.charsmap is not None
        width = 8
        while True:
            b = text[j:j + width].encode()
            length, offset = self.charsmap.longest_match(b, 0)
            if length == len(b) and j + width < len(text):
                width *= 4  # the key may go on past the chunk
                continue
            if length == 0:
                return j, 0
            try:
                key = b[:length].decode()
            except UnicodeDecodeError:
                return -1, 0
            return j + len(key), offset

    def _whitespace(self, s: str, space: str) -> str:
        """normalize()'s space handling over the already-mapped text."""
        if self.remove_extra_whitespaces:
            out = "".join([space + w for w in s.split(" ") if w])
        elif self.add_space_prefix and not self.treat_whitespace_as_suffix:
            body = s.lstrip(" ")
            out = space * (len(s) - len(body)) + space + body.replace(" ", space) if body else s.replace(" ", space)
        else:
            out = s.replace(" ", space)
        if self.treat_whitespace_as_suffix and self.add_space_prefix:
            out += space
        return out

    # --- Model interface -----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Normalize the fragment, cut it where no token spans (see the module docstring), Viterbi per segment."""
        ids = None
        if self.fast_ok and not _SURROGATE.search(text):
            mapped = self._normalize_chars(text)
            if mapped is not None:
                s = self._whitespace(mapped, SPACE if self.escape_whitespaces else " ")
                if len(s) > self.split_limit:
                    ids = self._viterbi(s)
                elif len(s) <= base.CHUNK_CHARS:
                    segs = self._segments(s)
                    ids = self._viterbi(s) if len(segs) == 1 else self._join(segs)
                else:  # huge: a piece of segments at a time; a run of unknowns across pieces is one
                    ids = []
                    for piece in base.pieces(s, self._cut_at):
                        more = self._join(self._segments(piece))
                        if ids and more and ids[-1] == self.unk_id == more[0]:
                            del more[0]
                        ids += more
        if ids is None:
            ids = self._viterbi_bytes(self._normalize_bytes(_to_bytes(text)))
        if self.unk_id < 0 and -1 in ids:
            raise FormatError(f"this Unigram vocab has no unknown-token id, and no token covers part of {text[:40]!r} "
                              "(llama.cpp would emit the invalid id -1)", key=Keys.Tokenizer.UNK_ID)
        return ids

    def _segments(self, s: str) -> list[str]:
        """s cut before every U+2581 that no token holds after its left neighbour."""
        if self._cut_all:  # a cut before every U+2581 but the first character
            head, *rest = s.split(SPACE)
            segs = [SPACE + w for w in rest]
            if head:
                segs.insert(0, head)
            return segs
        return self._cut.split(s)

    def _cut_at(self, s: str, lo: int, hi: int) -> int | None:
        """The last cut of _segments before a U+2581 in [lo, hi)."""
        return last_cut_before(SPACE, self._segments, s, lo, hi)

    def _join(self, segs: list[str]) -> list[int]:
        """The ids of each segment (cached), joined; an unknown ending one segment absorbs one starting the next."""
        got = list(map(self._cache.get, segs))
        if None in got:
            self._fill(segs, got, self._viterbi)
        ids = list(chain.from_iterable(got))  # type: ignore[arg-type]
        unk = self.unk_id
        if unk in ids:  # no segment holds two unknowns in a row: only a cut can, and there one goes
            i = ids.index(unk)
            try:
                while True:
                    if i + 1 < len(ids) and ids[i + 1] == unk:
                        del ids[i + 1]
                    else:
                        i = ids.index(unk, i + 1)
            except ValueError:
                pass
        return ids

    def encode_escaped(self, text: str) -> list[int]:
        """Raw bytes go to the byte-level path, which reads them as llama.cpp does."""
        return self.encode(text)

    # --- Viterbi over characters -----------------------------------------------------------------
    def _viterbi(self, s: str) -> list[int]:
        """The best split of s (llama.cpp's tokenize loop over code points, here characters)."""
        n = len(s)
        if n == 0:
            return []
        unk, unk_score = self.unk_id, self.unknown_score
        # machine floats and ints past a few thousand characters (a list holds an object per score
        # and per start: ~60 bytes a character more); tok keeps the vocab's shared int objects.
        best: list[float] | array = [DBL_LOWEST] * (n + 1) if n < 1 << 12 else array("d", [DBL_LOWEST]) * (n + 1)
        best[0] = 0.0
        tok = [unk] * (n + 1)
        start: list[int] | array = [0] * (n + 1) if n < 1 << 12 else array("q", [0]) * (n + 1)
        get = self.table.get
        for i in range(n):
            cur = best[i]
            i1 = i + 1
            e = get(s[i], _NO)
            if e is None or e is _NO:  # no one-character token: the unknown token may cover it
                v = cur + unk_score
                if v > best[i1]:
                    best[i1], tok[i1], start[i1] = v, unk, i
                if e is _NO:
                    continue
            else:
                v = cur + e[1]  # type: ignore[index]
                if v > best[i1]:
                    best[i1], tok[i1], start[i1] = v, e[0], i  # type: ignore[index]
            j = i + 2
            while j <= n:
                e = get(s[i:j], _NO)
                if e is _NO:
                    break
                if e is not None:
                    v = cur + e[1]  # type: ignore[index]
                    if v > best[j]:
                        best[j], tok[j], start[j] = v, e[0], i  # type: ignore[index]
                if j - i == PREFIX_MAX:
                    self._long_matches(s, i, self.long, best, tok, start)
                    break
                j += 1
        return self._backtrack(tok, start, n)

    @staticmethod
    def _long_matches(s: T, i: int, long: dict, best: list[float], tok: list[int], start: list[int]) -> None:
        """The Viterbi step from i for tokens longer than PREFIX_MAX (their order does not matter: each
        ends at its own position)."""
        cur = best[i]
        for t, e in long.get(s[i:i + PREFIX_MAX], ()):
            if s.startswith(t, i):  # type: ignore[attr-defined]
                j = i + len(t)
                v = cur + e[1]
                if v > best[j]:
                    best[j], tok[j], start[j] = v, e[0], i

    def _backtrack(self, tok: list[int], start: list[int], end: int) -> list[int]:
        unk = self.unk_id
        out: list[int] = []
        prev_unk = False
        while True:
            t = tok[end]
            is_unk = t == unk
            if not (prev_unk and is_unk):
                out.append(t)
            if start[end] == 0:
                break
            prev_unk = is_unk
            end = start[end]
        out.reverse()
        return out

    # --- exact byte-level path -----------------------------------------------------------------
    def _byte_tables(self) -> _ByteTables:
        bt = self._bytes
        if bt is None:
            bt = self._once("_bytes", lambda: _ByteTables(self))
        return bt

    def _normalize_bytes(self, b: bytes, src: list[int] | None = None) -> bytes:
        """llm_tokenizer_ugm_session::normalize, byte for byte. With src, also the index in b of the byte
        each output byte comes from (-1 for a space marker no space stands for): character offsets."""
        bt = self._byte_tables()
        cm = self.charsmap
        mapped = bytearray()
        i, n = 0, len(b)
        while i < n:
            start = i
            node, k = bt.user, i
            while k < n and b[k] in node:  # naive_trie::get_longest_prefix: the deepest node, token or not
                node = node[b[k]]
                k += 1
            if k > i:
                mapped += b[i:k]
                i = k
            elif cm is not None and (match := cm.longest_match(b, i))[0]:
                mapped += cm.replacement(match[1])
                i += match[0]
            else:
                k = _utf8_valid_len(b, i)
                if k:
                    mapped += b[i:i + k]
                    i += k
                else:
                    mapped += FFFD
                    i += 1
            if src is not None:
                src += [start] * (len(mapped) - len(src))
        space = SPACE.encode() if self.escape_whitespaces else b" "
        if src is not None:
            return self._whitespace_mapped(bytes(mapped), space, src)
        return self._whitespace(mapped.decode("latin-1"), space.decode("latin-1")).encode("latin-1")

    def _whitespace_mapped(self, s: bytes, space: bytes, src: list[int]) -> bytes:
        """_whitespace over bytes, rewriting src alongside: a space marker comes from the space before
        its word (the last one of a run), or from nothing (-1) when it is the dummy prefix."""
        out = bytearray()
        pos: list[int] = []
        marks = [src[k] if c == 0x20 else None for k, c in enumerate(s)]
        if self.remove_extra_whitespaces:
            last_space = -1
            k, n = 0, len(s)
            while k < n:
                if s[k] == 0x20:
                    last_space = marks[k]  # type: ignore[assignment]
                    k += 1
                    continue
                j = s.find(b" ", k)
                j = n if j < 0 else j
                out += space
                pos += [last_space] * len(space)
                out += s[k:j]
                pos += src[k:j]
                last_space = -1
                k = j
        else:
            lead = len(s) - len(s.lstrip(b" ")) if self.add_space_prefix and s.strip(b" ") else -1
            for k, c in enumerate(s):
                if k == lead:
                    out += space
                    pos += [-1] * len(space)
                if c == 0x20:
                    out += space
                    pos += [src[k]] * len(space)
                else:
                    out.append(c)
                    pos.append(src[k])
        if self.treat_whitespace_as_suffix and self.add_space_prefix:
            out += space
            pos += [-1] * len(space)
        src[:] = pos
        return bytes(out)

    def _viterbi_bytes(self, s: bytes) -> list[int]:
        n = len(s)
        if n == 0:
            return []
        bt = self._byte_tables()
        table, max_len, unk, unk_score = bt.tokens, bt.max_len, self.unk_id, self.unknown_score
        # machine floats and ints past a few thousand characters (a list holds an object per score
        # and per start: ~60 bytes a character more); tok keeps the vocab's shared int objects.
        best: list[float] | array = [DBL_LOWEST] * (n + 1) if n < 1 << 12 else array("d", [DBL_LOWEST]) * (n + 1)
        best[0] = 0.0
        tok = [unk] * (n + 1)
        start: list[int] | array = [0] * (n + 1) if n < 1 << 12 else array("q", [0]) * (n + 1)
        i = 0
        while i < n:
            units = min(_utf8_len(s[i]), n - i)
            cur = best[i]
            single = False
            for j in range(i + 1, min(n, i + max_len) + 1):
                e = table.get(s[i:j], _NO)
                if e is _NO:
                    break
                if e is not None:
                    if j - i == units:
                        single = True
                    v = cur + e[1]  # type: ignore[index]
                    if v > best[j]:
                        best[j], tok[j], start[j] = v, e[0], i  # type: ignore[index]
                if j - i == PREFIX_MAX:
                    self._long_matches(s, i, bt.long, best, tok, start)
            if not single:
                v = cur + unk_score
                if v > best[i + units]:
                    best[i + units], tok[i + units], start[i + units] = v, unk, i
            i += units
        return self._backtrack(tok, start, n)
