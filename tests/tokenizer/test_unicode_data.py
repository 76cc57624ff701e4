"""llama.cpp's code point flags (minillama.tokenizer.unicode_data) and their use by every tokenizer.

The table must be llama.cpp's (src/unicode-data.cpp: Unicode 15.1), not Python's unicodedata (14.0 in 3.11) nor the
regex module's (17.0): on the code points where those two disagree, and on a sample of every plane, minillama's ids
must be llama.cpp's for the BPE pre-tokenizers that classify code points (the hand-written GPT-2 / LLaMA-3 splitters,
the "collapsed" patterns) and for WordPiece. Without the oracle: sanity checks of the table and of its classes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from functools import cache
from pathlib import Path

import pytest
from support.oracle import get_oracle
from support.paths import load, release_tokenizers, vocab_path
from support.report import fail_if_any

from minillama.tokenizer import pretokenize as pt
from minillama.tokenizer import regex_translate as rt
from minillama.tokenizer import tables
from minillama.tokenizer import unicode_data as ud
from minillama.tokenizer.unicode import HAN_RANGES, WHITESPACE_CPS, category_placeholder, is_han

ROOT = Path(__file__).resolve().parents[2]
MAX = ud.MAX_CODE_POINT + 1
CATEGORY_FLAG = {"C": ud.CONTROL, "L": ud.LETTER, "M": ud.ACCENT_MARK, "N": ud.NUMBER, "P": ud.PUNCTUATION,
                 "S": ud.SYMBOL, "Z": ud.SEPARATOR}
# PropList.txt's White_Space, as llama.cpp's gen-unicode-data.py writes it out.
LLAMACPP_WHITESPACE = {*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
                       0x205F, 0x3000}


def _all_flags() -> list[int]:
    out = []
    for (first, f), (end, _) in zip(ud.RANGES, (*ud.RANGES[1:], (MAX, 0))):
        out += [f] * (end - first)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the table itself
# ---------------------------------------------------------------------------------------------------------------------

def test_table_shape():
    starts = [s for s, _ in ud.RANGES]
    assert starts[0] == 0 and starts[-1] <= ud.MAX_CODE_POINT
    assert all(a < b for a, b in zip(starts, starts[1:])), "RANGES must be sorted, without duplicates"
    assert all(f1 != f2 for (_, f1), (_, f2) in zip(ud.RANGES, ud.RANGES[1:])), "neighbouring ranges must differ"
    for first, f in ud.RANGES:
        cat = f & ud.CATEGORIES
        assert cat and not cat & (cat - 1), f"U+{first:04X}: flags 0x{f:04X} need exactly one category"
        assert not f & ~(ud.CATEGORIES | ud.WHITESPACE)
    assert len(_all_flags()) == MAX
    assert ud.flags(0x10FFFD) == ud.CONTROL  # plane 16 private use
    assert ud.flags(ud.MAX_CODE_POINT) == ud.UNDEFINED  # a noncharacter
    assert ud.flags(-1) == ud.flags(MAX) == ud.UNDEFINED  # llama.cpp's answer past the table


def test_ascii_flags():
    for cp in range(128):
        ch, f = chr(cp), ud.flags(cp)
        if ch.isalpha():
            want = ud.LETTER
        elif ch.isdigit():
            want = ud.NUMBER
        elif ch == " ":
            want = ud.SEPARATOR | ud.WHITESPACE
        elif cp < 0x20 or cp == 0x7F:
            want = ud.CONTROL | (ud.WHITESPACE if 0x09 <= cp <= 0x0D else 0)
        elif ch in "$+<=>^`|~":
            want = ud.SYMBOL
        else:
            want = ud.PUNCTUATION
        assert f == want, f"{ch!r}: 0x{f:04X} != 0x{want:04X}"


def test_whitespace_is_llamacpp_white_space():
    flagged = {cp for cp, f in enumerate(_all_flags()) if f & ud.WHITESPACE}
    assert flagged == LLAMACPP_WHITESPACE == set(WHITESPACE_CPS)
    assert all(ud.flags(cp) & (ud.SEPARATOR | ud.CONTROL) for cp in flagged)
    # every separator (Z*) is whitespace, so the custom splitters and the collapsed text may test whitespace first
    assert all(f & ud.WHITESPACE for f in _all_flags() if f & ud.SEPARATOR)


def test_table_agrees_with_unicodedata():
    """Python's unicodedata has the same categories where both are assigned (llama.cpp: Unicode 15.1)."""
    version = tuple(map(int, unicodedata.unidata_version.split(".")))
    bad = []
    for cp, f in enumerate(_all_flags()):
        cat = unicodedata.category(chr(cp))
        if cat == "Cn":
            if version >= (15, 1) and f & ud.CATEGORIES != ud.UNDEFINED:
                bad.append((hex(cp), cat, hex(f)))
        elif f & ud.CATEGORIES != CATEGORY_FLAG[cat[0]] and not (version > (15, 1) and f & ud.UNDEFINED):
            bad.append((hex(cp), cat, hex(f)))
    fail_if_any(bad, f"unicodedata {unicodedata.unidata_version} vs the table: {len(bad)}, e.g. {bad[:10]}")


