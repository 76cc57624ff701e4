"""Rank-based merging (GPT-2 style byte-level BPE as llama.cpp runs it): llm_tokenizer_bpe.

The algorithm, plainly: the pre-tokenizer splits text into words; each word becomes its GPT-2
byte-level characters; while some adjacent pair is a listed merge, merge the pair of lowest rank
(ties: the leftmost); finally emit each symbol's id, or, for a symbol that is not a token, the ids
of its single bytes where those exist (llama.cpp drops the rest).

Words repeat, so each word's ids are cached. Short words use the plain loop; long ones (a run of
100,000 'a's is one word) the heap + linked list, O(n log n).

Words are code points (models/base.py): raw bytes in the text have already been decoded the way
llama.cpp decodes them, so a surrogate code point here stands for itself and is encoded with
'surrogatepass' (the bytes ED A0 80 read as U+D800 become those three bytes again).
"""

from __future__ import annotations

import operator
import re
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate, repeat

from ..pretokenize import PreTokenizer
from ..tables import PATTERNS
from ..text import SPACE
from ..unicode import byte_encode, byte_token, raw_byte_token
from ..vocab import Vocab
from . import base
from .base import Model
from .merge import linked_list, merge_queue, with_bytes

HEAP_MIN_LEN = 48
_NO_MERGE = 1 << 62
# Huge fragments are cut after a newline followed by a non-space (as minillama.tokenizer.train cuts a corpus),
# checked against the words of the text read on _MARGIN characters past the cut.
_NEWLINE_CUT = re.compile(r"\n(?=\S)")
_MARGIN = 1 << 12


class BPEModel(Model):
    """llama.cpp's BPE tokenizer over a vocab with merges and a pre-tokenizer."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        spec = vocab.pre_spec
        assert spec is not None
        self.spec = spec
        self.pretokenizer = PreTokenizer(PATTERNS[spec.patterns])
        # Built at load, not on first use: every encode needs it, and a first call should not pay
        # for hashing 280k merges (llama3: ~35 ms) on top of its own work.
        self._ranks: dict[str, int] | None = self._build_ranks()
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
