"""Splitting special tokens out of text, as llama.cpp's tokenizer_st_partition does.

Special tokens (control, user-defined, unknown) are searched longest first; every occurrence of
one splits each remaining text fragment. Control and unknown tokens are only matched when
parse_special is set; user-defined tokens always are (as Hugging Face tokenizers does). A token with
the lstrip/rstrip attribute swallows the C whitespace on that side of it.

llama.cpp searches bytes, so a special token whose text is not whole UTF-8 (the single byte C3, say)
matches inside a character ("é" is C3 A9). When a vocab has such a token, the search runs on a
byte view of the text (each byte one latin-1 character) and the plain-text fragments come back as
str with the bytes they hold that are not whole UTF-8 as surrogate escapes (U+DC80..U+DCFF), the
form `encode` gives raw bytes.

Special-token control, as tiktoken's allowed_special / disallowed_special: which control tokens written in
a text become their ids, and the error for a disallowed one the text holds (`special_control`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal

from ..errors import ArgumentError, ArgumentTypeError
from .text import ESCAPES
from .unicode import C_SPACE
from .vocab import Attr, Vocab

PREFIX_CHARS = 3
# Attr bits as plain ints, computed once (an IntFlag operation costs about a microsecond a call).
_SKIP, _LSTRIP, _RSTRIP = int(Attr.CONTROL | Attr.UNKNOWN), int(Attr.LSTRIP), int(Attr.RSTRIP)

#: tiktoken's allowed_special / disallowed_special: "all", or a collection of token texts.
SpecialSet = Literal["all"] | Iterable[str]


def always_matched(vocab: Vocab) -> list[int]:
    """The special ids matched without parse_special (not control, not unknown), longest first; kept on
    the vocab (llama3 has 256 control tokens that a plain encode would otherwise walk past each time)."""
    ids = vocab.__dict__.get("_always_matched")
    if ids is None:
        ids = vocab.__dict__["_always_matched"] = [i for i in vocab.special_cache if not vocab.attrs[i] & _SKIP]
    return ids


def _byte_view(text: str) -> str:
    """text's UTF-8 bytes, one latin-1 character each."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def _from_byte_view(view: str) -> str:
    return view.encode("latin-1").decode("utf-8", "surrogateescape")


def raw_special_ids(vocab: Vocab) -> bool:
    """Whether a special token's text holds bytes that are not whole UTF-8 (then matching works on bytes)."""
    return any(ESCAPES.search(vocab.tokens[i]) for i in vocab.special_cache)


def partition(vocab: Vocab, text: str, parse_special: bool, allowed: AbstractSet[int] = frozenset(),
              raw_special: bool = False) -> list[str | int]:
    """Text as a list of plain-text fragments (str) and special token ids (int), in order.

    raw_special: the vocab has a special token that is not whole UTF-8 (see raw_special_ids); the
    search then runs on bytes, as llama.cpp's does.
    """
    if not (parse_special or allowed or always_matched(vocab)):
        return [text] if text else []  # nothing to match: the whole text is plain
    if raw_special and text:
        view = _byte_view(text)
        tokens = {i: _byte_view(vocab.tokens[i]) for i in vocab.special_cache}
        spans = partition_spans(vocab, view, parse_special, allowed, tokens)
        return [_from_byte_view(view[s:e]) if t < 0 else t for s, e, t in spans]
    frags = partition_spans(vocab, text, parse_special, allowed)
    if len(frags) == 1 and frags[0][2] < 0:
        return [text]  # the common case: no special token in the text
    return [text[s:e] if t < 0 else t for s, e, t in frags]


