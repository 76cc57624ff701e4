"""BPE pre-tokenizers: one table from `tokenizer.ggml.pre` name to regex patterns and vocab flags.

The patterns are llama.cpp's own (src/llama-vocab.cpp), kept as data. Several patterns apply in
sequence: each splits every piece the previous ones produced into matches and the gaps between
them. How a pattern runs is what llama.cpp does with it (src/unicode.cpp):

* the GPT-2, LLaMA-3 and Kimi-K2 patterns have hand-written splitters there that behave as the
  regex would with llama.cpp's own Unicode classes, so they run here as that regex, with \\p{L}, \\p{N},
  \\s and \\S made exact character classes of llama.cpp's table (unicode_data) -- see _exact_custom;
* any other pattern naming a \\p{...} class runs on a "collapsed" copy of the text, where each
  non-ASCII code point stands for its category (see unicode.category_placeholder) and the class
  becomes that placeholder plus its ASCII members;
* a pattern without \\p{...} runs on the code points, with non-ASCII whitespace seen as \\v.
std::regex's ECMAScript flavour has ASCII-only \\s and \\d and a `$` that matches only at the very
end; the translation below keeps those meanings (re.ASCII, `$` -> `\\Z`).
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate, chain
from types import MappingProxyType

from ..errors import UnsupportedError
from . import unicode_data as ud
from .unicode import COLLAPSE, HAN_RANGES, LETTER, MARK, NUMBER, PUNCT, SYMBOL, WIDE, is_han

# ---------------------------------------------------------------------------------------------
# The pattern sets (llama.cpp's regex_exprs, verbatim).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_ORIGINAL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
KIMI_K2 = r"\p{Han}+"
AFMOE_DIGITS = r"\p{AFMoE_digits}"
# tiny_aya's digit rule, as its tokenizer.json writes it; llama.cpp runs its AFMoE digit splitter for it.
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"
_CJK = "[一-龥぀-ゟ゠-ヿ]+"
_PUNCT_WORD = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^" + "\r\n" + r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+")
_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?")
_UPLOW = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_PORO = " ?[^(\\s|.,!?…。，、।۔،)]+"

PATTERNS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "jais2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
              r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "deepseek-llm": (
        "[\r\n]",
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        "[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+"),
    "deepseek3": (r"\p{N}{1,3}", _CJK, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[" + "\r\n" + r"]*|\s*[" + "\r\n" + r"]+|\s+(?!\S)|\s+"),
    "spark2_5": (r"\p{N}{1,3}", _CJK, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+|[" + "\r\n" + r"]|\s+(?!\S)|\s+", r"\p{N}"),
    "youtu": ("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
              _UPLOW + r"|\p{N}" + _TAIL),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", GPT2),
    "gpt2": (GPT2,),
    "qwen2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+",),
    "poro": (_PORO,),
    "viking": (_PORO, r"\p{N}"),
    "tekken": (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}" + _TAIL,),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", GPT2),
    "gpt4o": (_CASED + r"|\p{N}{1,3}" + _TAIL,),
    "granite-emb-multi": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS + "?"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*" + _CONTRACTIONS + "?"
        r"|\p{N}{1,3}" + _TAIL,),
    "tiny-aya": (TINY_AYA_DIGITS, _UPLOW + r"|\p{N}{1,3}" + _TAIL),
    "kimi-k2": (KIMI_K2,),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "afmoe": (AFMOE_DIGITS,
              "[一-鿿㐀-䶿\uf900-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
              _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "laguna": (r"[^\n]+|[\n]+",
               _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "newlines": (r"[^\n]+|[\n]+",),
    "minicpm5": (r"\p{N}{1,3}",
                 _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "whitespace": (r"\S+",),
})


@dataclass(frozen=True)
class PreSpec:
    """What a `tokenizer.ggml.pre` value means: its patterns and the vocab flags llama.cpp sets for it."""

    patterns: str
    ignore_merges: bool = False
    add_bos: bool | None = None       # None: leave the model type's default
    clean_spaces: bool = True
    escape_whitespaces: bool = False  # SPM-style BPE: spaces become U+2581 before splitting
    byte_encode: bool = True          # GPT-2 byte-level text; False: raw UTF-8 with <0xXX> fallback
    add_sep: bool = False
    no_bos: bool = False              # the bos id is cleared (chatglm)
    newline_tokens: bool = False      # a word of only newlines that is a token stays whole (gemma4)


def _names(spec: PreSpec, *names: str) -> dict[str, PreSpec]:
    return dict.fromkeys(names, spec)


_LLAMA3 = PreSpec("llama3", ignore_merges=True, add_bos=True)
_UNCLEAN = {"clean_spaces": False}

# tokenizer.ggml.pre -> meaning; the names llama.cpp's llama_vocab::impl::load accepts.
PRE_TOKENIZERS: MappingProxyType[str, PreSpec] = MappingProxyType({
    "default": PreSpec("default"),
    **_names(PreSpec("minicpm5", ignore_merges=True), "minicpm5"),
    **_names(_LLAMA3, "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
             "lfm2", "jina-v5-nano"),
    "deepseek-llm": PreSpec("deepseek-llm", **_UNCLEAN),
    "deepseek-coder": PreSpec("deepseek-coder", **_UNCLEAN),
    "deepseek-v3": PreSpec("deepseek3", **_UNCLEAN),
    "spark2_5": PreSpec("spark2_5", **_UNCLEAN),
    "youtu": PreSpec("youtu", ignore_merges=True, **_UNCLEAN),
    "falcon": PreSpec("falcon"),
    "mpt": PreSpec("gpt2"),
    "starcoder": PreSpec("starcoder"),
    **_names(PreSpec("gpt2"), "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
             "a.x-4.0", "mellum", "modern-bert", "exaone4", "olmo", "jais"),
    "jais-2": PreSpec("jais2"),
    **_names(PreSpec("newlines", escape_whitespaces=True, byte_encode=False, add_bos=True, newline_tokens=True),
             "gemma4", "granite-embed-multi-311m"),
    "sarvam-moe": PreSpec("newlines", escape_whitespaces=True, byte_encode=False, **_UNCLEAN),
    **_names(PreSpec("gpt2", add_sep=True), "jina-v1-en", "jina-v2-code", "roberta-bpe"),
    "whitespace": PreSpec("whitespace", byte_encode=False),
    "refact": PreSpec("starcoder"),
    "command-r": PreSpec("starcoder", **_UNCLEAN),
    **_names(PreSpec("qwen2", **_UNCLEAN), "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan",
             "solar-open"),
    "qwen35": PreSpec("qwen35", **_UNCLEAN),
    "stablelm2": PreSpec("qwen2"),
    "megrez": PreSpec("qwen2"),
    **_names(PreSpec("llama3"), "dbrx", "smaug-bpe"),
    "poro-chat": PreSpec("poro", **_UNCLEAN),
    **_names(PreSpec("llama3", no_bos=True), "glm4", "chatglm-bpe"),
    "viking": PreSpec("viking", **_UNCLEAN),
    "tekken": PreSpec("tekken", ignore_merges=True, add_bos=True, **_UNCLEAN),
    "smollm": PreSpec("starcoder", **_UNCLEAN),
    **_names(PreSpec("starcoder"), "codeshell", "exaone", "minerva-7b", "mellum2"),
    **_names(PreSpec("poro"), "bloom", "gpt3-finnish"),
    "exaone-moe": PreSpec("exaone-moe"),
    "chameleon": PreSpec("chameleon", add_bos=True, **_UNCLEAN),
    **_names(PreSpec("gpt4o", **_UNCLEAN), "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
    "granite-embed-multi-97m": PreSpec("granite-emb-multi", ignore_merges=True, **_UNCLEAN),
    **_names(PreSpec("tiny-aya", **_UNCLEAN), "tiny_aya", "cohere2moe"),
    "superbpe": PreSpec("superbpe", **_UNCLEAN),
    **_names(PreSpec("gpt2", **_UNCLEAN), "trillion", "granite-docling"),
    **_names(PreSpec("bailingmoe", **_UNCLEAN), "bailingmoe", "bailingmoe2", "llada-moe"),
    "seed-coder": PreSpec("seed-coder", **_UNCLEAN),
    **_names(PreSpec("deepseek3", **_UNCLEAN), "hunyuan-dense", "hy_v4", "joyai-llm"),
    "kimi-k2": PreSpec("kimi-k2", **_UNCLEAN),
    "ufakzeka": PreSpec("ufakzeka", **_UNCLEAN),
    "grok-2": PreSpec("qwen2", **_UNCLEAN),
    "afmoe": PreSpec("afmoe", **_UNCLEAN),
    "laguna": PreSpec("laguna", **_UNCLEAN),
})


def pre_spec(name: str) -> PreSpec:
    """The meaning of a `tokenizer.ggml.pre` value; an empty value means 'default', as in llama.cpp."""
    spec = PRE_TOKENIZERS.get(name or "default")
    if spec is None:
        raise UnsupportedError(f"unknown pre-tokenizer tokenizer.ggml.pre = {name!r}; expected one of "
                               f"{len(PRE_TOKENIZERS)} names llama.cpp knows, e.g. 'llama-bpe', 'gpt-2', 'qwen2'")
    return spec


# ---------------------------------------------------------------------------------------------
# How each pattern runs.
# llama.cpp's hand-written Kimi-K2 splitter, as the regex it stands for.
_KIMI = (r"\p{Han}+"
         r"|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})\p{L})+(?:'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Patterns llama.cpp runs with hand-written splitters, and the regex each stands for.
_CUSTOM = {
    GPT2: GPT2 + r"|\s+",
    LLAMA3: LLAMA3,
    LLAMA3_ORIGINAL: LLAMA3,
    KIMI_K2: _KIMI,
}


Ranges = list[tuple[int, int]]
_BMP = 0xFFFF


def _bmp_sets() -> dict[str, Ranges]:
    """llama.cpp's classes on the BMP, as (first, last) code point ranges (see _exact_custom)."""
    return {r"\p{L}": ud.code_point_ranges(ud.LETTER, hi=_BMP), r"\p{N}": ud.code_point_ranges(ud.NUMBER, hi=_BMP),
            r"\s": ud.code_point_ranges(ud.WHITESPACE, hi=_BMP),
            r"\p{Han}": [(a, min(b, _BMP)) for a, b in sorted(HAN_RANGES) if a <= _BMP]}