@pytest.mark.skipif(unicodedata.unidata_version != "14.0.0", reason="the generator derives from Unicode 14.0")
def test_generator_reproduces_the_table():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_unicode_data.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_unicode_15_additions_and_later():
    """Unicode 15.0/15.1 code points have their class; later ones (16.0, 17.0) are unassigned, as in llama.cpp."""
    assert ud.flags(0x11F43) == ud.PUNCTUATION  # KAWI DANDA (15.0)
    assert ud.flags(0x13440) == ud.ACCENT_MARK  # EGYPTIAN HIEROGLYPH MIRROR HORIZONTALLY (15.0)
    assert ud.flags(0x13439) == ud.CONTROL  # EGYPTIAN HIEROGLYPH INSERT AT MIDDLE (15.0, Cf)
    assert ud.flags(0x1E4F0) == ud.NUMBER  # NAG MUNDARI DIGIT ZERO (15.0)
    assert ud.flags(0x2EBF0) == ud.LETTER  # CJK Extension I (15.1)
    assert ud.flags(0x2FFC) == ud.SYMBOL  # IDEOGRAPHIC DESCRIPTION CHARACTER (15.1)
    for cp in (0x1C89, 0xA7CB, 0x10D40, 0x116D0, 0x1FAE9, 0x323B0):  # Unicode 16.0 and 17.0
        assert ud.flags(cp) == ud.UNDEFINED, hex(cp)


def test_char_classes():
    """The class strings hold exactly the flagged code points, for re and for regex, escaped or literal."""
    regex = pytest.importorskip("regex")
    everything = "".join(chr(cp) for cp in range(MAX) if not 0xD800 <= cp <= 0xDFFF)
    flags = _all_flags()
    for name, mask in (("LETTER_CLASS", ud.LETTER), ("NUMBER_CLASS", ud.NUMBER), ("WHITESPACE_CLASS", ud.WHITESPACE),
                       ("PUNCTUATION_CLASS", ud.PUNCTUATION), ("ACCENT_MARK_CLASS", ud.ACCENT_MARK),
                       ("SYMBOL_CLASS", ud.SYMBOL)):
        want = "".join(chr(cp) for cp, f in enumerate(flags) if f & mask and not 0xD800 <= cp <= 0xDFFF)
        cls = getattr(ud, name)
        assert cls == ud.char_class(mask)
        assert "".join(re.findall(f"[{cls}]", everything)) == want, name
        assert "".join(regex.findall(f"[{cls}]", everything)) == want, name
        bmp = "".join(ch for ch in want if ch <= "\uffff")
        assert "".join(re.findall(f"[{ud.char_class(mask, hi=0xFFFF, literal=True)}]", everything)) == bmp, name
    with pytest.raises(AttributeError):
        ud.NO_SUCH_CLASS  # noqa: B018


