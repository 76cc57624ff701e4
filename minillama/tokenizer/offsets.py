"""Character offsets: the (start, end) span of the text each token came from (HF tokenizers' Encoding.offsets).

The algorithm, plainly: each encoder turns a plain-text fragment into a model-space string of which
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

from collections.abc import Callable, Sequence

import numpy as np

from .encoders import Encoder
from .text import SPACE
from .vocab import Attr

Span = tuple[int, int]


def walk(s: str, lengths: Sequence[int], src: Sequence[int] | None = None,
         src_end: Sequence[int] | None = None) -> list[Span]:
    """Spans of consecutive tokens consuming lengths[i] UTF-8 bytes of s each; src/src_end map a character
    index of s to the first / one-past-last source character it stands for (None: itself)."""
    ends = np.cumsum(np.asarray(lengths, np.int64))
    return spans_of_ranges(s, ends - np.asarray(lengths, np.int64), ends, src, src_end)


def spans_of_ranges(s: str, b0: np.ndarray, b1: np.ndarray, src: Sequence[int] | None = None,
                    src_end: Sequence[int] | None = None) -> list[Span]:
    """Spans of tokens covering the UTF-8 byte ranges [b0[i], b1[i]) of s, in one pass of array work: the
    character of every byte is a cumulative count of the bytes that start a character."""
    n = len(s)
    if not n or not len(b0):
        return [(0, 0)] * len(b0)
    data = s.encode("utf-8", "surrogatepass")
    if len(data) == n:  # ASCII: a byte is a character
        char_of = np.arange(n, dtype=np.int64)
    else:
        char_of = np.cumsum((np.frombuffer(data, np.uint8) & 0xC0) != 0x80, dtype=np.int64) - 1
    last = len(data) - 1
    b0 = np.minimum(b0, len(data))
    b1 = np.minimum(b1, len(data))
    empty = b1 <= b0
    c0 = char_of[np.minimum(b0, last)]
    c1 = char_of[np.maximum(b1 - 1, 0)]
    if src is None:
        start, end = c0, c1 + 1
    else:
        start = np.asarray(src, np.int64)[c0]
        end = np.asarray(src_end, np.int64)[c1]
    # a range of no bytes: zero width where its byte is (at the end of s: after its last character)
    at_end = b0 >= len(data)
    pos = np.where(at_end, n if src is None else np.asarray(src_end, np.int64)[n - 1], start)
    start = np.where(empty, pos, start)
    end = np.where(empty, pos, end)
    return list(zip(start.tolist(), end.tolist()))


def bpe_spans(encoder: Encoder, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    if prepared != frag:  # SPM-style BPE (U+2581 for spaces): the text itself is model space
        return spm_spans(encoder, pieces, frag, prepared, ids)
    # Byte-level pieces spell the text's bytes, except where a pre-tokenizer drops or changes a character
    # (falcon's \v): there a piece is looked for a few bytes on, and the bytes skipped belong to no token.
    data = frag.encode("utf-8")
    lengths = [len(pieces[i]) for i in ids]
    if sum(lengths) == len(data):
        return walk(frag, lengths)
    starts = []
    b = 0
    for i in ids:
        p = pieces[i]
        if p and not data.startswith(p, b):
            j = data.find(p, b, b + len(p) + 16)
            if j > b:
                b = j
        starts.append(b)
        b += len(p)
    b0 = np.asarray(starts, np.int64)
    return spans_of_ranges(frag, b0, b0 + np.asarray(lengths, np.int64))


def spm_spans(encoder: Encoder, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    tokens, attrs = encoder.vocab.tokens, encoder.vocab.attrs
    byte = int(Attr.BYTE)
    lengths = [1 if attrs[i] & byte else len(tokens[i].encode("utf-8", "surrogateescape")) for i in ids]
    shift = len(prepared) - len(frag)  # the dummy prefix
    src = np.maximum(np.arange(len(prepared)) - shift, 0)
    return walk(prepared, lengths, src, src + (np.arange(len(prepared)) >= shift))


def wpm_spans(encoder: Encoder, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    table = encoder._table  # type: ignore[attr-defined]
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
    # all words joined: one array pass maps every token's bytes back to the characters they came from
    tokens, unk = encoder.vocab.tokens, encoder.vocab.special.get("unk")
    phantom = len(SPACE.encode())
    b0: list[int] = []
    b1: list[int] = []
    src_all: list[int] = []
    end_all: list[int] = []
    off = 0
    for word, wsrc, wend in words:
        size = len(word.encode("utf-8", "surrogatepass"))
        wids = encoder.encode(word)
        if wids == [unk]:
            b0.append(off)
            b1.append(off + size)
        else:
            b = off - phantom  # the word's first token carries the U+2581 phantom prefix
            for t in wids:
                k = len(tokens[t].encode("utf-8", "surrogateescape"))
                b0.append(max(b, off))
                b1.append(b + k)
                b += k
        off += size
        src_all += wsrc
        end_all += wend
    return spans_of_ranges("".join(w for w, _, _ in words), np.asarray(b0, np.int64), np.asarray(b1, np.int64),
                           src_all, end_all)


def ugm_spans(encoder: Encoder, pieces: Sequence[bytes], frag: str, prepared: str, ids: list[int]) -> list[Span]:
    data = frag.encode("utf-8")
    src: list[int] = []
    full = encoder._normalize_bytes(data, src)  # type: ignore[attr-defined]
    tokens, unk = encoder.vocab.tokens, encoder.vocab.special.get("unk")
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
    char_of = np.cumsum((np.frombuffer(data, np.uint8) & 0xC0) != 0x80, dtype=np.int64) - 1
    out: list[Span] = []
    for b0, b1 in ranges:
        came = [x for x in src[b0:b1] if x >= 0]
        if came:
            out.append((int(char_of[min(came)]), int(char_of[max(came)]) + 1))
        else:  # a dummy-prefix marker: zero width where the next source character starts
            nxt = next((x for x in src[b1:] if x >= 0), len(data))
            c = int(char_of[nxt]) if nxt < len(data) else len(frag)
            out.append((c, c))
    return no_overlap(out)


def no_overlap(spans: list[Span]) -> list[Span]:
    """A span reaching into the next one (but not identical to it: tokens sharing a character) ends where it starts."""
    for k in range(len(spans) - 2, -1, -1):
        (s, e), (s2, e2) = spans[k], spans[k + 1]
        if s2 < e and (s, e) != (s2, e2):
            spans[k] = (s, max(s, s2))
    return spans


#: vocab kind (Tokenizer.model) -> its span function
SPANS: dict[str, Callable[[Encoder, Sequence[bytes], str, str, list[int]], list[Span]]] = {
    "bpe": bpe_spans, "spm": spm_spans, "wpm": wpm_spans, "ugm": ugm_spans,
}


__all__ = ["SPANS", "walk"]
