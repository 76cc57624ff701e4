"""Rank-based merging (GPT-2 style byte-level BPE as llama.cpp runs it): llm_tokenizer_bpe.

The algorithm, plainly: the pre-tokenizer splits text into words; each word becomes its GPT-2
byte-level characters; while some adjacent pair is a listed merge, merge the pair of lowest rank
(ties: the leftmost); finally emit each symbol's id, or, for a symbol that is not a token, the ids
of its single bytes where those exist (llama.cpp drops the rest).

Words repeat, so each word's ids are cached. Short words use the plain loop; long ones (a run of
100,000 'a's is one word) the heap + linked list, O(n log n).

Words are code points (encoders/base.py): raw bytes in the text have already been decoded the way
llama.cpp decodes them, so a surrogate code point here stands for itself and is encoded with
'surrogatepass' (the bytes ED A0 80 read as U+D800 become those three bytes again).
"""

from __future__ import annotations

import functools
import operator
import re
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate, repeat
from types import ModuleType

import numpy as np

from ...gguffile.reader import join_strings
from .. import unicode_data as ud
from ..pretokenize import PreTokenizer
from ..tables import GPT2, LLAMA3, PATTERNS
from ..text import SPACE
from ..unicode import BYTE_TO_CHAR, byte_encode, byte_token, raw_byte_token
from ..vocab import Vocab
from . import base
from .base import Encoder
from .merge import linked_list, merge_queue, with_bytes

HEAP_MIN_LEN = 48
_NO_MERGE = 1 << 62
# Huge fragments are cut after a newline followed by a non-space (as minillama.tokenizer.train cuts a corpus),
# checked against the words of the text read on _MARGIN characters past the cut.
_NEWLINE_CUT = re.compile(r"\n(?=\S)")
_MARGIN = 1 << 12


