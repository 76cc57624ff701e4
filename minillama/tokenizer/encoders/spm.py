"""Score-based merging (SentencePiece BPE as llama.cpp runs it): llm_tokenizer_spm.

The algorithm, plainly: split the text (spaces already U+2581) into UTF-8 characters; while some
adjacent pair of symbols concatenates to a vocab token, merge the pair whose token has the highest
score (ties: the leftmost); finally emit each symbol's id, or its bytes as <0xXX> tokens.

Made fast without changing a single id: two neighbouring characters that no vocab token holds side
by side can never end up in one symbol (every merged symbol is a token), so no merge crosses between
them and the two sides merge independently: the same merges happen on each side, in the same order
relative to each other. The text is cut there, in two steps: a regex cuts before each U+2581 whose
left neighbour never precedes U+2581 in a token (fast, in C) into words, which are cached; a word
not in the cache is cut further at every pair of characters that no token holds side by side
(segments, also cached). On code and docs in 18 languages this makes the merged text 3x shorter and
segments short. Short segments use the plain quadratic loop; long ones the heap + linked list,
O(n log n).

Raw bytes (surrogate escapes U+DC80..U+DCFF, see encoders/base.py) are what llama.cpp sees: bytes.
It cuts its symbols by the length each lead byte announces, whatever follows (the bytes C3 61 are
one symbol), so a word holding raw bytes is merged over its bytes, as latin-1 strings looked up in a
latin-1 keyed copy of the vocab, and no word boundary is placed within three characters after a raw
lead byte. Symbols that are no token fall back to byte tokens (<0xXX>, else the raw one-byte token);
a vocab that has neither for a byte fails with FormatError, where llama.cpp aborts.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from types import ModuleType

import numpy as np

from ...errors import FormatError
from ...gguffile.constants import Keys
from ..text import SPACE, SURROGATES, UTF8_LEN
from ..unicode import byte_token, raw_byte_token
from ..vocab import Vocab
from . import base
from .base import Encoder, adjacent_pairs, cut_at_pairs, last_cut_before
from .merge import linked_list, merge_queue, with_bytes

HEAP_MIN_LEN = 48
_NO_PAIR = float("-inf")
_RAW_LEAD = re.compile("[\udcc0-\udcff]")


class SPMEncoder(Encoder):
    """llama.cpp's SPM tokenizer over a vocab with scores."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        self.scores: list[float] = vocab.scores.tolist()
        self._byte_ids: list[int] | None = None
        self._splitter: re.Pattern[str] | None = None
        self._latin1: dict[str, int] | None = None
        self._ranks: list[int] | None = None
        self._pairs: frozenset[str] | None = None
        # token text -> score: one dict lookup per candidate pair in the merge loop (built on first use)
        self._score_of: dict[str, float] | None = None

    def prepare(self, text: str, after_special: bool) -> str:
        """The dummy space prefix (at the start and after a special token) and the U+2581 space marker."""
        if after_special and self.vocab.add_space_prefix:
            text = " " + text
        return text.replace(" ", SPACE)

    # --- splitting where no merge can cross -------------------------------------------------
    def words(self, text: str) -> list[str]:
        rx = self._splitter
        if rx is None:
            rx = self._once("_splitter", self._build_splitter)
        return rx.split(text)

    def cut(self, text: str, lo: int, hi: int) -> int | None:
        """The last cut of words() before a U+2581 in [lo, hi)."""
        return last_cut_before(SPACE, self.words, text, lo, hi)

    def encode_escaped(self, text: str) -> list[int]:
        """Words as usual, but a word whose last three characters hold a raw lead byte (which may take
        the next bytes into its symbol) is joined with the next one."""
        joined: list[str] = []
        carry = False
        for w in self.words(text):
            if carry:
                joined[-1] += w
            else:
                joined.append(w)
            carry = _RAW_LEAD.search(joined[-1], max(0, len(joined[-1]) - 3)) is not None
        return self._encode_words(joined)

    def _build_splitter(self) -> re.Pattern[str]:
        """A zero-width cut before every U+2581 whose left neighbour never precedes U+2581 in a token."""
        keep = set()
        for t in self.token_to_id:
            i = t.find(SPACE, 1)
            while i > 0:
                keep.add(t[i - 1])
                i = t.find(SPACE, i + 1)
        left = f"[^{''.join(re.escape(c) for c in sorted(keep))}]" if keep else "."
        return re.compile(f"(?<={left})(?={SPACE})", re.DOTALL)

    def segments(self, word: str) -> list[str]:
        """word cut between every two neighbouring characters that no token holds side by side."""
        pairs = self._pairs
        if pairs is None:
            pairs = self._once("_pairs", lambda: adjacent_pairs(self.token_to_id))
        return cut_at_pairs(word, pairs)

    # --- merging -----------------------------------------------------------------------------
    def encode_word(self, word: str) -> list[int]:
        if not word.isascii() and SURROGATES.search(word):
            return self._encode_raw(word)
        segs = self.segments(word)
        if len(segs) == 1:
            return self._encode_segment(word)
        return self._encode_words(segs, self._encode_segment)

    def _encode_segment(self, word: str | list[str], t2i: dict[str, int] | None = None,
                        fallback: Callable[[str], list[int]] | None = None) -> list[int]:
        """Merge one segment (a word no cut applies to) and emit its ids: by default its characters over the
        vocab, a symbol that is no token as its UTF-8 bytes; or given symbols over t2i, with fallback."""
        syms = list(word)
        if t2i is None:
            t2i, fallback = self.token_to_id, self._utf8_bytes
        syms = self._merge_heap(syms, t2i) if len(syms) >= HEAP_MIN_LEN else self._merge_simple(syms, t2i)
        ids = list(map(t2i.get, syms))
        if None not in ids:
            return ids  # type: ignore[return-value]
        assert fallback is not None
        return with_bytes(syms, ids, fallback)

    def _utf8_bytes(self, sym: str) -> list[int]:
        return self._bytes_of(sym.encode("utf-8", "surrogateescape"))

    def _encode_raw(self, word: str) -> list[int]:
        """A word holding raw bytes, merged over its bytes exactly as llama.cpp does."""
        b = word.encode("utf-8", "surrogateescape")
        syms, i, n = [], 0, len(b)
        while i < n:
            k = min(UTF8_LEN[b[i] >> 4], n - i)
            syms.append(b[i:i + k].decode("latin-1"))
            i += k
        t2i = self._latin1
        if t2i is None:
            t2i = self._once("_latin1", self._build_latin1)
        return self._encode_segment(syms, t2i, self._latin1_bytes)

    def _latin1_bytes(self, sym: str) -> list[int]:
        return self._bytes_of(sym.encode("latin-1"))

    def _build_latin1(self) -> dict[str, int]:
        """Token bytes as latin-1 text -> id: the vocab keyed the way the byte path sees symbols."""
        return {t.encode("utf-8", "surrogateescape").decode("latin-1"): i for t, i in self.token_to_id.items()}

    def _merge_simple(self, syms: list[str], t2i: dict[str, int]) -> list[str]:
        """Highest-score pair first, leftmost on ties; pair scores are kept and only two updated per merge."""
        if len(syms) < 2:
            return syms
        if t2i is self.token_to_id:
            score_of = self._score_of
            if score_of is None:
                score_of = self._once("_score_of", self._build_score_of)
            get = score_of.get
        else:
            scores = self.scores
            get = lambda pair, no: no if (t := t2i.get(pair)) is None else scores[t]  # type: ignore[assignment] # noqa: E731

        no = _NO_PAIR
        ss = list(map(get, map(operator.add, syms, syms[1:]), repeat(no)))
        while True:
            best = max(ss)
            if best == _NO_PAIR:  # no pair is a token (or only tokens scored -inf: find those)
                i = next((j for j in range(len(ss)) if syms[j] + syms[j + 1] in t2i), -1)
                if i < 0:
                    break
            else:
                i = ss.index(best)
            merged = syms[i] = syms[i] + syms.pop(i + 1)
            del ss[i]
            if i < len(ss):
                ss[i] = get(merged + syms[i + 1], no)
            elif not i:
                break
            if i:
                ss[i - 1] = get(syms[i - 1] + merged, no)
        return syms

    def _build_score_of(self) -> dict[str, float]:
        return {t: self.scores[i] for t, i in self.token_to_id.items()}

    def _merge_heap(self, syms: list[str], t2i: dict[str, int]) -> list[str]:
        """The heap + linked list merge for long words, O(n log n), in compact form.

        A heap entry is one int, rank << 64 | left << 32 | size: rank orders token scores (0 for the
        highest; ties of equal scores share a rank), so the smallest entry is llama.cpp's next
        bigram (highest score, then leftmost). Its right symbol is left's current neighbour; the entry
        is stale when either symbol is gone or their sizes no longer add up to size, which is
        llama.cpp's own test. Entries and links stay small (base.links, merge.merge_queue): a 10 MB
        word of one letter takes about 32 bytes per character at its peak.
        """
        rank = self._ranks
        if rank is None:
            rank = self._once("_ranks", self._build_ranks)
        n = len(syms)
        nxt, prv = linked_list(n)
        get = t2i.get
        keys = (rank[t] << 64 | i << 32 | (len(syms[i]) + len(syms[i + 1]))
                for i in range(n - 1) if (t := get(syms[i] + syms[i + 1])) is not None)
        pop, push = merge_queue(n, keys, 64)
        low = (1 << 32) - 1
        canon = (self.canonical() if t2i is self.token_to_id else {}).get
        while True:
            try:
                key = pop()
            except IndexError:
                break
            left = (key >> 32) & low
            right = nxt[left]
            sl = syms[left]
            if right < 0 or not sl:
                continue
            sr = syms[right]
            if not sr or len(sl) + len(sr) != key & low:
                continue
            sl = sl + sr
            syms[left] = sl = canon(sl, sl)  # the vocab's own str: a long word keeps no copies
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
                t = get(sl + syms[after])
                if t is not None:
                    push(rank[t] << 64 | left << 32 | (len(sl) + len(syms[after])))
            before = prv[left]
            if before >= 0:
                t = get(syms[before] + sl)
                if t is not None:
                    push(rank[t] << 64 | before << 32 | (len(syms[before]) + len(sl)))
        return [s for s in syms if s]

    def _build_ranks(self) -> list[int]:
        """Token id -> rank of its score, 0 for the highest (NaN scores last), equal scores equal ranks."""
        order = sorted({x for x in self.scores if x == x}, reverse=True)
        index = {x: r for r, x in enumerate(order)}
        nan = len(order)
        return [index.get(x, nan) if x == x else nan for x in self.scores]

    # --- byte fallback -----------------------------------------------------------------------
    def _bytes_of(self, data: bytes) -> list[int]:
        """llama.cpp's byte_to_token for each byte: <0xXX>, else the token whose text is that byte."""
        ids = self._byte_ids
        if ids is None:
            ids = self._once("_byte_ids", lambda: [self._byte_token(b) for b in range(256)])
        out = []
        for b in data:
            if ids[b] < 0:
                raise FormatError(f"this SPM vocab has no byte token <0x{b:02X}> (nor a token for the raw byte) "
                                  f"for byte {b:#04x} of {data[:40]!r}, which no token covers; llama.cpp aborts "
                                  "here too", key=Keys.Tokenizer.LIST)
            out.append(ids[b])
        return out

    def _byte_token(self, b: int) -> int:
        t2i = self.token_to_id
        i = t2i.get(byte_token(b))
        if i is None:
            i = t2i.get(raw_byte_token(b), -1)
        return i


