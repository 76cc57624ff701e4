"""The base of every encoder: a bounded cache from word to ids in front of `encode_word`.

Raw bytes in text. The facade (Tokenizer.encode) hands encoders text in which the characters
U+DC80..U+DCFF stand for the raw bytes 0x80..0xFF that are not valid UTF-8 (Python's
surrogateescape), so that a fragment is exactly the bytes llama.cpp would see. Such fragments go to
`encode_escaped`, and each encoder treats the bytes as its llama.cpp counterpart does: SPM and UGM
work on the bytes themselves; BPE and WPM first decode them to code points as llama.cpp's
unicode_cpts_from_utf8 does (`llama_code_points`), where an invalid byte becomes U+FFFD.

The word cache keeps hot words without starting over: it has two generations, each a plain dict.
New words go into the young one; a word found only in the old one is copied back into the young one.
When the young generation reaches CACHE_MAX_BYTES (estimated: key, id list and dict slot) or
CACHE_MAX_WORDS, it becomes the old one and the previous old one is dropped. So a word used at least
once per generation is never recomputed, memory stays under 2 x CACHE_MAX_BYTES whatever the input
(an entry over an eighth of CACHE_MAX_BYTES is not cached at all), and a second pass over a corpus never
does more work than the first. The hot path (every word a hit in the young generation) is one C-level
map over the young dict. Processes that encode parts of one input (the dataset engine's workers) share
what they compute: take_new_entries() gives the entries computed since it was last called, and
add_entries() puts another encoder's into this cache.

Huge fragments. A fragment of more than CHUNK_CHARS characters is encoded a piece at a time
(`Encoder.word_chunks`): each encoder cuts only where the words of the whole text provably have a
boundary that does not depend on what follows (SPM: a cut of its one-character-context splitter;
WordPiece: after a space; BPE: after a newline followed by a non-space, checked against the words
of the text read on past the cut; Unigram: a segment cut), so the ids are the same and the word
lists of one call stay a few MB. A long word's merge keeps the vocab's own token strs and 4-byte
links, and a word of 65,536 symbols or more queues its pairs in machine arrays (merge.BucketQueue)
instead of a heap of Python ints, so one word of n characters costs about 25-35 bytes a character
at its peak (a heap of ints: 66-75).

Thread safety. A get or a set on a dict is atomic under the GIL; two threads encoding the same new
word both compute the same ids; a generation swap racing with a set at worst loses that entry, which
costs a recomputation. Tables built on first use are built under `self._lock`, once.
"""

from __future__ import annotations

import operator
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, compress
from typing import TypeVar

from ..text import llama_code_points
from ..vocab import Vocab

# Bounds of one cache generation (two are kept: at most twice these). A word is a pre-token for BPE
# and WordPiece, a run between unmergeable boundaries for SPM and Unigram.
CACHE_MAX_BYTES = 32 << 20
CACHE_MAX_WORDS = 1 << 18

# Huge fragments. A fragment longer than CHUNK_CHARS is encoded a piece at a time, each piece ending
# where the encoder proves its ids do not depend on what follows (see `Encoder.word_chunks`), so the word
# lists of one call stay a few MB whatever the input. Pieces are CHUNK_CHARS // 2 .. CHUNK_CHARS long
# when a cut is found there; a text with no cut at all (one endless word) is one piece.
CHUNK_CHARS = 1 << 20


def entry_bytes(word: str, ids: list[int]) -> int:
    """An upper estimate of what caching word -> ids costs: the str (up to 4 bytes a character), the
    list (8 bytes an id; ids are shared int objects), and the dict slot."""
    return 180 + 4 * len(word) + 8 * len(ids)

T = TypeVar("T")

def links(values: range) -> list[int] | array:
    """The linked list of a long word (merge heaps): a list (fastest), or machine ints past 2**16
    symbols, where a list's int objects would cost 36 bytes a symbol (a 10 MB word then takes half the
    memory); 4 bytes a link below 2**31 symbols."""
    if len(values) < 1 << 16:
        return list(values)
    return array("i" if len(values) < 1 << 31 else "q", values)