def test_category_placeholder_follows_the_table():
    placeholder = {ud.NUMBER: "\xd1", ud.LETTER: "\xd2", ud.PUNCTUATION: "\xd3", ud.ACCENT_MARK: "\xd4",
                   ud.SYMBOL: "\xd5"}
    for cp in [*range(0x80, 0x3100), *range(0x10000, 0x11000), 0x2EBF0, 0x323B0, 0x1FAE9, 0xE0001, 0x10FFFF]:
        f = ud.flags(cp)
        want = "\x0b" if f & ud.WHITESPACE else placeholder.get(f & ud.CATEGORIES, "\xd0")
        assert category_placeholder(cp) == want, hex(cp)
    assert all(category_placeholder(cp) == chr(cp) for cp in range(128))


# ---------------------------------------------------------------------------------------------------------------------
# the hand-written splitters (GPT-2, LLaMA-3, Kimi-K2): exact classes on the BMP, stand-ins beyond it
# ---------------------------------------------------------------------------------------------------------------------

def test_stand_ins_keep_the_class():
    for ch, want in rt._STAND_INS.items():
        f = ud.flags(ord(want))
        assert not f & ud.WHITESPACE and want not in "\r\n '" and ord(want) <= 0xFFFF
        if ch == "han":
            assert f & ud.LETTER and is_han(ord(want))
        else:
            assert f & (ud.LETTER | ud.NUMBER) == ch and not is_han(ord(want))
    assert not any(ud.flags(cp) & ud.WHITESPACE for cp in range(0x10000, MAX))


@cache
def _reference(expr: str):
    """The custom splitter's regex with full (astral too) exact classes, on the regex module: slow, obviously right."""
    regex = pytest.importorskip("regex")
    classes = {r"\p{L}": ud.LETTER_CLASS, r"\p{N}": ud.NUMBER_CLASS, r"\s": ud.WHITESPACE_CLASS,
               r"\p{Han}": ud.ranges_class(HAN_RANGES)}
    src, out, inside, i = tables.CUSTOM_SPLITTERS[expr], [], False, 0
    while i < len(src):
        esc = src[i:src.index("}", i) + 1] if src.startswith("\\p", i) else src[i:i + 2]
        if esc in classes:
            out.append(classes[esc] if inside else f"[{classes[esc]}]")
        elif esc == "\\S":
            out.append("[^" + classes[r"\s"] + "]")
        elif src[i] == "\\":
            out.append(esc)
        else:
            esc = src[i]
            inside = (inside or esc == "[") and esc != "]"
            out.append(esc)
        i += len(esc)
    return regex.compile("".join(out))


