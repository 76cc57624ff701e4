"""Text from users: any str encodes without an exception, round-trips where the vocab can, and decoding
random ids (or streaming them) never disagrees with decode. Property-based (hypothesis) over every
shared vocab; examples are bounded so the module stays fast.

* valid text from every Unicode category (controls, NUL, unassigned, private use, emoji, U+2581) mixed
  with pieces of real tokens: encode never raises, ids are in range, and for byte-level BPE and
  byte-fallback SPM vocabs decode(encode(s)) == s (up to llama.cpp's documented clean-up of spaces
  before punctuation; for SPM, U+2581 is its space marker and is left out);
* raw bytes read with errors='surrogateescape': ids equal llama.cpp's for those bytes (the oracle, when
  installed), and SPM's byte fallback gives the bytes back;
* other lone surrogates are U+FFFD;
* random id sequences: decode never raises, the stream decoder's text equals decode's.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.oracle import get_oracle
from support.paths import load, params_or_skip, vocab_path
from support.reference import conformance_vocabs

from minillama.errors import ArgumentError, ArgumentTypeError, MinillamaError
from minillama.tokenizer import Attr
from minillama.tokenizer.text import llama_utf8_cps

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")

VOCABS = params_or_skip(conformance_vocabs(), "conformance vocabs")
# Bounded: every property runs this many examples per vocab, the same ones on every run.
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
FEWER = settings(PROPERTY, max_examples=40)

# Every code point but surrogates: all categories (Cc with NUL, Cf, Cn unassigned, Co private use, ...).
VALID_CHARS = st.characters(codec="utf-8")
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
SNIPPETS = ["  ", "\n", "\r\n", "\t", " \u3000 ", "'s", "'ll", "123", "4567", "...", " ?", " !", " ,", " ' ", "é",
            "\u0301", "\u200d", "👍🏽", "\x00", "<s>", "</s>", "<|endoftext|>", "[CLS]", "\ufffd", "\ufeff", "ﬁ",
            "Ｈｅｌｌｏ", "中文", "한국어", "\u2581", "\u2028", "\x85"]


def _normal_pieces(tok) -> list[str]:
    """Texts of a sample of the vocab's normal tokens, as text (so examples hit real merges)."""
    out = []
    attrs = tok.vocab.attrs
    for i in range(0, tok.n_vocab, max(1, tok.n_vocab // 400)):
        if attrs[i] & Attr.NORMAL:
            try:
                out.append(tok.token_to_piece(i).decode("utf-8"))
            except UnicodeDecodeError:
                pass
    return [p for p in out if p] or ["a"]


def texts(tok) -> st.SearchStrategy[str]:
    part = st.one_of(st.text(VALID_CHARS, max_size=6), st.sampled_from(SNIPPETS), st.sampled_from(_normal_pieces(tok)))
    return st.lists(part, max_size=14).map("".join)


def _byte_tokens(tok) -> frozenset[int]:
    """The bytes that have a token of their own (byte-level BPE, byte-fallback SPM): text made of those
    round-trips. Some byte-level vocabs lack bytes (falcon has no token for 0xF2, the lead byte of
    U+80000..U+BFFFF); llama.cpp drops such bytes, and so does minillama."""
    from minillama.tokenizer.unicode import BYTE_TO_CHAR

    t2i = tok.vocab.token_to_id
    if tok.kind == "bpe" and tok.vocab.pre_spec.byte_encode:
        return frozenset(b for b in range(256) if BYTE_TO_CHAR[b] in t2i)
    if tok.kind == "spm":
        return frozenset(b for b in range(256) if f"<0x{b:02X}>" in t2i)
    return frozenset()


def _kind(tok) -> str:
    """'bytes' for byte-level BPE and byte-fallback SPM vocabs, 'lossy' for the others."""
    return "bytes" if len(_byte_tokens(tok)) > 128 else "lossy"


_CLEAN = ((re.compile(rb" (?=[?!.,])"), b""), (re.compile(rb" ' "), b"'"), (re.compile(rb" (?='(?:[sm]|re|ve))"), b""))


def expected_decode(tok, text: str) -> bytes:
    """What llama_detokenize gives back for text encoded without specials, in a round-tripping vocab."""
    b = text.encode("utf-8")
    if tok.vocab.clean_spaces:
        for rx, repl in _CLEAN:
            b = rx.sub(repl, b)
    return b


def _check_ids(tok, ids) -> None:
    assert all(type(i) is int and 0 <= i < tok.n_vocab for i in ids), ids[:20]


@pytest.mark.parametrize("vocab", VOCABS)
def test_valid_text_encodes_and_round_trips(vocab):
    """Any valid str: no exception, ids in range, the round trip, the stream decoder equal to decode."""
    tok = load(vocab)
    round_trips = _kind(tok) == "bytes"
    missing = bytes(sorted(set(range(256)) - _byte_tokens(tok)))
    has_missing = re.compile(b"[" + re.escape(missing) + b"]").search if missing else lambda b: None

    @PROPERTY
    @given(text=texts(tok))
    def prop(text):
        if tok.kind == "spm":
            text = text.replace("\u2581", "")  # SPM's space marker: decodes as a space
        ids = tok.encode(text, add_special=False)
        _check_ids(tok, ids)
        if round_trips and not has_missing(text.encode()):
            assert tok.decode_bytes(ids) == expected_decode(tok, text)
            if not tok.vocab.clean_spaces:
                assert tok.decode(ids) == text
        ids = tok.encode(text, add_special=True, parse_special=True)
        _check_ids(tok, ids)
        sd = tok.stream_decoder()
        assert "".join(sd.push(i) for i in ids) + sd.flush() == tok.decode(ids)

    prop()


def _past_unicode(b: bytes) -> bool:
    """Whether llama.cpp's UTF-8 decoder reads a code point above U+10FFFF from b (it aborts on those in
    BPE and WPM vocabs; minillama reads one U+FFFD): which inputs the oracle can be asked about."""
    return any(cp is not None and cp > 0x10FFFF for cp in llama_utf8_cps(b))


RAW = st.lists(st.one_of(st.binary(max_size=4), st.sampled_from(
    [b"a", b" ", b"hello", b" world", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xed\xa0\x80",
     b"\xc0\x80", b"\xc1\x81", b"\xe0\x80\x80", b"\x80", b"\xff", b"\n", b"<s>", b"'s", b"12"])),
    max_size=16).map(b"".join)


@pytest.mark.parametrize("vocab", VOCABS)
def test_raw_bytes_match_llamacpp(vocab):
    """Text read with errors='surrogateescape' tokenizes as llama.cpp tokenizes the bytes themselves."""
    tok = load(vocab)
    oracle = get_oracle(vocab_path(vocab))
    aborts = tok.kind in ("bpe", "wpm")

    @FEWER
    @given(data=RAW)
    def prop(data):
        assume(not (aborts and _past_unicode(data)))
        text = data.decode("utf-8", "surrogateescape")
        assert tok.encode(text, add_special=False) == oracle.tokenize(data, False, False)
        assert tok.encode(text, add_special=True, parse_special=True) == oracle.tokenize(data, True, True)

    prop()


@pytest.mark.parametrize("vocab", VOCABS)
def test_raw_bytes_and_surrogates(vocab):
    """Any bytes as surrogate escapes, any lone surrogates: no exception. SPM's byte fallback gives the
    very bytes back; surrogates other than U+DC80..U+DCFF are U+FFFD; escapes that form valid UTF-8
    are that character."""
    tok = load(vocab)
    byte_fallback = tok.kind == "spm" and _kind(tok) == "bytes"

    @FEWER
    @given(data=RAW, parts=st.lists(st.one_of(st.text(SURROGATES, min_size=1, max_size=3),
                                              st.text(VALID_CHARS, max_size=4)), max_size=6))
    def prop(data, parts):
        text = data.decode("utf-8", "surrogateescape")
        ids = tok.encode(text, add_special=False)
        _check_ids(tok, ids)
        if byte_fallback and b" " not in data and b"\xe2\x96\x81" not in data:
            assert tok.decode_bytes(ids) == data
        text = "".join(parts)
        ids = tok.encode(text, add_special=False)
        _check_ids(tok, ids)
        replaced = re.sub("[\ud800-\udc7f\udd00-\udfff]", "\ufffd", text)
        assert ids == tok.encode(replaced, add_special=False)

    prop()
    assert tok.encode("a\ud800b", False) == tok.encode("a\ufffdb", False)
    assert tok.encode("\udcc3\udca9t\udce2\udc82\udcac", False) == tok.encode("ét€", False)


@pytest.mark.parametrize("vocab", VOCABS)
def test_random_ids_decode_and_stream(vocab):
    """Random ids, specials among them: decode never raises, the stream decoder agrees with decode."""
    tok = load(vocab)
    n = tok.n_vocab
    special = [i for i, a in enumerate(tok.vocab.attrs) if a & (Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)]
    ids_st = st.lists(st.one_of(st.integers(0, n - 1), st.sampled_from(special or [0]), st.integers(0, 300)),
                      max_size=40)

    @FEWER
    @given(ids=ids_st)
    def prop(ids):
        for skip in (True, False):
            sd = tok.stream_decoder(skip_special_tokens=skip)
            streamed = "".join(sd.push(i) for i in ids) + sd.flush()
            assert streamed == tok.decode(ids, unparse_special=not skip)
        tok.decode_bytes(ids, remove_special=True, unparse_special=True)

    prop()


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-spm", "ggml-vocab-gpt-2", "ggml-vocab-bert-bge",
                                   "ggml-vocab-unigram8k"])
