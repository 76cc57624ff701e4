"""llama.cpp's pre-tokenizer patterns made Python regexes that match what llama.cpp's unicode.cpp matches.

The translation, plainly:
* the GPT-2, LLaMA-3 and Kimi-K2 patterns have hand-written splitters in llama.cpp that behave as the
  regex would with llama.cpp's own Unicode classes, so they become that regex with \\p{L}, \\p{N}, \\s
  and \\S made exact character classes of llama.cpp's table (unicode_data), over the BMP; a code point
  beyond the BMP meets the pattern as a BMP stand-in of its class (`exact_custom`, `bmp_view`);
* any other pattern naming a \\p{...} class runs on a "collapsed" copy of the text, where each
  non-ASCII code point stands for its category (unicode.category_placeholder), and the class becomes
  that placeholder plus its ASCII members (`collapse_pattern`);
* std::regex's ECMAScript flavour has ASCII-only \\s and \\d and a `$` that matches only at the very
  end; `ecmascript` keeps those meanings (re.ASCII, `$` -> `\\Z`).
"""

from __future__ import annotations

import functools
import re

from . import unicode_data as ud
from .tables import CUSTOM_SPLITTERS
from .unicode import HAN_RANGES, PH_LETTER, PH_MARK, PH_NUMBER, PH_PUNCT, PH_SYMBOL, is_han

Ranges = list[tuple[int, int]]
_BMP = 0xFFFF


def _bmp_sets() -> dict[str, Ranges]:
    """llama.cpp's classes on the BMP, as (first, last) code point ranges (see exact_custom)."""
    return {r"\p{L}": ud.code_point_ranges(ud.LETTER, hi=_BMP), r"\p{N}": ud.code_point_ranges(ud.NUMBER, hi=_BMP),
            r"\s": ud.code_point_ranges(ud.WHITESPACE, hi=_BMP),
            r"\p{Han}": [(a, min(b, _BMP)) for a, b in sorted(HAN_RANGES) if a <= _BMP]}