def adjacent_pairs(tokens: Iterable[str]) -> frozenset[str]:
    """Every two characters that some token holds side by side."""
    return frozenset(a + b for t in tokens for a, b in zip(t, t[1:]))


def cut_at_pairs(word: str, pairs: frozenset[str]) -> list[str]:
    """word cut between every two neighbouring characters that are not in pairs (no token spans there)."""
    n = len(word)
    cuts = list(compress(range(1, n), map(operator.not_, map(pairs.__contains__, map(operator.add, word, word[1:])))))
    if not cuts:
        return [word]
    return [word[a:b] for a, b in zip([0, *cuts], [*cuts, n])]


def pieces(text: str, cut: Callable[[str, int, int], int | None]) -> Iterator[str]:
    """text in pieces of CHUNK_CHARS // 2 .. CHUNK_CHARS characters, each ending at cut(text, lo, hi)
    (the last cut in [lo, hi), or None); where a window has none, the next windows are tried, and the
    rest is one piece when no cut follows at all."""
    chunk = CHUNK_CHARS
    start, n = 0, len(text)
    while n - start > chunk:
        q, lo, hi = None, start + chunk // 2, start + chunk
        while q is None and lo < n:
            q = cut(text, lo, min(hi, n))
            lo, hi = hi, hi + chunk
        if q is None:
            break
        yield text[start:q]
        start = q
    yield text[start:]


def last_cut_before(mark: str, split: Callable[[str], list[str]], text: str, lo: int, hi: int) -> int | None:
    """The last q in [lo, hi) with text[q] == mark where split cuts text[q - 1:q + 1] in two, None when
    the last 64 marks there are not cuts. For splitters by a zero-width pattern that looks one character
    either side (SPM words, UGM segments): a cut they make in those two characters is a cut of text."""
    q = text.rfind(mark, lo, hi)
    for _ in range(64):
        if q < lo or q < 1:
            return None
        if len(split(text[q - 1:q + 1])) == 2:
            return q
        q = text.rfind(mark, lo, q)
    return None


