"""WordPiece (BERT) as llama.cpp runs it: llm_tokenizer_wpm.

The algorithm, plainly: normalise and split the text into words one code point at a time --
with strip_accents, each code point becomes the first code point of its NFD decomposition and
marks (\\p{M}) are dropped; whitespace ends a word; NUL, U+FFFD and Cc/Cf/Co/Cs code points
vanish (unassigned ones stay); with lowercase, code points are lowercased; punctuation (\\p{P}),
ASCII symbols and CJK ideographs are words of their own. Then each word, with a U+2581 phantom
prefix, is cut greedily into the longest vocab tokens from left to right; a word with any position
that starts no token becomes one [UNK].

Made fast without changing a single id: the per-code-point work is one str.translate over a table
filled lazily (a code point -> its normalised text, "" when dropped, spaces around a one-character
word), so the text is split with str.split; words repeat, so each word's ids are cached.

What llama.cpp calls NFD is not Unicode NFD: every code point maps to ONE code point, the first
of its canonical decomposition (so a Hangul syllable becomes its leading jamo, and a decomposed
accent is only dropped because it was never emitted). Lowercasing is the simple one-to-one map.
"""

from __future__ import annotations

import functools
import unicodedata
from types import ModuleType

import numpy as np

from ...errors import FormatError
from .. import unicode_data as ud
from ..text import SPACE
from ..vocab import Vocab
from .base import Encoder
from .bpe import unicode_flags

PREFIX_MAX = 64
_SPACE_BYTES = SPACE.encode()

# llama.cpp's flag -> the class WPM cares about; CONTROL is Cc/Cf/Co/Cs (unassigned code points are not).
_CLASS = {ud.ACCENT_MARK: "M", ud.PUNCTUATION: "P", ud.SYMBOL: "S", ud.CONTROL: "C"}


def category_class(cp: int) -> str:
    """'M', 'P', 'S', 'C' (Cc/Cf/Co/Cs) or '' for everything else, as llama.cpp's flags (unicode_data) say."""
    return _CLASS.get(ud.flags(cp) & ud.CATEGORIES, "")