def _complement(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for a, b in ranges:
        if a > nxt:
            out.append((nxt, a - 1))
        nxt = b + 1
    return out + [(nxt, _BMP)] if nxt <= _BMP else out


def _class(ranges: Ranges, negate: bool = False) -> str:
    """A bracketed class of the BMP code points in ranges (or not in them, with negate), written whichever way
    names fewer code points: re builds a class's bitmap one code point at a time, so this halves compile time."""
    size = sum(b - a + 1 for a, b in ranges)
    if size > (_BMP + 1) // 2:
        ranges, negate = _complement(ranges), not negate
    return f"[{'^' if negate else ''}{ud.ranges_class(ranges, literal=True)}]"


_ESCAPED = {"\\r": "\r", "\\n": "\n", "\\t": "\t"}


def _exact_pattern(expr: str, sets: dict[str, Ranges]) -> str:
    """expr with \\p{..}, \\s, \\S and every [...] naming them made classes of the code points sets gives them.

    Only for text without code points beyond the BMP (the classes hold nothing else).
    """
    out, i = [], 0
    while i < len(expr):
        ch = expr[i]
        if ch == "\\":
            esc = expr[i:expr.index("}", i) + 1] if expr.startswith("\\p", i) else expr[i:i + 2]
            if esc in sets:
                out.append(_class(sets[esc]))
            elif esc == "\\S":
                out.append(_class(sets[r"\s"], negate=True))
            else:
                out.append(esc)
            i += len(esc)
        elif ch == "[":
            close = expr.index("]", i + 1)
            body = expr[i + 1:close]
            if "\\p" not in body and "\\s" not in body:
                out.append(expr[i:close + 1])
            else:  # e.g. [^\r\n\p{L}\p{N}]: the union of its items, then maybe negated
                negate = body.startswith("^")
                items, j = [], int(negate)
                while j < len(body):
                    if body.startswith("\\p", j):
                        k = body.index("}", j) + 1
                        items.append(sets[body[j:k]])
                    elif body[j] == "\\":
                        k = j + 2
                        items.append(sets[r"\s"] if body[j:k] == r"\s" else [(ord(_ESCAPED[body[j:k]]),) * 2])
                    else:
                        k = j + 1
                        items.append([(ord(body[j]),) * 2])
                    j = k
                out.append(_class(ud.merge_ranges(r for rs in items for r in rs), negate))
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@functools.cache
def exact_custom(expr: str) -> re.Pattern[str]:
    """The regex for a hand-written splitter, with llama.cpp's classes, compiled once per process.

    The standard library's re turns a big class of BMP code points into a bitmap, so these exact classes
    match as fast as \\p{L} in the regex module (about twice as fast as the regex module, in fact). Code
    points beyond the BMP would make re scan a list of ranges for every character instead, so the classes
    hold only the BMP and such code points meet the pattern as a BMP stand-in of their class (bmp_view).
    """
    return re.compile(_exact_pattern(CUSTOM_SPLITTERS[expr], _bmp_sets()))


# Stand-ins of a code point beyond the BMP, by llama.cpp's flags: each is in the same classes for the
# patterns above (letter, Han letter, number, or none of letter/number/whitespace; no such code point is
# whitespace) and is none of the characters they name literally.
_STAND_INS = {"han": "\u4e00", ud.LETTER: "\u00aa", ud.NUMBER: "\u00b2", 0: "\u00bf"}
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


class _StandIn(dict):
    """Code point beyond the BMP (a 1-character str) -> its stand-in, filled lazily."""

    def __missing__(self, ch: str) -> str:
        cp = ord(ch)
        f = ud.flags(cp) & (ud.LETTER | ud.NUMBER)
        v = self[ch] = _STAND_INS["han" if f and is_han(cp) else f]
        return v


_STAND_IN = _StandIn()


def bmp_view(text: str) -> tuple[str, list[int]]:
    """text itself, or -- when it holds code points beyond the BMP -- a copy with those as their stand-ins;
    and the offsets of the code points replaced.

    A stand-in is one code point for one, so offsets (and word lengths) in the copy are those of text.
    """
    if text.isascii() or len(text.encode("utf-16-le", "surrogatepass")) == 2 * len(text):
        return text, []
    where: list[int] = []

    def stand_in(m: re.Match[str]) -> str:
        where.append(m.start())
        return _STAND_IN[m.group()]

    return _ASTRAL.sub(stand_in, text), where


UCAT = {r"\p{N}": PH_NUMBER + "0-9", r"\p{L}": PH_LETTER + "A-Za-z",
         r"\p{P}": PH_PUNCT + r"!-#%-*,-/:-;?-@\[-\]_\{\}", r"\p{M}": PH_MARK, r"\p{S}": PH_SYMBOL + r"\$\+<-\>\^`\|",
         r"\p{Lu}": PH_LETTER + "A-Za-z", r"\p{Ll}": PH_LETTER + "A-Za-z", r"\p{Lt}": PH_LETTER + "A-Za-z",
         r"\p{Lm}": PH_LETTER + "A-Za-z", r"\p{Lo}": PH_LETTER + "A-Za-z"}


def collapse_pattern(expr: str) -> str:
    """llama.cpp's rewrite of a \\p{...} pattern for the collapsed text (unicode_regex_split)."""
    out, inside, i = [], False, 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and ch == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif expr.startswith("\\p{", i) and (close := expr.find("}", i + 3)) != -1 and close <= i + 10 \
                and expr[i:close + 1] in UCAT:
            cls = UCAT[expr[i:close + 1]]
            out.append(cls if inside else f"[{cls}]")
            i = close
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def ecmascript(expr: str) -> re.Pattern[str]:
    """Compile an ECMAScript (std::regex) pattern with Python's re: `$` only at the very end."""
    out, inside, i = [], False, 0
    while i < len(expr):
        ch = expr[i]
        if ch == "\\":
            out.append(expr[i:i + 2])
            i += 2
            continue
        if ch == "[":
            inside = True
        elif ch == "]":
            inside = False
        out.append(r"\Z" if ch == "$" and not inside else ch)
        i += 1
    return re.compile("".join(out), re.ASCII)
