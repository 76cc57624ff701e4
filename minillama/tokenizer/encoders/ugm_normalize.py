"""Unigram normalisation as llama.cpp does it: llm_tokenizer_ugm_session::normalize.

The algorithm, plainly: walk the text left to right; where a user-defined token's text begins (the
longest prefix in a trie of them, token or not), copy it verbatim; else replace the longest key of the
precompiled charsmap that starts here by its replacement; else copy one valid UTF-8 code point, or
turn an invalid byte into U+FFFD. Then spaces become U+2581 (or stay spaces without
escape_whitespaces): runs merged and leading/trailing ones dropped with remove_extra_whitespaces,
else a dummy U+2581 before the first non-space when add_space_prefix asks for one.

Two normalisers do this. `_normalize_bytes` is the byte-level port, exact on any input (raw bytes,
odd vocabs), and can also say which input byte each output byte comes from (for offsets).
`_normalize_chars` is the fast one over str, for valid text and a vocab whose charsmap and
user-defined tokens are valid UTF-8: characters the charsmap maps on their own, and that no longer
key can involve, are replaced first (str.replace, one regex; not the ones it deletes, which would
join their neighbours into a key llama.cpp never sees), then a regex finds every place where anything but copying may happen and
only those are looked at; it returns None where only the byte path is exact (a user-defined prefix or
charsmap key ending inside a character).
"""

from __future__ import annotations

import re

from ...errors import FormatError
from .. import unicode_data as ud
from ..text import SPACE, SURROGATES, to_bytes
from ..vocab import Vocab
from .ugm_charsmap import Charsmap

FFFD = "\ufffd".encode()

_NO = object()  # "no such entry" (the charsmap's single map here, the token prefix tables in ugm.py)


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


def _byte_trie(texts: list[str]) -> dict[int, dict]:
    """The user-defined texts as a trie over their UTF-8 bytes (surrogate escapes as raw bytes)."""
    root: dict[int, dict] = {}
    for text in texts:
        node = root
        for c in to_bytes(text):
            node = node.setdefault(c, {})
    return root


def _char_class(chars: set[str], ranges: list[tuple[int, int]], astral: bool = False) -> str:
    """A regex matching any of chars or of the code point ranges (inclusive).

    Consecutive code points become ranges and the BMP part gets its own class: sre tests a class
    that reaches past U+FFFF item by item, but a BMP-only one through a bitmap. With astral=True the
    result is one class of the BMP part and every astral code point (one item after the bitmap), a
    superset the caller narrows down."""
    merged = ud.merge_ranges([(ord(c), ord(c)) for c in chars] + [(a, min(b, 0x10FFFF)) for a, b in ranges])
    bmp = [(a, min(b, 0xFFFF)) for a, b in merged if a <= 0xFFFF]
    far = [(max(a, 0x10000), b) for a, b in merged if b > 0xFFFF]

    def items(rs: list[tuple[int, int]]) -> str:
        return ud.ranges_class(rs, literal=True)

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