def test_long_texts_without_spaces(vocab):
    """Long runs with no space (one word for the encoders) encode in bounded time and round-trip."""
    import time

    tok = load(vocab)
    for text in ("a" * 100_000, "\x00" * 50_000, "ab1!" * 20_000, "\udcff" * 20_000, "中" * 30_000):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special=False)
        assert time.perf_counter() - t0 < 20, (vocab, text[:4])
        _check_ids(tok, ids)
        if _kind(tok) == "bytes" and text.isascii() and tok.kind == "spm":
            assert tok.decode(ids) == text


def test_bad_arguments():
    tok = load("ggml-vocab-gpt-2")
    n = tok.n_vocab
    for bad in ([n], [-1], [0, 10**30]):
        with pytest.raises(ArgumentError, match=str(n)):
            tok.decode(bad)
    for bad in (["a"], [1.5], "abc", [None], (x for x in ["1"])):
        with pytest.raises(ArgumentTypeError):
            tok.decode(bad)
    with pytest.raises(TypeError):  # ArgumentTypeError is a TypeError too ...
        tok.token_to_piece("1")
    with pytest.raises(ValueError):  # ... and a ValueError, like ArgumentError
        tok.token_to_piece(1.0)
    with pytest.raises(ArgumentError):
        tok.token_to_piece(n)
    for bad in (b"bytes", None, 42, ["list"]):
        with pytest.raises(ArgumentTypeError):
            tok.encode(bad)
    sd = tok.stream_decoder()
    with pytest.raises(ArgumentError):
        sd.push(n)
    with pytest.raises(ArgumentTypeError):
        sd.push("x")
    assert issubclass(ArgumentError, MinillamaError) and issubclass(ArgumentTypeError, MinillamaError)
    import numpy as np

    assert tok.decode(np.array([64, 65], np.int64)) == tok.decode([64, 65]) == "ab"
