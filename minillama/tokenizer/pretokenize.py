"""BPE pre-tokenizers: text -> words, as llama.cpp's unicode_regex_split does for a list of patterns.

Several patterns apply in sequence: each splits every piece the previous ones produced into matches
and the gaps between them. Which patterns a vocab uses is data (`tables.py`); how each becomes a
Python regex that matches what llama.cpp matches is `regex_translate.py`. A pattern runs in one of
four ways: a hand-written llama.cpp splitter as its exact regex ("text"), a hand-written function
on spans ("func": AFMoE's digit groups), a \\p{...} pattern on the collapsed text ("collapsed"), or
a plain pattern on the code points with non-ASCII whitespace seen as \\v ("wide").
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate, chain

from . import unicode_data as ud
from .regex_translate import UCAT, bmp_view, collapse_pattern, ecmascript, exact_custom
from .tables import AFMOE_DIGITS, CUSTOM_SPLITTERS, TINY_AYA_DIGITS
from .unicode import COLLAPSE, WIDE


def _afmoe_digits(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """llama.cpp's AFMoE digit splitter: digit runs in groups of three, the remainder first."""
    out: list[tuple[int, int]] = []
    isnum = _number_rx().match
    for s, e in spans:
        prev, pos = s, s
        while pos < e:
            if not isnum(text, pos):
                pos += 1
                continue
            start = pos
            while pos < e and isnum(text, pos):
                pos += 1
            cur = start + (pos - start) % 3
            if cur > start:
                out.append((prev, cur))
                prev = cur
            while cur < pos:
                out.append((prev, cur + 3))
                prev = cur = cur + 3
        if prev < e:
            out.append((prev, e))
    return out


# Patterns llama.cpp runs as hand-written functions on spans (unicode_regex_split_custom_afmoe).
_FUNCS = {AFMOE_DIGITS: _afmoe_digits, TINY_AYA_DIGITS: _afmoe_digits}


@functools.cache
def _number_rx() -> re.Pattern[str]:
    """One code point that llama.cpp flags as a number."""
    return re.compile(f"[{ud.char_class(ud.NUMBER)}]")


def _split_custom(rx: re.Pattern[str], text: str) -> list[str]:
    """Words of text under one of the hand-written splitters' patterns (they match every character)."""
    view, replaced = bmp_view(text)
    words = rx.findall(view)
    if replaced:  # the words holding a stand-in, cut from text instead
        ends = list(accumulate(map(len, words)))
        for pos in replaced:
            i = bisect_right(ends, pos)
            words[i] = text[ends[i] - len(words[i]):ends[i]]
    return words


# Bounds of the per-step memo of multi-pattern pre-tokenizers: pieces longer than this are not
# remembered, and a step keeps at most two generations of this many pieces (memory stays flat).
MEMO_MAX_CHARS = 128
MEMO_MAX_PIECES = 1 << 15


@dataclass
class PreTokenizer:
    """Splits text into words as llama.cpp's unicode_regex_split does for a list of patterns."""

    patterns: tuple[str, ...]
    _steps: list[tuple[str, object]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        steps: list[tuple[str, object]] = []
        for expr in self.patterns:
            if expr in CUSTOM_SPLITTERS:
                steps.append(("text", exact_custom(expr)))
            elif expr in _FUNCS:
                steps.append(("func", _FUNCS[expr]))
            elif any(cat in expr for cat in UCAT):
                steps.append(("collapsed", ecmascript(collapse_pattern(expr))))
            else:
                steps.append(("wide", ecmascript(expr)))
        self._steps = steps
        # per step: (young, old) generations of piece -> words, as the word caches (encoders/base.py)
        self._memo: list[list[dict[str, list[str]]]] = [[{}, {}] for _ in steps]

    def spans(self, text: str, first: int = 0, last: int | None = None) -> list[tuple[int, int]]:
        """(start, end) code point offsets of the words of text after steps first..last-1 (all by default)."""
        spans = [(0, len(text))] if text else []
        views: dict[str, str] = {}
        for kind, rx in self._steps[first:last]:
            if kind == "func":
                spans = rx(text, spans)  # type: ignore[operator]
                continue
            src = views.get(kind)
            if src is None:
                if kind == "text":
                    src = bmp_view(text)[0]
                else:
                    src = text if text.isascii() else text.translate(COLLAPSE if kind == "collapsed" else WIDE)
                views[kind] = src
            new: list[tuple[int, int]] = []
            append = new.append
            n = len(src)
            for s, e in spans:
                if s == 0 and e == n:
                    chunk, base = src, 0
                else:
                    chunk, base = src[s:e], s
                pos = 0
                for m in rx.finditer(chunk):  # type: ignore[attr-defined]
                    a, b = m.span()
                    if a > pos:
                        append((base + pos, base + a))
                    if b > a:
                        append((base + a, base + b))
                    pos = b
                if pos < e - s:
                    append((base + pos, e))
            spans = new
        return spans

    def split(self, text: str) -> list[str]:
        """The words of text, in order; their concatenation is text."""
        steps = self._steps
        if len(steps) == 1 and steps[0][0] == "text":
            return _split_custom(steps[0][1], text)  # type: ignore[arg-type]
        if len(steps) == 1:
            return [text[s:e] for s, e in self.spans(text)]
        return self._split_from(text, 0)

    def _split_from(self, text: str, k: int) -> list[str]:
        """The words of text after steps k.. (several patterns).

        Every pattern after the first works inside the pieces the earlier ones made, as if each
        piece were the whole text, so a piece's words depend on the piece alone: they are
        memoized per step for pieces short enough to repeat (words, not lines), in two generations
        (a full young one becomes the old one; a piece found in the old one moves back), so pieces
        in use are never forgotten and memory stays under 2 x MEMO_MAX_PIECES pieces per step.
        """
        steps = self._steps
        kind, rx = steps[k]
        if kind == "text":  # a hand-written llama.cpp splitter: its words cover the text, findall is enough
            pieces = _split_custom(rx, text)  # type: ignore[arg-type]
        else:
            pieces = [text[s:e] for s, e in self.spans(text, k, k + 1)]
        k += 1
        if k == len(steps):
            return pieces
        gen = self._memo[k]
        got = list(map(gen[0].get, pieces))
        if None in got:
            for i, words in enumerate(got):
                if words is None:
                    piece = pieces[i]
                    words = gen[1].get(piece)
                    if words is None:
                        words = self._split_from(piece, k)
                    if len(piece) <= MEMO_MAX_CHARS:
                        young = gen[0]
                        if len(young) >= MEMO_MAX_PIECES:
                            gen[1], gen[0] = young, {}
                            young = gen[0]
                        young[piece] = words
                    got[i] = words
        return list(chain.from_iterable(got))  # type: ignore[arg-type]