class UGMNormalizer:
    """The two normalisers of a Unigram encoder (UGMEncoder derives from this): the tables they need are
    built from the vocab by `_init_normalizer`."""

    byte_token_entries: list[tuple[str, tuple[int, float]]]
    user_texts: list[str]

    def _init_normalizer(self, vocab: Vocab) -> None:
        self.escape_whitespaces = vocab.escape_whitespaces
        self.add_space_prefix = vocab.add_space_prefix
        self.remove_extra_whitespaces = vocab.remove_extra_whitespaces
        self.treat_whitespace_as_suffix = False  # llama.cpp never reads it from a GGUF
        self.charsmap: Charsmap | None = vocab.charsmap
        self._user_bytes: dict[int, dict] | None = None
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
        self.seconds: set[str] = set()
        starts: set[str] = set()
        ranges: list[tuple[int, int]] = []
        cm = self.charsmap
        has_keys = cm is not None and len(cm.units) > 0
        if has_keys and not self._charsmap_starts(starts):  # type: ignore[arg-type]
            self.fast_ok = False  # a key ending inside a character: only the byte path follows llama.cpp there
            return
        self.user_trie: tuple[dict, frozenset[int]] | None = None
        if self.user_texts and not self._user_starts(starts, ranges):
            self.fast_ok = False
            return
        self.plain_map: dict[str, str] = {}
        self._plain_ascii: frozenset[str] = frozenset()
        self._plain_rx: re.Pattern[str] | None = None
        if has_keys and self.user_trie is None:
            self._plain_tables(cm, starts)  # type: ignore[arg-type]
        cls = _char_class(starts | self.seconds, ranges)
        self.candidates = re.compile(cls) if cls else None
        # What the scan searches for: the BMP candidates and every astral character, in one class (sre
        # scans a BMP bitmap fast; an alternation or a long list of astral ranges would be tested at every
        # position); an astral match that is no candidate is copied as it is.
        self._scan = re.compile(_char_class(starts | self.seconds, ranges, astral=True)) if cls else None

    def _charsmap_starts(self, starts: set[str]) -> bool:
        """Fill single, multi and seconds from the charsmap, and add the single characters to starts;
        False when some key ends inside a character."""
        cm = self.charsmap
        assert cm is not None
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
            self.seconds = {c for _, c, _, _ in nexts}
            broken |= broken2
        return not broken

    def _user_starts(self, starts: set[str], ranges: list[tuple[int, int]]) -> bool:
        """The user-defined trie over characters; each node also knows the first UTF-8 bytes of its
        children, to notice llama.cpp's byte-wise partial matches (which go to the byte path). Its first
        characters join starts, and every character sharing a first one's lead byte joins ranges.
        False when a user-defined text holds surrogates."""
        if any(SURROGATES.search(t) for t in self.user_texts):
            return False
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
        return True

    def _plain_tables(self, cm: Charsmap, starts: set[str]) -> None:
        """plain_map (BMP characters replaced before the scan; they leave starts), the ASCII ones (for
        str.replace) and a regex finding the others."""
        self.plain_map = {c: r for c, r in self._plain_map(cm).items() if c <= "\uffff"}
        starts -= set(self.plain_map)
        self._plain_ascii = frozenset(c for c in self.plain_map if c < "\x80")
        rest = set(self.plain_map) - self._plain_ascii
        if rest:
            self._plain_rx = re.compile(_char_class(rest, []))

    def _plain_map(self, cm: Charsmap) -> dict[str, str]:
        """The characters one str.translate may replace before the scan, the result unchanged: a character
        whose key is itself alone (no key starts with it or holds it after its first character) and whose
        replacement holds no character the scan would act on. A character the charsmap deletes (control
        characters under nmt_nfkc) is left to the scan whenever some key is longer than one character:
        deleting it first would join its neighbours ("d", U+0016, U+032D into "d" + U+032D, a key of its own),
        where llama.cpp matches keys over the text as it is and never across the deleted character."""
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
                if r is not None and (r or not self.multi) and c not in self.multi and c not in inner
                and not (set(r) & active)}

    def _replacement_str(self, offset: int) -> str | None:
        """A charsmap replacement as str; None when it is broken or not UTF-8 (the byte path then decides)."""
        assert self.charsmap is not None
        try:
            return self.charsmap.replacement(offset).decode("utf-8")
        except (FormatError, UnicodeDecodeError):
            return None

    def _normalize_chars(self, text: str) -> str | None:
        """Charsmap and user-defined prefixes applied to str; None when only the byte path is exact."""
        text = self._replace_plain(text)
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

    def _replace_plain(self, text: str) -> str:
        """text with every plain_map character replaced (the first step of _normalize_chars)."""
        plain = self.plain_map
        for c in self._plain_ascii.intersection(text):  # a few str.replace (\n, \t) beat a callback per match
            text = text.replace(c, plain[c])
        if self._plain_rx is not None:
            text = self._plain_rx.sub(lambda m: plain[m.group()], text)
        return text

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

    # --- exact byte-level path -----------------------------------------------------------------
    def _user_byte_trie(self) -> dict[int, dict]:
        trie = self._user_bytes
        if trie is None:
            trie = self._once("_user_bytes", lambda: _byte_trie(self.user_texts))  # type: ignore[attr-defined]
        return trie

    def _normalize_bytes(self, b: bytes, src: list[int] | None = None) -> bytes:
        """llm_tokenizer_ugm_session::normalize, byte for byte. With src, also the index in b of the byte
        each output byte comes from (-1 for a space marker no space stands for): character offsets."""
        user = self._user_byte_trie()
        cm = self.charsmap
        mapped = bytearray()
        i, n = 0, len(b)
        while i < n:
            start = i
            node, k = user, i
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
