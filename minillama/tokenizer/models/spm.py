"""Score-based merging (SentencePiece BPE as llama.cpp runs it): llm_tokenizer_spm.

The algorithm, plainly: split the text (spaces already U+2581) into UTF-8 characters; while some
adjacent pair of symbols concatenates to a vocab token, merge the pair whose token has the highest
score (ties: the leftmost); finally emit each symbol's id, or its bytes as <0xXX> tokens.

Made fast without changing a single id: two neighbouring characters that no vocab token holds side
by side can never end up in one symbol, so the text splits there into words that merge
independently (and are cached). Short words use the plain quadratic loop; long ones the heap +
linked list, O(n log n).
"""

from __future__ import annotations

import heapq
import re

from ..vocab import Vocab
from .base import Model

SPACE = "\u2581"
HEAP_MIN_LEN = 48
_NO_PAIR = float("-inf")


class SPMModel(Model):
    """llama.cpp's SPM tokenizer over a vocab with scores."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__(vocab)
        self.scores: list[float] = vocab.scores.tolist()
        self._byte_ids: list[int] | None = None
        self._splitter: re.Pattern[str] | None = None

    def prepare(self, text: str, after_special: bool) -> str:
        """The dummy space prefix (at the start and after a special token) and the U+2581 space marker."""
        if after_special and self.vocab.add_space_prefix:
            text = " " + text
        return text.replace(" ", SPACE)

    # --- splitting where no merge can cross -------------------------------------------------
    def words(self, text: str) -> list[str]:
        rx = self._splitter
        if rx is None:
            rx = self._splitter = self._build_splitter()
        return rx.split(text)

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

    # --- merging -----------------------------------------------------------------------------
    def encode_word(self, word: str) -> list[int]:
        syms = self._merge_heap(word) if len(word) >= HEAP_MIN_LEN else self._merge_simple(word)
        out: list[int] = []
        t2i = self.token_to_id
        for s in syms:
            i = t2i.get(s)
            if i is not None:
                out.append(i)
            else:
                out += self._bytes_of(s)
        return out

    def _merge_simple(self, word: str) -> list[str]:
        """Highest-score pair first, leftmost on ties; pair scores are kept and only two updated per merge."""
        syms = list(word)
        if len(syms) < 2:
            return syms
        t2i, scores = self.token_to_id, self.scores

        def score(pair: str) -> float:
            t = t2i.get(pair)
            return _NO_PAIR if t is None else scores[t]

        ss = [score(a + b) for a, b in zip(syms, syms[1:])]
        while True:
            best = max(ss)
            if best == _NO_PAIR:  # no pair is a token (or only tokens scored -inf: find those)
                i = next((j for j in range(len(ss)) if syms[j] + syms[j + 1] in t2i), -1)
                if i < 0:
                    break
            else:
                i = ss.index(best)
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
            del ss[i]
            if i < len(ss):
                ss[i] = score(syms[i] + syms[i + 1])
            if i > 0:
                ss[i - 1] = score(syms[i - 1] + syms[i])
            if not ss:
                break
        return syms

    def _merge_heap(self, word: str) -> list[str]:
        t2i, scores = self.token_to_id, self.scores
        syms = list(word)
        n = len(syms)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            t = t2i.get(syms[left] + syms[right])
            if t is not None:
                heap.append((-scores[t], left, right, len(syms[left]) + len(syms[right])))

        for i in range(n - 1):
            push(i, i + 1)
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            sl, sr = syms[left], syms[right]
            if not sl or not sr or len(sl) + len(sr) != size or nxt[left] != right:
                continue
            syms[left] = sl + sr
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            for a, b in ((prv[left], left), (left, nxt[left])):
                if a >= 0 and b >= 0:
                    t = t2i.get(syms[a] + syms[b])
                    if t is not None:
                        heapq.heappush(heap, (-scores[t], a, b, len(syms[a]) + len(syms[b])))
        return [s for s in syms if s]

    # --- byte fallback -----------------------------------------------------------------------
    def _bytes_of(self, sym: str) -> list[int]:
        ids = self._byte_ids
        if ids is None:
            ids = self._byte_ids = [self._byte_token(b) for b in range(256)]
        out = []
        for b in sym.encode("utf-8", "surrogateescape"):
            if ids[b] < 0:
                raise KeyError(f"the vocab has no byte token for byte {b:#04x}")
            out.append(ids[b])
        return out

    def _byte_token(self, b: int) -> int:
        t2i = self.token_to_id
        i = t2i.get(f"<0x{b:02X}>")
        if i is None:
            i = t2i.get(chr(b) if b < 0x80 else chr(0xDC00 + b), -1)
        return i