class BPEEncoder(Encoder):
    """llama.cpp's BPE tokenizer over a vocab with merges and a pre-tokenizer."""

    EAGER_RANKS = True

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        spec = vocab.pre_spec
        assert spec is not None
        self.spec = spec
        self.pretokenizer = PreTokenizer(PATTERNS[spec.patterns])
        # Built at load, not on first use: every encode needs it, and a first call should not pay
        # for hashing 280k merges (llama3: ~35 ms) on top of its own work.
        self._ranks: dict[str, int] | None = self._build_ranks() if self.EAGER_RANKS else None
        self._whole_words = vocab.ignore_merges  # a word that is a token is that token

    @property
    def ranks(self) -> dict[str, int]:
        """Merge string "left right" -> rank; the first of duplicate merges wins.

        llama.cpp splits each merge at its first space after position 0 and looks pairs up by
        (left, right); neither side may hold a space, so looking up left + " " + right in a dict
        keyed by the merge strings themselves finds the same rank, without splitting 280k strings.
        """
        ranks = self._ranks
        if ranks is None:
            ranks = self._once("_ranks", self._build_ranks)
        return ranks

    def _build_ranks(self) -> dict[str, int]:
        merges = self.vocab.merges
        return dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))

    def prepare(self, text: str, after_special: bool) -> str:
        """SPM-style BPE vocabs (gemma4) see spaces as U+2581; byte-level ones see the text as is."""
        return text.replace(" ", SPACE) if self.vocab.escape_whitespaces else text

    def words(self, text: str) -> list[str]:
        return self.pretokenizer.split(text)

    def word_chunks(self, text: str) -> Iterator[list[str]]:
        """The words of a huge text a piece at a time. A piece ends at a newline-then-non-space q where
        the words of the text read on _MARGIN characters past q end (and so do the pieces of the first
        pattern, inside which later patterns work): no pattern looks back, and none looks ahead or
        runs greedily across a margin, so those words are the whole text's, and the words of the rest
        start afresh at q. When no such q is found the rest is one piece (a pre-tokenizer whose first
        pattern never ends at a newline, as falcon's punctuation runs, is never cut)."""
        pre = self.pretokenizer
        chunk = base.CHUNK_CHARS
        start, n = 0, len(text)
        while n - start > chunk:
            cands = [m.end() - start for m in _NEWLINE_CUT.finditer(text, start + chunk // 2, start + chunk)][-16:]
            if not cands:  # none in the window: the first ones in the next (a longer piece)
                nxt = _NEWLINE_CUT.finditer(text, start + chunk, start + 2 * chunk)
                cands = [m.end() - start for _, m in zip(range(16), nxt)][::-1]
                if not cands:
                    break
            buf = text[start:start + max(cands) + _MARGIN]
            words = pre.split(buf)
            ends = list(accumulate(map(len, words)))
            first = {e for _, e in pre.spans(buf, 0, 1)} if len(pre.patterns) > 1 else None
            for q in reversed(cands):
                k = bisect_left(ends, q)
                if k < len(ends) and ends[k] == q and (first is None or q in first):
                    del words[k + 1:]
                    yield words
                    start += q
                    break
            else:
                break
        yield pre.split(text[start:])

    def encode_word(self, word: str) -> list[int]:
        t2i = self.token_to_id
        sym_text = byte_encode(word) if self.spec.byte_encode else word
        if self._whole_words or (self.spec.newline_tokens and not word.strip("\n")):
            i = t2i.get(sym_text)
            if i is not None:
                return [i]
        syms = self._merge_heap(sym_text) if len(sym_text) >= HEAP_MIN_LEN else self._merge_simple(sym_text)
        ids = list(map(t2i.get, syms))
        if None not in ids:
            return ids  # type: ignore[return-value]
        return with_bytes(syms, ids, self._byte_ids)

    def _byte_ids(self, sym: str) -> list[int]:
        """A symbol that is no token as the tokens of its single bytes, where those exist (llama.cpp drops
        the rest)."""
        get = self.token_to_id.get
        key = raw_byte_token if self.spec.byte_encode else byte_token
        return [j for b in sym.encode("utf-8", "surrogatepass") if (j := get(key(b))) is not None]

    def _merge_simple(self, text: str) -> list[str]:
        """Lowest-rank pair first, leftmost on ties; pair ranks are kept and only two updated per merge."""
        parts = list(text)
        if len(parts) < 2:
            return parts
        rank, none = self.ranks.get, _NO_MERGE
        add = operator.add
        rs = list(map(rank, map(add, map(add, parts, repeat(" ")), parts[1:]), repeat(none)))
        while True:
            best = min(rs)
            if best == none:
                return parts
            i = rs.index(best)
            merged = parts[i] = parts[i] + parts.pop(i + 1)
            del rs[i]
            if i < len(rs):
                rs[i] = rank(merged + " " + parts[i + 1], none)
            elif not i:
                return parts
            if i:
                rs[i - 1] = rank(parts[i - 1] + " " + merged, none)

    def _merge_heap(self, text: str) -> list[str]:
        """The heap + linked list merge for long words, O(n log n).

        A heap entry is one int, rank << 32 | left index (ties: leftmost). An entry is stale when
        the pair now at `left` has another rank: a rank names exactly one (left, right) pair, so
        an equal rank means the same two strings, which is llama.cpp's staleness test. The queue is
        a heap of those ints, or for a huge word the compact merge.BucketQueue (same order).
        """
        rank = self.ranks.get
        syms = list(text)
        n = len(syms)
        nxt, prv = linked_list(n)
        keys = (r << 32 | i for i, r in enumerate(rank(a + " " + b, -1) for a, b in zip(syms, syms[1:])) if r >= 0)
        pop, push = merge_queue(n, keys, 32)
        low = (1 << 32) - 1
        canon = self.canonical().get
        while True:
            try:
                key = pop()
            except IndexError:
                break
            left = key & low
            right = nxt[left]
            if right < 0 or not syms[left] or rank(syms[left] + " " + syms[right], -1) != key >> 32:
                continue
            merged = syms[left] + syms[right]
            syms[left] = canon(merged, merged)  # the vocab's own str: a long word keeps no copies
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
                r = rank(syms[left] + " " + syms[after], -1)
                if r >= 0:
                    push(r << 32 | left)
            before = prv[left]
            if before >= 0:
                r = rank(syms[before] + " " + syms[left], -1)
                if r >= 0:
                    push(r << 32 | before)
        return [s for s in syms if s]


# The pre-tokenizers the native core runs itself, by pattern set: llama.cpp's hand-written splitters (pretok.c)
# and the pattern lists written for it in C (pretok_multi.c); any other pattern set is split here with `regex`
# and merged there (mode 0: words given).
_NATIVE_SPLITTERS = {(GPT2,): 1, (LLAMA3,): 2, PATTERNS["falcon"]: 3, PATTERNS["starcoder"]: 4, PATTERNS["newlines"]: 5}
# Texts of at least this many UTF-8 bytes go the pure way (the core's offsets are 32-bit).
_NATIVE_MAX_BYTES = 1 << 31


@functools.cache
def unicode_flags() -> np.ndarray:
    """llama.cpp's flags of every code point 0..U+10FFFF (uint16), from unicode_data's ranges: the table the
    native splitters read, built once per process."""
    starts = np.array([a for a, _ in ud.RANGES] + [ud.MAX_CODE_POINT + 1], np.int64)
    return np.repeat(np.array([f for _, f in ud.RANGES], np.uint16), np.diff(starts))


def native_merges(vocab: Vocab, core: ModuleType) -> np.ndarray:
    """Vocab.arrays().merges, resolved by the core from the merges' text (~20x faster at load). Where bytes
    could stand for two texts (a merge or token with lone surrogates) or a merge holds a newline (the line
    separator), the Python resolution runs instead: it matches texts, the core bytes."""
    arrays, merges = vocab.arrays(), vocab.merges
    try:
        text = join_strings(merges, "\n").encode("utf-8")
        "".join(vocab.tokens).encode("utf-8")
    except UnicodeEncodeError:
        return arrays.merges
    rows = core.BPE.resolve_merges(arrays.token_bytes, arrays.token_offsets, text, len(merges))
    return arrays.merges if rows is None else np.frombuffer(rows, np.int32).reshape(len(merges), 3)


def _char_byte_ids(vocab: Vocab) -> np.ndarray:
    """The byte rows of the core's character mode: an ASCII character's token (a space's is U+2581's where spaces
    are escaped), then every byte's <0xXX> token, -1 where there is none."""
    get = vocab.token_to_id.get
    rows = np.full((256, 3), -1, np.int32)
    for b in range(256):
        c = SPACE if b == 0x20 and vocab.escape_whitespaces else chr(b)
        i, f = get(c) if b < 0x80 else None, get(byte_token(b))
        rows[b, :2] = [-1 if i is None else i, -1 if f is None else f]
    return rows


def newline_ids(vocab: Vocab) -> np.ndarray | None:
    """[k - 1]: the token of k newlines, which a word of k newlines stays (-1: none), up to the longest such
    token; None where the pre-tokenizer keeps no such word whole."""
    if vocab.pre_spec is None or not vocab.pre_spec.newline_tokens:
        return None
    get = vocab.token_to_id.get
    longest = max((len(t) for t in vocab.tokens if t and not t.strip("\n")), default=0)
    return np.array([get("\n" * k, -1) for k in range(1, longest + 1)], np.int32)


class NativeBPEEncoder(BPEEncoder):
    """BPEEncoder whose encode runs in the native core (C): splitting (llama.cpp's GPT-2 and LLaMA-3
    splitters, the Falcon and StarCoder pattern lists and gemma4's newline runs in C, other patterns here),
    rank merges and the word cache, with the GIL released. Byte-level vocabs merge bytes; SPM-style ones
    (gemma4: raw UTF-8, spaces as U+2581, <0xXX> byte tokens) merge characters. The Python methods it inherits
    (words, encode_word) stay for offsets and token healing; they give the same ids."""

    backend = "native"
    EAGER_RANKS = False  # the core has its own table; the Python one is built only if offsets need it

    def __init__(self, vocab: Vocab, core: ModuleType, byte_ids: np.ndarray, merges: np.ndarray) -> None:
        super().__init__(vocab)
        arrays = vocab.arrays()
        self._mode = _NATIVE_SPLITTERS.get(PATTERNS[self.spec.patterns], 0)
        chars = not self.spec.byte_encode
        self._core = core.BPE(unicode_flags(), arrays.token_bytes, arrays.token_offsets, merges, byte_ids,
                              np.array([ord(c) for c in BYTE_TO_CHAR], np.int32), vocab.ignore_merges,
                              base.CACHE_MAX_BYTES, base.CACHE_MAX_WORDS, self._mode, chars,
                              chars and vocab.escape_whitespaces, newline_ids(vocab) if chars else None)
        if not self._mode:  # the words are split here: no fast path
            self.encode_plain = self.encode_many = self.encode_flat = None  # type: ignore[assignment]
        else:  # the core's method itself, which knows the mode: no Python frame per call of the fast path
            self.encode_plain = self._core.encode_plain  # type: ignore[method-assign]

    @classmethod
    def build(cls, vocab: Vocab, core: ModuleType) -> NativeBPEEncoder | None:
        """The native encoder of a vocab, or None where the core does not cover it. It covers byte-level vocabs
        whose merges of two tokens all make a token (so every symbol is a token, or a byte character no merge
        names), and SPM-style ones (raw UTF-8, no byte encoding) whose merges all join two tokens into a token
        and that do not ignore merges."""
        spec = vocab.pre_spec
        if spec is None:
            return None
        if not spec.byte_encode:
            m = native_merges(vocab, core)
            return None if vocab.ignore_merges or (m < 0).any() else cls(vocab, core, _char_byte_ids(vocab), m)
        if spec.newline_tokens or vocab.escape_whitespaces:
            return None
        m = native_merges(vocab, core)
        if ((m[:, 0] >= 0) & (m[:, 1] >= 0) & (m[:, 2] < 0)).any():
            return None
        get = vocab.token_to_id.get
        byte_ids = np.full((256, 3), -1, np.int32)
        for b, c in enumerate(BYTE_TO_CHAR):  # a byte whose character is no token: its fallback ids, as encode_word
            i = get(c)
            fallback = [] if i is not None else [get(raw_byte_token(x)) for x in c.encode("utf-8")]
            byte_ids[b, :1 + len(fallback)] = [-1 if i is None else i] + [-1 if f is None else f for f in fallback]
        return cls(vocab, core, byte_ids, m)

    def encode_plain(self, text: str) -> list[int] | None:
        """encode(text) in one call to the core, which reads the str's own UTF-8 (no bytes copy), or None when
        text holds lone surrogates: Tokenizer.encode's fast path for a plain fragment. Only where the core
        splits this vocab's pre-tokenizer itself (else the attribute is None); __init__ puts the core's
        method itself in its place."""
        return self._core.encode_plain(text, self._mode)

    def encode_many(self, texts: list[str]) -> list[list[int] | None]:
        """encode_plain of each text, the GIL released once for all of them (encode_batch's threads)."""
        return self._core.encode_many(texts, self._mode)

    def encode_flat(self, texts: Sequence[str], prefix: Sequence[int], suffix: Sequence[int],
                    starts: str) -> tuple[bytes, bytes, bool] | None:
        """prefix + encode_plain(t) + suffix of every text as one int32 buffer, each text's end in it (int64 bytes)
        and whether some text starts with starts (never for ''), the GIL released once for all and no list made per
        text; None when a text holds lone surrogates or is no str of exactly type str."""
        return self._core.encode_flat(texts, prefix, suffix, starts, self._mode)

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")  # code points; a surrogate stands for itself
        if len(data) >= _NATIVE_MAX_BYTES:
            return super().encode(text)
        if self._mode:
            return self._core.encode(data, self._mode, None)
        if len(text) <= base.CHUNK_CHARS:
            return self._core.encode(data, 0, np.fromiter(accumulate(map(len, self.words(text))), np.int64))
        out: list[int] = []
        for words in self.word_chunks(text):
            part = "".join(words).encode("utf-8", "surrogatepass")
            out += self._core.encode(part, 0, np.fromiter(accumulate(map(len, words)), np.int64))
        return out

    def cache_info(self) -> dict[str, int]:
        return self._core.cache_info()

    def clear_cache(self) -> None:
        self._core.clear_cache()

    def add_entries(self, entries: Iterator[tuple[str, list[int]]]) -> None:
        """Entries from another process are not needed: the core computes a word faster than it is sent."""
