"""Text as llama.cpp sees it: raw bytes, lone surrogates and SentencePiece's visible space, in one place.

The policy, plainly:
* llama.cpp tokenizes bytes; Python hands us str. Text read with ``data.decode("utf-8", "surrogateescape")``
  holds each byte that is not valid UTF-8 as the lone surrogate U+DC80..U+DCFF ("an escape"), so
  ``to_bytes(text)`` is exactly ``data``.
* Any other lone surrogate (U+D800..U+DC7F, U+DD00..U+DFFF) has no UTF-8 form; the facade
  (`Tokenizer.encode`) turns it into U+FFFD before any model sees the text (`as_bytes_text`).
* SPM and Unigram work on the bytes themselves; BPE and WordPiece first read code points from the
  bytes as llama.cpp's unicode_cpts_from_utf8 does (`llama_code_points`): an invalid byte is U+FFFD,
  and a decodable surrogate or overlong form stands for itself.
* SentencePiece writes a space as U+2581 (`SPACE`) inside tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

SPACE = "\u2581"
"""SentencePiece's visible space, which stands for ' ' inside SPM and Unigram tokens."""

ESCAPES = re.compile("[\udc80-\udcff]+")
"""Runs of surrogate escapes (raw bytes 0x80..0xFF that are not valid UTF-8)."""

SURROGATES = re.compile("[\ud800-\udfff]")
"""Any lone surrogate: an escape or a code point with no UTF-8 form."""

NOT_ESCAPES = re.compile("[\ud800-\udc7f\udd00-\udfff]")
"""Surrogates that are not escapes of raw bytes."""

UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)
"""unicode_len_utf8: the length a lead byte announces, by its high four bits (continuation bytes count 1)."""


def utf8_len(lead: int) -> int:
    """unicode_len_utf8(lead): how many bytes the UTF-8 sequence starting with this byte claims."""
    return UTF8_LEN[lead >> 4]


def has_surrogates(text: str) -> bool:
    """True when text holds any lone surrogate (an escape or not)."""
    return SURROGATES.search(text) is not None


def to_bytes(text: str) -> bytes:
    """The bytes text stands for: UTF-8, escapes as their raw bytes, other surrogates as themselves
    (the 3-byte form 'surrogatepass' gives them, as llama.cpp reads such bytes)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return b"".join(c.encode("utf-8", "surrogateescape" if "\udc80" <= c <= "\udcff" else "surrogatepass")
                        for c in text)


def as_bytes_text(text: str) -> str:
    """text (which failed a strict UTF-8 encode) as the bytes it stands for, decoded with 'surrogateescape'.

    Surrogates other than U+DC80..U+DCFF become U+FFFD; escapes stand for their raw bytes, and escapes
    that together form valid UTF-8 become that character, so that every raw byte left is one llama.cpp
    would also find invalid.
    """
    text = NOT_ESCAPES.sub("\ufffd", text)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")


def llama_utf8_cps(b: bytes) -> Iterator[int | None]:
    """The code points llama.cpp's unicode_cpts_from_utf8 reads from b: a lead byte followed by enough
    continuation bytes is one code point (overlong forms, surrogates and values past U+10FFFF included),
    any other byte None (llama.cpp reads U+FFFD for it)."""
    i, n = 0, len(b)
    while i < n:
        c = b[i]
        k = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 0
        if k and i + k <= n and all(b[j] & 0xC0 == 0x80 for j in range(i + 1, i + k)):
            cp = c & (0x7F >> k)
            for j in range(i + 1, i + k):
                cp = cp << 6 | (b[j] & 0x3F)
            yield cp
            i += k
        else:
            yield None
            i += 1


def _redecode(run: re.Match[str]) -> str:
    """A run of raw bytes decoded as llama_utf8_cps reads it, each byte it cannot read one U+FFFD; a code
    point past U+10FFFF, where llama.cpp aborts, becomes one U+FFFD too."""
    b = run.group().encode("utf-8", "surrogateescape")
    return "".join("\ufffd" if cp is None or cp > 0x10FFFF else chr(cp) for cp in llama_utf8_cps(b))


def llama_code_points(text: str) -> str:
    """The code points llama.cpp's unicode_cpts_from_utf8 reads from text's bytes.

    text holds raw bytes as surrogate escapes (and no other surrogates). Valid UTF-8 is unchanged;
    each run of raw bytes is decoded as llama.cpp decodes it. The result may hold surrogate code points
    (from the bytes ED A0 80 and the like), which stand for themselves (re-encode with 'surrogatepass').
    Runs of raw bytes never reach into valid characters: a valid character starts with a byte that is
    not a continuation byte, so llama.cpp's decoder reads it the same way.
    """
    return ESCAPES.sub(_redecode, text)