def _union(*sets: Ranges) -> Ranges:
    out: Ranges = []
    for a, b in sorted(r for rs in sets for r in rs):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


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
                out.append(_class(_union(*items), negate))
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@functools.cache
def _exact_custom(expr: str) -> re.Pattern[str]:
    """The regex for a hand-written splitter, with llama.cpp's classes, compiled once per process.

    The standard library's re turns a big class of BMP code points into a bitmap, so these exact classes
    match as fast as \\p{L} in the regex module (about twice as fast as the regex module, in fact). Code
    points beyond the BMP would make re scan a list of ranges for every character instead, so the classes
    hold only the BMP and such code points meet the pattern as a BMP stand-in of their class (_bmp_view).
    """
    return re.compile(_exact_pattern(_CUSTOM[expr], _bmp_sets()))


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


def _bmp_view(text: str) -> tuple[str, list[int]]:
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


_UCAT = {r"\p{N}": NUMBER + "0-9", r"\p{L}": LETTER + "A-Za-z",
         r"\p{P}": PUNCT + r"!-#%-*,-/:-;?-@\[-\]_\{\}", r"\p{M}": MARK, r"\p{S}": SYMBOL + r"\$\+<-\>\^`\|",
         r"\p{Lu}": LETTER + "A-Za-z", r"\p{Ll}": LETTER + "A-Za-z", r"\p{Lt}": LETTER + "A-Za-z",
         r"\p{Lm}": LETTER + "A-Za-z", r"\p{Lo}": LETTER + "A-Za-z"}


def _collapse_pattern(expr: str) -> str:
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
                and expr[i:close + 1] in _UCAT:
            cls = _UCAT[expr[i:close + 1]]
            out.append(cls if inside else f"[{cls}]")
            i = close
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _ecmascript(expr: str) -> re.Pattern[str]:
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
    view, replaced = _bmp_view(text)
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
            if expr in _CUSTOM:
                steps.append(("text", _exact_custom(expr)))
            elif expr in _FUNCS:
                steps.append(("func", _FUNCS[expr]))
            elif any(cat in expr for cat in _UCAT):
                steps.append(("collapsed", _ecmascript(_collapse_pattern(expr))))
            else:
                steps.append(("wide", _ecmascript(expr)))
        self._steps = steps
        # per step: (young, old) generations of piece -> words, as the word caches (models/base.py)
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
                    src = _bmp_view(text)[0]
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