class Encoder:
    """Turns plain text into ids; subclasses say how text splits into words and how a word merges.

    What Tokenizer asks of an encoder, whichever backend runs it (these Python classes, or their Native*
    subclasses over the compiled core): `prepare` and `encode` / `encode_escaped` of one plain fragment,
    the ids add_special adds (`affixes`), and the word cache (`cache_info`, `clear_cache`,
    `take_new_entries`, `add_entries`); `words` for offsets and token healing.
    """

    backend = "pure"  # or "native"

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.token_to_id = vocab.token_to_id
        self._cache: dict[str, list[int]] = {}  # the young generation
        self._old: dict[str, list[int]] = {}
        self._cache_bytes = 0
        self._old_bytes = 0
        self._new: list[tuple[str, list[int]]] | None = None  # entries computed since take_new_entries()
        self._lock = threading.RLock()  # re-entrant: a table's builder may use another table
        self._canonical: dict[str, str] | None = None

    def _once(self, attr: str, build: Callable[[], T]) -> T:
        """The value of self.<attr>, built by build() on first use under the lock (once, thread-safe)."""
        with self._lock:
            value = getattr(self, attr)
            if value is None:
                value = build()
                setattr(self, attr, value)
            return value

    def canonical(self) -> dict[str, str]:
        """Token text -> the vocab's own str of it (the merge heaps of long words store these, not copies)."""
        canon = self._canonical
        if canon is None:
            canon = self._once("_canonical", lambda: {t: t for t in self.token_to_id})
        return canon

    def affixes(self) -> tuple[list[int], list[int]]:
        """Ids that add_special puts before and after the text: bos/eos as the vocab's flags say."""
        v = self.vocab
        before = [v.special["bos"]] if v.add_bos else []
        after = [v.special["eos"]] if v.add_eos else []
        return before, after  # type: ignore[return-value]

    def prepare(self, text: str, after_special: bool) -> str:
        """Encoder-specific text preparation of one fragment (space markers, dummy prefix)."""
        return text

    def words(self, text: str) -> list[str]:
        """Split text into words that can be encoded independently."""
        raise NotImplementedError

    def encode_word(self, word: str) -> list[int]:
        """Encode one word from scratch."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Encode one fragment of plain text (special tokens already split off, valid Unicode)."""
        if len(text) <= CHUNK_CHARS:
            return self._encode_words(self.words(text))
        out: list[int] = []
        for words in self.word_chunks(text):
            out += self._encode_words(words)
        return out

    def word_chunks(self, text: str) -> Iterator[list[str]]:
        """The words of text, a piece at a time (the pieces of `pieces` with this encoder's cut)."""
        return map(self.words, pieces(text, self.cut))

    def cut(self, text: str, lo: int, hi: int) -> int | None:
        """A position q, lo <= q < hi, where the words of text are those of text[:q] then those of
        text[q:]; None when there is none (the default: encoders that do not chunk)."""
        return None

    def encode_escaped(self, text: str) -> list[int]:
        """Encode a fragment holding raw bytes as surrogate escapes (see the module docstring).

        The default is llama.cpp's for encoders that read text as code points (BPE, WPM): decode the
        bytes with unicode_cpts_from_utf8's rules, then encode the code points.
        """
        return self.encode(llama_code_points(text))

    def _encode_words(self, words: list[str], encode: Callable[[str], list[int]] | None = None) -> list[int]:
        """The ids of each word in turn, from the cache or encode (default: encode_word)."""
        got = list(map(self._cache.get, words))  # the common case, all hits, stays in C
        if None in got:
            self._fill(words, got, encode or self.encode_word)
        return list(chain.from_iterable(got))

    def _fill(self, words: list[str], got: list[list[int] | None], encode: Callable[[str], list[int]]) -> None:
        """Fill the misses of got: from the old generation (and back into the young one), else encode()."""
        for k, ids in enumerate(got):
            if ids is None:
                w = words[k]
                ids = self._cache.get(w)  # an earlier miss of this call may have filled it
                if ids is None:
                    ids = self._old.get(w)
                    if ids is None:
                        ids = encode(w)
                        if self._remember(w, ids) and self._new is not None:
                            self._new.append((w, ids))
                    else:
                        self._remember(w, ids)
                got[k] = ids

    def _remember(self, word: str, ids: list[int]) -> bool:
        """Put word -> ids in the young generation, turning it old first when it is full (False: too
        large to cache)."""
        size = entry_bytes(word, ids)
        if size > CACHE_MAX_BYTES >> 3:  # one entry stays a small part of a generation
            return False
        cache = self._cache
        if self._cache_bytes + size > CACHE_MAX_BYTES or len(cache) >= CACHE_MAX_WORDS:
            self._old, self._cache, self._old_bytes, self._cache_bytes = cache, {}, self._cache_bytes, 0
            cache = self._cache
        self._cache_bytes += size
        cache[word] = ids
        return True

    def take_new_entries(self) -> list[tuple[str, list[int]]]:
        """The cache entries computed (not found) since the last call, in order; the first call starts the
        record and returns []."""
        new, self._new = self._new or [], []
        return new

    def add_entries(self, entries: Iterable[tuple[str, list[int]]]) -> None:
        """Cache entries that take_new_entries() of an encoder of this same vocab returned (kept words stay)."""
        cache = self._cache
        for word, ids in entries:
            if word not in cache:
                self._remember(word, ids)
                cache = self._cache  # a full generation may have turned old

    def clear_cache(self) -> None:
        """Forget every cached word (both generations)."""
        self._cache, self._old, self._cache_bytes, self._old_bytes = {}, {}, 0, 0

    def cache_info(self) -> dict[str, int]:
        """The word cache as numbers, the same keys on every backend: words and estimated bytes of the young
        and old generations, the largest entry and the longest word (in bytes) held, and the bounds."""
        young, old = self._cache, self._old
        held = [*young.items(), *old.items()]
        return {"words": len(young), "bytes": self._cache_bytes, "old_words": len(old), "old_bytes": self._old_bytes,
                "largest_entry": max((entry_bytes(w, ids) for w, ids in held), default=0),
                "longest_word": max((len(w.encode("utf-8", "surrogatepass")) for w, _ in held), default=0),
                "max_bytes": CACHE_MAX_BYTES, "max_words": CACHE_MAX_WORDS}