def _mixed_texts(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    pool = (list("abc XYZ 019 \t\n\r\x0b\x0c\x00\x1c\x7f'sdtm.,!?-_[]^\\") + ["'s", "'LL", "  ", "\r\n"]
            + list("éß中文字日本語한국어١٢٣²½\u0300\u200b\u00a0\u2028\u3000\u0085\ufeff")
            + ["\U0001d400", "\U0001d7ce", "\U00020000", "\U0002ebf0", "\U00031350", "\U0001f600", "\U0001fae9",
               "\U00011f50", "\U000e0001", "\U0010fffd", "\U0001e4d0", "\U00010d40", "\U000116d0", "\u1c89",
               "\ua7cb", "\U000105c0", "\U00013460", "\udc80", "\U0001f1fa\U0001f1f8"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("expr", [tables.GPT2, tables.LLAMA3, tables.KIMI_K2], ids=["gpt2", "llama3", "kimi-k2"])
def test_custom_splitters_match_the_exact_regex(expr):
    ref = _reference(expr)
    tok = pt.PreTokenizer((expr,))
    two = pt.PreTokenizer((expr, r"\p{N}"))  # the spans() path too
    bad = []
    for text in _mixed_texts(3000, 5):
        want = ref.findall(text)
        if tok.split(text) != want:
            bad.append((text, tok.split(text), want))
        if "".join(two.split(text)) != text:
            bad.append((text, "spans do not cover the text"))
    fail_if_any(bad, f"{len(bad)} texts split differently; first: {bad[:3]}")


# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp itself (the oracle), on the code points where Python's and the regex module's Unicode differ
# ---------------------------------------------------------------------------------------------------------------------

def _regex_classes() -> list[str]:
    regex = pytest.importorskip("regex")
    text = "".join(chr(c) if not 0xD800 <= c <= 0xDFFF else "\0" for c in range(MAX))
    out = ["Cs"] * MAX
    for cls in ("Cn", "Co", "Cf", "Cc", "Z", "S", "M", "P", "N", "L"):
        for m in regex.finditer(rf"\p{{{cls}}}+", text):
            out[m.start():m.end()] = [cls] * (m.end() - m.start())
    return out


@cache
def probe_code_points() -> tuple[int, ...]:
    """Non-ASCII code points where unicodedata and the regex module disagree (~15k), plus a sample of all planes."""
    rx = _regex_classes()
    out = []
    for cp in range(0x80, MAX):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        cat = unicodedata.category(chr(cp))
        if (cat if cat[0] == "C" else cat[0]) != rx[cp] or cp % 251 == 0:
            out.append(cp)
    return tuple(out)


def _around(c: int) -> str:
    """Code point c where letters, digits, punctuation and spaces meet it."""
    return "a{c}1{c} {c}!{c}a1{c}23 !{c} \u00e9{c}x".format(c=chr(c))


def _texts(cps: tuple[int, ...], per_text: int = 32) -> list[str]:
    return ["".join(map(_around, cps[i:i + per_text])) for i in range(0, len(cps), per_text)]


ORACLE_VOCABS = ["gpt-2", "llama-bpe", "deepseek-coder", "deepseek-llm", "falcon", "starcoder", "bert-bge"]


@pytest.mark.parametrize("name", ORACLE_VOCABS)
def test_code_points_against_llamacpp(name):
    path = vocab_path(f"ggml-vocab-{name}")
    oracle = get_oracle(path)
    release_tokenizers()
    tok = load(f"ggml-vocab-{name}")
    cps = probe_code_points()
    assert len(cps) > 15000
    bad = []
    per_text = 32
    for i, text in enumerate(_texts(cps, per_text)):
        if tok.encode(text, add_special=False) != oracle.tokenize(text):
            for c in cps[i * per_text:(i + 1) * per_text]:  # which code points
                one = _around(c)
                got, want = tok.encode(one, add_special=False), oracle.tokenize(one)
                if got != want:
                    bad.append((f"U+{c:04X}", hex(ud.flags(c)), got, want))
    fail_if_any(bad, f"{name}: {len(bad)} code points tokenize differently from llama.cpp; first: {bad[:8]}")


def test_flags_against_llamacpp_probes():
    """Every flag of the disagreeing code points, seen through llama.cpp's own splitting (scripts/make_unicode_data.py
    --probe: small GGUF vocabs in which each probe word is a token, so one id means the code point joined the word)."""
    import importlib.util

    from support.oracle import _oracle_module

    mod = _oracle_module()
    if isinstance(mod, str):
        pytest.skip(mod)
    spec = importlib.util.spec_from_file_location("make_unicode_data", ROOT / "scripts" / "make_unicode_data.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    cps = probe_code_points()
    flags = _all_flags()
    bad = []
    for c, seen in gen.probe(mod.Oracle, cps).items():
        want = gen.predict(c, flags[c])
        if seen != want:
            bad.append((f"U+{c:04X}", hex(flags[c]), {k: (seen[k], want[k]) for k in want if seen[k] != want[k]}))
    fail_if_any(bad, f"{len(bad)} code points whose flags llama.cpp disagrees with; first: {bad[:5]}")
