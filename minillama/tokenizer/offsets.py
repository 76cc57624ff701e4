"""Character offsets: the (start, end) span of the text each token came from (HF tokenizers' Encoding.offsets).

The algorithm, plainly: each merge model turns a plain-text fragment into a model-space string of which
its tokens consume known lengths, left to right; walk the tokens along that string and map each consumed
range back to the characters of the fragment it came from.

* BPE: the fragment itself; each token consumes the bytes of its piece (byte-level BPE pieces concatenate
  to the text's UTF-8 exactly).
* SPM: the fragment with the dummy-prefix space and U+2581 for spaces; a token consumes its text's UTF-8
  (a byte token one byte). The dummy prefix belongs to no character, so the first token starts at 0.
* WPM: the normalised words (each character of a word maps back to the one character it came from;
  dropped characters and whitespace belong to no token); a word's first token does not count its U+2581.
* UGM: the normalised text (charsmap, whitespace rules), from the normaliser run with a map from each
  output byte to the input byte it comes from (a space marker to the space before its word; the dummy
  prefix to nothing: zero width).

A range that starts or ends inside a character takes that whole character, so the byte tokens of one
character all get that character's span, as Hugging Face does. Spans are therefore in order and never
overlap, except in a character whose bytes two tokens split between them: both spans hold it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate

from .models import Model
from .models.base import SURROGATES
from .vocab import Attr

Span = tuple[int, int]
SPACE = "\u2581"


def _byte_starts(s: str) -> list[int]:
    """The UTF-8 byte offset at which each character of s starts."""
    return list(accumulate((len(c.encode("utf-8", "surrogatepass")) for c in s[:-1]), initial=0)) if s else []


def walk(s: str, lengths: Sequence[int], src: Callable[[int], int], src_end: Callable[[int], int]) -> list[Span]:
    """Spans of consecutive tokens consuming lengths[i] UTF-8 bytes of s each; src/src_end map a character
    index of s to the first / one-past-last source character it stands for."""
    ranges = []
    b = 0
    for k in lengths:
        ranges.append((b, b + k))
        b += k
    return spans_of_ranges(s, ranges, src, src_end)


def spans_of_ranges(s: str, ranges: Sequence[tuple[int, int]], src: Callable[[int], int],
                    src_end: Callable[[int], int]) -> list[Span]:
    """Spans of tokens covering the UTF-8 byte ranges [b0, b1) of s (in order)."""
    starts = _byte_starts(s)
    n_bytes = starts[-1] + len(s[-1].encode("utf-8", "surrogatepass")) if s else 0
    out: list[Span] = []
    for b0, b1 in ranges:
        b0, b1 = min(b0, n_bytes), min(b1, n_bytes)
        if b1 <= b0:
            pos = src(bisect_right(starts, b0) - 1) if b0 < n_bytes else src_end(len(s) - 1) if s else 0
            out.append((pos, pos))
        else:
            out.append((src(bisect_right(starts, b0) - 1), src_end(bisect_right(starts, b1 - 1) - 1)))
    return out


def bpe_spans(model: Model, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    if prepared != frag:  # SPM-style BPE (U+2581 for spaces): the text itself is model space
        return spm_spans(model, pieces, frag, prepared, ids)
    # Byte-level pieces spell the text's bytes, except where a pre-tokenizer drops or changes a character
    # (falcon's \v): there a piece is looked for a few bytes on, and the bytes skipped belong to no token.
    data = frag.encode("utf-8")
    ranges = []
    b = 0
    for i in ids:
        p = pieces[i]
        if p and not data.startswith(p, b):
            j = data.find(p, b, b + len(p) + 16)
            if j > b:
                b = j
        ranges.append((b, b + len(p)))
        b += len(p)
    return spans_of_ranges(frag, ranges, int, lambda c: c + 1)


def spm_spans(model: Model, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    tokens, attrs = model.vocab.tokens, model.vocab.attrs
    byte = int(Attr.BYTE)
    lengths = [1 if attrs[i] & byte else len(tokens[i].encode("utf-8", "surrogateescape")) for i in ids]
    shift = len(prepared) - len(frag)  # the dummy prefix
    return walk(prepared, lengths, lambda c: max(c - shift, 0), lambda c: max(c + 1 - shift, 0))


def wpm_spans(model: Model, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    table = model._table  # type: ignore[attr-defined]
    words: list[tuple[str, list[int], list[int]]] = []
    chars: list[str] = []
    src: list[int] = []
    src_end: list[int] = []
    for i, c in enumerate(frag):
        for ch in table[ord(c)]:
            if ch == " ":
                if chars:
                    words.append(("".join(chars), src, src_end))
                    chars, src, src_end = [], [], []
            else:
                chars.append(ch)
                src.append(i)
                src_end.append(i + 1)
    if chars:
        words.append(("".join(chars), src, src_end))
    tokens, unk = model.vocab.tokens, model.vocab.special.get("unk")
    spans: list[Span] = []
    for word, wsrc, wend in words:
        wids = model.encode(word)
        if wids == [unk]:
            spans.append((wsrc[0], wend[-1]))
            continue
        lengths = [len(tokens[t].encode("utf-8", "surrogateescape")) for t in wids]
        lengths[0] -= len(SPACE.encode())
        spans += walk(word, lengths, wsrc.__getitem__, wend.__getitem__)
    return spans


def ugm_spans(model: Model, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    data = frag.encode("utf-8")
    src: list[int] = []
    full = model._normalize_bytes(data, src)  # type: ignore[attr-defined]
    tokens, unk = model.vocab.tokens, model.vocab.special.get("unk")
    texts = [None if t == unk else tokens[t].encode("utf-8", "surrogateescape") for t in ids]
    ranges: list[tuple[int, int]] = []  # bytes of the normalised text each token covers
    b = 0
    for k, t in enumerate(texts):
        if t is None:  # the unknown token covers up to the next token's text (or the end)
            nxt = next((x for x in texts[k + 1:] if x is not None), None)
            j = full.find(nxt, b + 1) if nxt else -1
            end = j if j > b else len(full)
        else:
            end = min(b + len(t), len(full))
        ranges.append((b, end))
        b = end
    starts = _byte_starts(frag)
    out: list[Span] = []
    for b0, b1 in ranges:
        came = [x for x in src[b0:b1] if x >= 0]
        if came:
            out.append((bisect_right(starts, min(came)) - 1, bisect_right(starts, max(came)) - 1 + 1))
        else:  # a dummy-prefix marker: zero width where the next source character starts
            nxt = next((x for x in src[b1:] if x >= 0), len(data))
            c = bisect_right(starts, nxt) - 1 if nxt < len(data) else len(frag)
            out.append((c, c))
    return no_overlap(out)


def no_overlap(spans: list[Span]) -> list[Span]:
    """A span reaching into the next one (but not identical to it: tokens sharing a character) ends where it starts."""
    for k in range(len(spans) - 2, -1, -1):
        (s, e), (s2, e2) = spans[k], spans[k + 1]
        if s2 < e and (s, e) != (s2, e2):
            spans[k] = (s, max(s, s2))
    return spans


#: merge model name -> its span function
SPANS: dict[str, Callable[[Model, Sequence[bytes], str, str, list[int]], list[Span]]] = {
    "bpe": bpe_spans, "spm": spm_spans, "wpm": wpm_spans, "ugm": ugm_spans,
}


def has_surrogates(text: str) -> bool:
    return SURROGATES.search(text) is not None


__all__ = ["SPANS", "walk", "has_surrogates"]
