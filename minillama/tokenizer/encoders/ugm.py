"""Unigram (SentencePiece unigram, T5-style) as llama.cpp runs it: llm_tokenizer_ugm.

The algorithm, plainly: normalize the fragment (user-defined token prefixes kept verbatim, then the
longest match in the precompiled charsmap replaced, invalid UTF-8 bytes turned into U+FFFD; then
spaces become U+2581, with a dummy prefix and/or runs of spaces merged as the vocab says); then a
Viterbi pass over the normalized text, one UTF-8 code point at a time: the best-scoring split into
normal / user-defined (score 0) / unused tokens, where a code point no single token covers may be
the unknown token at (lowest normal score - 10); consecutive unknowns are emitted as one. The
charsmap is parsed at load (ugm_charsmap.py, by Vocab); normalisation is ugm_normalize.py; this file
is the encoder: its tables, the Viterbi passes and encode.

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
from types import ModuleType
from typing import TypeVar

import numpy as np

from ...errors import FormatError
from ...gguffile.constants import Keys
from ..text import SPACE, SURROGATES, to_bytes, utf8_len
from ..vocab import Attr, Vocab
from . import base
from .base import Encoder, last_cut_before
from .ugm_normalize import _NO, UGMNormalizer

DBL_LOWEST = -sys.float_info.max  # llama.cpp's -DBL_MAX: the score of a position not reached yet
UNKNOWN_PENALTY = np.float32(10.0)

T = TypeVar("T", str, bytes)

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
    """Byte-level versions of the token tables, for the exact slow path."""

    def __init__(self, entries: list[tuple[str, tuple[int, float]]]) -> None:
        self.tokens, self.long = _prefix_table([(to_bytes(t), e) for t, e in entries])
        self.max_len = max((len(k) for k in self.tokens), default=0)


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


class UGMEncoder(UGMNormalizer, Encoder):
    """llama.cpp's UGM (Unigram) tokenizer over a vocab with scores and a precompiled charsmap."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        n = vocab.n_vocab
        # llama.cpp builds its tables from the attributes the token types give, before the
        # special-token-by-text pass adds bits; the runtime checks (user-defined score 0) use the final ones.
        init_attrs = vocab.type_attrs.tolist() if vocab.type_attrs is not None else [int(Attr.NORMAL)] * n
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
        self.table, self.long = _prefix_table([(t, e) for t, e in entries if not SURROGATES.search(t)])
        self.split_limit = _exact_sum_limit([e[1] for _, e in entries] + [self.unknown_score])
        keep = {t[k - 1] for t, _ in entries for k in range(1, len(t)) if t[k] == SPACE}
        left = f"[^{''.join(re.escape(c) for c in sorted(keep))}]" if keep else "."
        self._cut = re.compile(f"(?<={left})(?={SPACE})", re.DOTALL)
        self._cut_all = not keep

        self._bytes: _ByteTables | None = None
        self._init_normalizer(vocab)

    # --- Encoder interface -----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Normalize the fragment, cut it where no token spans (see the module docstring), Viterbi per segment."""
        ids = None
        if self.fast_ok and not SURROGATES.search(text):
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
            ids = self._viterbi_bytes(self._normalize_bytes(to_bytes(text)))
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

    def _byte_tables(self) -> _ByteTables:
        bt = self._bytes
        if bt is None:
            bt = self._once("_bytes", lambda: _ByteTables(self.byte_token_entries))
        return bt

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
            units = min(utf8_len(s[i]), n - i)
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


def _blob(texts: list[bytes]) -> tuple[bytes, np.ndarray]:
    """texts as one blob and n + 1 int64 offsets."""
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=offsets[1:])
    return b"".join(texts), offsets


class NativeUGMEncoder(UGMEncoder):
    """UGMEncoder whose encode runs in the native core (C): the byte-level normalisation and Viterbi of llama.cpp,
    with the GIL released, from the tables this class builds (its token entries, user-defined texts and the
    vocab's charsmap). The Python methods it inherits stay for offsets; they give the same ids."""

    backend = "native"

    def __init__(self, vocab: Vocab, core: ModuleType) -> None:
        super().__init__(vocab)
        tok_bytes, tok_off = _blob([to_bytes(t) for t, _ in self.byte_token_entries])
        ids = np.array([e[0] for _, e in self.byte_token_entries], np.int32)
        # the vocab's float32 scores (or 0.0), which float32 holds exactly
        scores = np.array([e[1] for _, e in self.byte_token_entries], np.float32)
        user_bytes, user_off = _blob([to_bytes(t) for t in self.user_texts])
        cm = self.charsmap
        units = np.zeros(0, np.uint32) if cm is None else np.ascontiguousarray(cm.units, np.uint32)
        repl = b"" if cm is None else cm.replacements
        self._core = core.UGM(tok_bytes, tok_off, ids, scores, user_bytes, user_off, units, repl, self.unk_id,
                              self.unknown_score, self.escape_whitespaces, self.add_space_prefix,
                              self.remove_extra_whitespaces, tuple(range(vocab.n_vocab)))

    @classmethod
    def build(cls, vocab: Vocab, core: ModuleType) -> NativeUGMEncoder | None:
        """The native encoder, or None for a charsmap without units (the pure path reports it)."""
        if vocab.charsmap is not None and not len(vocab.charsmap.units):
            return None
        return cls(vocab, core)

    def encode(self, text: str) -> list[int]:
        ids = self._core.encode(text)
        if ids is None and SURROGATES.search(text):  # raw bytes as surrogate escapes: their bytes
            ids = self._core.encode(to_bytes(text))
        if ids is None or (self.unk_id < 0 and -1 in ids):
            return super().encode(text)  # a broken charsmap or no unknown token: the pure path raises
        return ids