# llm_tokenizer_wpm_session::is_chinese_char, including its 0x2B920 (HF's value, not 0x2B820).
CHINESE_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                  (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_chinese_char(cp: int) -> bool:
    return any(a <= cp <= b for a, b in CHINESE_RANGES)


# nfd_first and to_lower still ask Python's unicodedata. Unicode 15.0 and 15.1 added no lowercase mapping
# and no canonical decomposition (checked against llama.cpp on every code point), so with Python 3.11
# (Unicode 14.0) they are llama.cpp's; other runtimes may differ on code points assigned in Unicode 14.0
# (Python 3.10) or after 15.1 (Python 3.14+).
def nfd_first(cp: int) -> int:
    """llama.cpp's unicode_cpts_normalize_nfd for one code point: the first code point of its NFD."""
    return ord(unicodedata.normalize("NFD", chr(cp))[0]) if cp > 0x7F else cp


def to_lower(cp: int) -> int:
    """llama.cpp's unicode_tolower: the simple (one code point) lowercase mapping."""
    return ord(chr(cp).lower()[0]) if cp > 0x40 else cp


class _NormTable(dict):
    """str.translate table: code point -> what WPM preprocessing makes of it, filled lazily.

    Values: " " for whitespace (a word boundary), "" for a dropped code point, " c " for a code point
    that is a word of its own, else the normalised character.
    """

    def __init__(self, lowercase: bool, strip_accents: bool) -> None:
        super().__init__()
        self.lowercase, self.strip_accents = lowercase, strip_accents

    def __missing__(self, cp: int) -> str:
        v = self[cp] = self.normalise(cp)
        return v

    def normalise(self, cp: int) -> str:
        if self.strip_accents:
            cp = nfd_first(cp)
        if ud.is_whitespace(cp):
            return " "
        cls = category_class(cp)
        if cp == 0 or cp == 0xFFFD or cls == "C" or (cls == "M" and self.strip_accents):
            return ""
        out = chr(to_lower(cp) if self.lowercase else cp)
        if cls == "P" or (cls == "S" and cp < 0x7F) or is_chinese_char(cp):
            return f" {out} "
        return out


class WPMEncoder(Encoder):
    """llama.cpp's WPM tokenizer over a BERT vocab (word-initial tokens carry U+2581, continuations do not)."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        # BertNormalizer options as Vocab loads them: lowercase defaults to true, strip_accents to lowercase.
        self.lowercase, self.strip_accents = vocab.lowercase, vocab.strip_accents
        self._table = _NormTable(self.lowercase, self.strip_accents)
        # llama.cpp matches byte substrings against token texts: key the vocab by bytes.
        self._ids: dict[bytes, int] = {}
        for t, i in vocab.token_to_id.items():
            self._ids[t.encode("utf-8", "surrogateescape")] = i
        self._max_len = max(map(len, self._ids), default=0)
        # every byte prefix of every token -> its id, or -1 for a mere prefix: the longest match from a
        # position is found scanning forward while the bytes are a prefix (a few lookups), instead of
        # trying every length from the longest down. Listed only when tokens are short (quadratic size).
        self._prefixes: dict[bytes, int] | None = None
        if self._max_len <= PREFIX_MAX:
            pre: dict[bytes, int] = {}
            for t in self._ids:
                for k in range(1, len(t)):
                    pre.setdefault(t[:k], -1)
            pre.update(self._ids)
            self._prefixes = pre

    def affixes(self) -> tuple[list[int], list[int]]:
        """[CLS] (the bos id) before and [SEP] after, whatever add_bos/add_sep say, as llama.cpp does for WPM."""
        v = self.vocab
        bos, sep = v.special.get("bos"), v.special.get("sep")
        if bos is None or sep is None:
            raise FormatError(f"this WordPiece vocab has no {'bos/cls' if bos is None else 'sep'} token id, "
                              "so add_special=True cannot add it")
        return [bos], [sep]

    def words(self, text: str) -> list[str]:
        return [w for w in text.translate(self._table).split(" ") if w]

    def cut(self, text: str, lo: int, hi: int) -> int | None:
        """Just after the last space or newline in [lo, hi) that normalises to a space: the table maps
        each code point alone, and a space ends every word, so no word spans the cut."""
        q = max(text.rfind(" ", lo, hi), text.rfind("\n", lo, hi))
        if q < lo or not text[q].translate(self._table).endswith(" "):
            return None
        return q + 1

    def encode_word(self, word: str) -> list[int]:
        b = _SPACE_BYTES + word.encode("utf-8", "surrogateescape")
        n, i, max_len, ids = len(b), 0, self._max_len, self._ids
        out: list[int] = []
        pre = self._prefixes
        if pre is not None:
            get = pre.get
            while i < n:
                best, j, t = -1, i + 1, -1
                while j <= n:
                    k = get(b[i:j])
                    if k is None:
                        break
                    if k >= 0:
                        best, t = j, k
                    j += 1
                if best < 0:
                    return self._unknown(word)
                out.append(t)
                i = best
            return out
        while i < n:
            for j in range(min(n, i + max_len), i, -1):
                t = ids.get(b[i:j])
                if t is not None:
                    out.append(t)
                    i = j
                    break
            else:
                return self._unknown(word)
        return out

    def _unknown(self, word: str) -> list[int]:
        """A word with a position no token starts at: [UNK], as llama.cpp emits it."""
        unk = self.vocab.special.get("unk")
        if unk is None:
            raise FormatError(f"this WordPiece vocab has no unknown-token id for the word {word!r}")
        return [unk]


# --- the native core's tables -------------------------------------------------------------------------
_ALL = 0x110000  # every code point, 0..U+10FFFF


@functools.cache
def nfd_first_table() -> np.ndarray:
    """nfd_first of every code point (uint32). A block of code points whose string NFD leaves as it is holds no
    character that decomposes (NFD only replaces characters by their decompositions and reorders marks), so
    only the other blocks ask unicodedata one character at a time."""
    table = np.arange(_ALL, dtype=np.uint32)
    for lo in range(0x80, _ALL, 1024):
        cps = range(lo, min(lo + 1024, _ALL))
        if not unicodedata.is_normalized("NFD", "".join(map(chr, cps))):
            table[lo:lo + len(cps)] = [nfd_first(cp) for cp in cps]
    return table


@functools.cache
def lower_table() -> np.ndarray:
    """to_lower of every code point (uint32), lowercased a block at a time (one character at a time only in a
    block where some lowercase is longer than its character)."""
    parts = []
    for lo in range(0, _ALL, 4096):
        block = "".join(map(chr, range(lo, min(lo + 4096, _ALL))))
        low = block.lower()
        if len(low) != len(block):
            low = "".join(c.lower()[0] for c in block)
        parts.append(np.frombuffer(low.encode("utf-32-le", "surrogatepass"), np.uint32))
    table = np.concatenate(parts)
    table[:0x41] = np.arange(0x41)
    return table


@functools.cache
def norm_table(lowercase: bool, strip_accents: bool) -> np.ndarray:
    """What _NormTable makes of every code point, for the core (uint32): the code point it becomes in the low
    21 bits, above them 0 (kept), 1 (a space: ends a word), 2 (dropped) or 3 (a word of its own)."""
    cp = nfd_first_table() if strip_accents else np.arange(_ALL, dtype=np.uint32)
    flags = unicode_flags()[cp]
    cat = flags & ud.CATEGORIES
    out = lower_table()[cp] if lowercase else cp
    chinese = np.zeros(_ALL, bool)
    for a, b in CHINESE_RANGES:
        chinese[a:b + 1] = True
    drop = (cp == 0) | (cp == 0xFFFD) | (cat == ud.CONTROL) | ((cat == ud.ACCENT_MARK) & strip_accents)
    alone = (cat == ud.PUNCTUATION) | ((cat == ud.SYMBOL) & (cp < 0x7F)) | chinese[cp]
    cls = np.where(flags & ud.WHITESPACE, 1, np.where(drop, 2, np.where(alone, 3, 0))).astype(np.uint32)
    return np.ascontiguousarray(out | cls << 21, np.uint32)


class NativeWPMEncoder(WPMEncoder):
    """WPMEncoder whose encode runs in the native core (C): the per-code-point table above (norm_table) and a
    greedy longest match over a byte trie of the tokens, with the GIL released. The Python methods it inherits
    stay for offsets and for text that is not valid UTF-8; they give the same ids."""

    backend = "native"

    def __init__(self, vocab: Vocab, core: ModuleType) -> None:
        super().__init__(vocab)
        arrays = vocab.arrays()
        ids = np.fromiter(vocab.token_to_id.values(), np.int32, len(vocab.token_to_id))
        unk = vocab.special.get("unk")
        self._core = core.WPM(arrays.token_bytes, arrays.token_offsets, ids,
                              norm_table(self.lowercase, self.strip_accents), -1 if unk is None else unk,
                              tuple(range(vocab.n_vocab)))

    @classmethod
    def build(cls, vocab: Vocab, core: ModuleType) -> NativeWPMEncoder:
        return cls(vocab, core)

    def encode(self, text: str) -> list[int]:
        ids = self._core.encode(text)
        # None: code points read from raw bytes (encode_escaped, no UTF-8 form), or no unk id where one is needed;
        # the pure path reads the first as llama.cpp does and reports the second
        return super().encode(text) if ids is None else ids
