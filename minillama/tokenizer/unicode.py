"""Unicode facts the tokenizers share: GPT-2's byte<->unicode map, whitespace, category placeholders.

Which class a code point is in (letter, number, whitespace, ...) is llama.cpp's, from unicode_data's table.
"""

from __future__ import annotations

import re

from . import unicode_data as ud

# The White_Space property: what llama.cpp's unicode tables flag as whitespace, as a set of code points
# (unicode_data.WHITESPACE is the flag bit).
WHITESPACE_CPS = frozenset(cp for a, b in ud.code_point_ranges(ud.WHITESPACE) for cp in range(a, b + 1))


# C isspace() in the "C" locale: what std::regex's \s and llama.cpp's l/rstrip of special tokens see.
C_SPACE = " \t\n\v\f\r"


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible map from the 256 byte values to printable code points."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
# str.translate tables: a latin-1 decoded byte string -> GPT-2 byte-level text, and back.
LATIN1_TO_BYTELEVEL = {b: BYTE_TO_CHAR[b] for b in range(256)}
BYTELEVEL_TO_LATIN1 = {ord(c): b for b, c in enumerate(BYTE_TO_CHAR)}
# The text of an SPM-style byte-fallback token.
BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")


def byte_token(b: int) -> str:
    """The text of the byte-fallback token for byte b: <0xXX>."""
    return f"<0x{b:02X}>"


def byte_encode(word: str) -> str:
    """GPT-2 byte-level form of a word of code points: its UTF-8 bytes (surrogates as themselves),
    each as one printable character."""
    if word.isascii():  # one byte per character: skip the encode/decode round
        return word.translate(LATIN1_TO_BYTELEVEL)
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(LATIN1_TO_BYTELEVEL)


def raw_byte_token(b: int) -> str:
    """The vocab key of a token whose text is the single byte b (invalid UTF-8 kept by surrogateescape)."""
    return chr(b) if b < 0x80 else chr(0xDC00 + b)


# Placeholders llama.cpp substitutes for non-ASCII code points before running std::regex (k_ucat_cpt); PH_,
# as they are characters, where unicode_data's NUMBER, LETTER, ... are flag bits.
PH_NUMBER, PH_LETTER, PH_PUNCT, PH_MARK, PH_SYMBOL, PH_OTHER = "\xd1", "\xd2", "\xd3", "\xd4", "\xd5", "\xd0"
_PLACEHOLDER = {ud.NUMBER: PH_NUMBER, ud.LETTER: PH_LETTER, ud.PUNCTUATION: PH_PUNCT, ud.ACCENT_MARK: PH_MARK,
                ud.SYMBOL: PH_SYMBOL}


def category_placeholder(cp: int) -> str:
    """The one character llama.cpp's collapsed text holds for code point cp: ASCII stays, whitespace is \\v."""
    if cp < 128:
        return chr(cp)
    f = ud.flags(cp)
    if f & ud.WHITESPACE:
        return "\x0b"
    return _PLACEHOLDER.get(f & ud.CATEGORIES, PH_OTHER)


class _CollapseTable(dict):
    """str.translate table for the collapsed text, filled lazily one code point at a time."""

    def __missing__(self, cp: int) -> str:
        v = self[cp] = category_placeholder(cp)
        return v


class _WideTable(dict):
    """str.translate table that turns non-ASCII whitespace into \\v, as llama.cpp does for std::wregex."""

    def __missing__(self, cp: int) -> int:
        v = self[cp] = 0x0B if cp > 0x7F and cp in WHITESPACE_CPS else cp
        return v


COLLAPSE = _CollapseTable()
WIDE = _WideTable()


def is_han(cp: int) -> bool:
    """llama.cpp's Han (CJK ideograph) ranges."""
    return any(a <= cp <= b for a, b in HAN_RANGES)


HAN_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF),
              (0x2F800, 0x2FA1F))