def partition_spans(vocab: Vocab, text: str, parse_special: bool, allowed: AbstractSet[int] = frozenset(),
                    tokens: Sequence[str] | Mapping[int, str] | None = None) -> list[tuple[int, int, int]]:
    """(start, end, id) for each piece of text in order: id -1 for plain text text[start:end], else the special
    token matched at text[start:end]. Control/unknown tokens are matched when parse_special is set or their id
    is in allowed (tiktoken's allowed_special). tokens: the special tokens' texts (default: the vocab's)."""
    if not text:
        return []
    frags: list[tuple[int, int, int]] = [(0, len(text), -1)]
    tokens = vocab.tokens if tokens is None else tokens
    attrs = vocab.attrs
    skip, lstrip_bit, rstrip_bit = _SKIP, _LSTRIP, _RSTRIP
    # Vocabs hold up to thousands of special tokens that share a few prefixes ("<|reserved_...",
    # "[PAD..."): one search per distinct prefix rules most of them out of a long text at once.
    prefix_in_text: dict[str, bool] = {}
    for sid in vocab.special_cache if parse_special or allowed else always_matched(vocab):
        attr = attrs[sid]
        if not parse_special and attr & skip and sid not in allowed:
            continue
        tok = tokens[sid]
        head = tok[:PREFIX_CHARS]
        present = prefix_in_text.get(head)
        if present is None:
            present = prefix_in_text[head] = head in text
        if not present or tok not in text:
            continue
        lstrip, rstrip, n = attr & lstrip_bit, attr & rstrip_bit, len(tok)
        out: list[tuple[int, int, int]] = []
        for frag in frags:
            if frag[2] >= 0:
                out.append(frag)
                continue
            s, e, _ = frag
            while True:
                m = text.find(tok, s, e)
                if m < 0:
                    break
                left = m
                if lstrip:
                    while left > s and text[left - 1] in C_SPACE:
                        left -= 1
                if left > s:
                    out.append((s, left, -1))
                out.append((m, m + n, sid))
                s = m + n
                if rstrip:
                    while s < e and text[s] in C_SPACE:
                        s += 1
            if s < e:
                out.append((s, e, -1))
        frags = out
    return frags


def find_special(vocab: Vocab, text: str, ids: Iterable[int]) -> tuple[int, int] | None:
    """(position, id) of the first occurrence in text of any of the tokens ids (the longest one at a tie)."""
    best: tuple[int, int] | None = None
    for sid in ids:
        pos = text.find(vocab.tokens[sid], 0, len(text) if best is None else best[0] + 1)
        if pos >= 0 and (best is None or pos < best[0] or
                         (pos == best[0] and len(vocab.tokens[sid]) > len(vocab.tokens[best[1]]))):
            best = (pos, sid)
    return best


def special_control(vocab: Vocab, text: str, parse_special: bool, allowed_special: SpecialSet | None,
                    disallowed_special: SpecialSet | None) -> frozenset[int]:
    """Ids of the control tokens to match in text (tiktoken's allowed_special); raises ArgumentError for
    a disallowed one present in text. Empty, and nothing checked, when neither argument is given."""
    if allowed_special is None and disallowed_special is None:
        return frozenset()
    v = vocab
    mask = int(Attr.CONTROL | Attr.UNKNOWN)
    controls = {v.tokens[i]: i for i in v.special_cache if v.attrs[i] & mask}

    def ids_of(arg: SpecialSet, name: str) -> frozenset[int]:
        if isinstance(arg, str):
            if arg != "all":
                raise ArgumentError(f"{name} must be 'all' or a collection of token texts, got the str {arg!r}")
            return frozenset(controls.values())
        if not isinstance(arg, Iterable):
            raise ArgumentTypeError(f"{name} must be 'all' or a collection of token texts, "
                                    f"got {type(arg).__name__}")
        out = set()
        for t in arg:
            if t not in controls:
                raise ArgumentError(f"{name}: {t!r} is not a control token of this vocab (expected one of "
                                    f"{', '.join(repr(c) for c in list(controls)[:8])}"
                                    f"{', ...' if len(controls) > 8 else ''})")
            out.add(controls[t])
        return frozenset(out)

    allowed = ids_of(allowed_special, "allowed_special") if allowed_special is not None else frozenset()
    if parse_special:
        allowed = frozenset(controls.values())
    disallowed = ids_of("all" if disallowed_special is None else disallowed_special, "disallowed_special")
    found = find_special(v, text, disallowed - allowed)
    if found is not None:
        pos, sid = found
        raise ArgumentError(f"the text holds the special token {v.tokens[sid]!r} at character {pos}, which is "
                            "disallowed: pass allowed_special={...} to encode it as that token, or "
                            "disallowed_special=() to encode it as plain text")
    return allowed