# Texts of at least this many characters go the pure way (the core's offsets are 32-bit: 4 bytes a character).
# bind_spm.c's SPM_PLAIN_MAX_CHARS is the same bound for encode_plain.
_NATIVE_MAX_CHARS = 1 << 29


class NativeSPMEncoder(SPMEncoder):
    """SPMEncoder whose encode runs in the native core (C, spm.c): the same merges over the text's bytes, the
    word cut, the word cache and byte fallback, with the GIL released. The Python methods it inherits (words,
    encode_word) stay for offsets and token healing, and run where the core cannot: text that is no UTF-8 even
    with surrogate escapes, and a byte the vocab has no token for (the pure path raises the FormatError)."""

    backend = "native"

    def __init__(self, vocab: Vocab, core: ModuleType) -> None:
        super().__init__(vocab)
        arrays = vocab.arrays(core)
        byte_ids = np.array([self._byte_token(b) for b in range(256)], np.int32)
        self._core = core.SPM(arrays.token_bytes, arrays.token_offsets, arrays.scores, byte_ids,
                              base.CACHE_MAX_BYTES, base.CACHE_MAX_WORDS, vocab.add_space_prefix)
        # the core's own methods, no Python frame between Tokenizer.encode's fast path and C
        self.encode_plain, self.encode_many = self._core.encode_plain, self._core.encode_many  # type: ignore[method-assign]
        self.encode_flat = self._core.encode_flat  # type: ignore[method-assign]

    @classmethod
    def build(cls, vocab: Vocab, core: ModuleType) -> NativeSPMEncoder:
        """The native encoder of an SPM vocab: the core covers every one."""
        return cls(vocab, core)

    def encode_plain(self, text: str) -> list[int] | None:
        """Tokenizer.encode(text, add_special=False) of a vocab that matches no special token in plain text, in
        one call to the core: prepare() (dummy prefix, U+2581 for spaces) and encode() in C, reading the str's
        characters. None where the usual path must decide: lone surrogates, a byte no token covers, text of
        _NATIVE_MAX_CHARS characters or more. (__init__ binds the core's method itself in its place.)"""
        return self._core.encode_plain(text)

    def encode_many(self, texts: list[str]) -> list[list[int] | None]:
        """encode_plain of each text, the GIL released once for all of them (encode_batch's threads)."""
        return self._core.encode_many(texts)

    def encode_flat(self, texts: Sequence[str], prefix: Sequence[int], suffix: Sequence[int],
                    starts: str) -> tuple[bytes, bytes, bool] | None:
        """prefix + encode_plain(t) + suffix of every text as one int32 buffer, each text's end in it (int64 bytes)
        and whether some text starts with starts (never for ''), the GIL released once for all and no list made per
        text; None where encode_plain gives None for a text, or a text is no str of exactly type str. (__init__
        binds the core's method itself in its place.)"""
        return self._core.encode_flat(texts, prefix, suffix, starts)

    def encode(self, text: str) -> list[int]:
        ids = None
        if len(text) < _NATIVE_MAX_CHARS:
            try:
                ids = self._core.encode(text)  # the str's UTF-8, no copy for ASCII
            except UnicodeEncodeError:  # a lone surrogate: not from Tokenizer.encode, which escapes them
                pass
        return super().encode(text) if ids is None else ids

    def encode_escaped(self, text: str) -> list[int]:
        ids = None
        if len(text) < _NATIVE_MAX_CHARS:
            try:
                ids = self._core.encode(text.encode("utf-8", "surrogateescape"))
            except UnicodeEncodeError:
                pass
        return super().encode_escaped(text) if ids is None else ids

    def cache_info(self) -> dict[str, int]:
        return self._core.cache_info()

    def clear_cache(self) -> None:
        self._core.clear_cache()

    def add_entries(self, entries: Iterable[tuple[str, list[int]]]) -> None:
        """Entries from another process are not needed: the core computes a word faster than it is sent."""
