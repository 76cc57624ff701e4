"""A small byte-level BPE (GPT-2 style) trained with Hugging Face tokenizers and written to GGUF like llama.cpp's
convert_hf_to_gguf does for gpt2 vocabs (tokenizer.ggml.model "gpt2", pre "gpt-2", merges as "a b" strings):
minillama must split and merge exactly like Hugging Face tokenizers (expected ids come from HF; llama.cpp itself is
consulted too when the oracle is installed).

Known differences between Hugging Face and llama.cpp, and how the tests handle them:
* Splitting: HF's ByteLevel(use_regex=True) uses the GPT-2 regex; llama.cpp's "gpt-2" pre-tokenizer implements the
  same regex by hand.  Fuzzing (tens of thousands of strings over ASCII, contractions, digits, Unicode whitespace,
  letters/numbers/marks from all planes) found no disagreement, so encode is compared on every string.
* Decoding: llama.cpp's BPE detokenizer "cleans spaces" (drops the space in " ?", " !", " .", " ," and before some
  apostrophe contractions such as " 's"), which HF's ByteLevel decoder does not.  So decode is compared with HF (and
  the round trip decode(encode(s)) == s checked) only on strings without a space before one of ?!.,' -- those strings
  are still compared with llama.cpp by the oracle test.
* Special tokens: HF always matches "<|endoftext|>" in text; llama.cpp only with parse_special=True.  Strings holding
  it are compared with HF under parse_special=True, and under parse_special=False with HF's pre-tokenizer + BPE model
  applied directly (which ignores added tokens).
"""

from __future__ import annotations

import random
import re

import pytest
from support.oracle import get_oracle
from support.paths import load_file, release_tokenizers
from support.report import assert_all_equal, fail_if_any, mismatch_report, piece_mismatches

STRINGS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t",
    "Hello world",
    " Hello world",
    "  Hello world",
    "Hello world ",
    "Hello world   ",
    "Hello   world",
    "Hello\nworld",
    "Hello\n\nworld\n",
    "Hello \n world",
    "line one\n  line two\n\tline three",
    "I've been told he's there, but we'll see.",
    "They're sure it'll rain; you'd better take an umbrella!",
    "I'M SHOUTING AND YOU'RE NOT, WE'VE HEARD IT'S LOUD",
    "don't won't can't shouldn't 'tis 'twas rock'n'roll",
    "'s 't 're 've 'm 'll 'd",
    "In 1984, the price was $3.50 per pound; by 2024 it had risen to $12.99.",
    "0 1 22 333 4444 55555 666666 7777777",
    "3.14159 2,718 1e10 0x1F -42 +7",
    "Punctuation!!! Really??? Yes... no -- maybe;;; (perhaps) [certainly] {never}",
    "!!!!!!",
    "...,,,;;;:::",
    "a--b__c==d",
    "email@example.com https://example.org/path?query=1&lang=en#top",
    "def main():\n    print('hello, world')\n    return 0\n",
    "    if x == 1:\n        return {'a': [1, 2, 3]}\n",
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "日本語のテキストです。中文和English混合",
    "Привет, мир!",
    "emoji 🦙🚀 and 😶‍🌫️ and 🇺🇸",
    "combining e\u0301 and a\u0308",
    "non\u00a0breaking and ideographic\u3000space",
    "tabs\t\tand\u2003em spaces",
    "trailing newline\n",
    "x" * 300,
    " ".join(["word"] * 60),
]

SPECIAL = "<|endoftext|>"
SPECIAL_STRINGS = [
    SPECIAL,
    f"Hello{SPECIAL}world",
    f"Hello {SPECIAL} world",
    f"{SPECIAL}{SPECIAL}",
    f"end of text\n{SPECIAL}\nnext document",
]


def _fuzz_strings(n: int = 400, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ  0123456789.,;!?'\"\n\t-") + list(
        "éüçñ中文🦙\u00a0\u3000\u2581<>/\r"
    ) + ["the ", " and ", "  ", "\n\n", "'s", "'ll", "'VE", "123", "!!!", " \n", "\u0301", "①", "٣"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


FUZZ = _fuzz_strings()

# llama.cpp's BPE detokenizer removes the space in these (clean_spaces); see the module docstring.
_CLEANED = re.compile(r" [?!.,']")


def _decode_comparable(s: str) -> bool:
    return not _CLEANED.search(s)


@pytest.fixture(scope="module")
def tok(hf_bpe):
    yield load_file(hf_bpe.path)
    release_tokenizers()


@pytest.fixture(scope="module")
def hf(hf_bpe):
    return hf_bpe.hf


def _report(what, bad, total, ref="Hugging Face tokenizers"):
    return mismatch_report(what, bad, total, ref)


def _hf_plain_ids(hf, s: str) -> list[int]:
    """HF's ByteLevel pre-tokenizer and BPE model without added-token matching (= parse_special=False)."""
    ids = []
    for piece, _ in hf.pre_tokenizer.pre_tokenize_str(s):
        ids.extend(t.id for t in hf.model.tokenize(piece))
    return ids


def test_metadata(hf_bpe, tok):
    assert tok.n_vocab == hf_bpe.vocab_size
    assert tok.model == "bpe"
    assert tok.pre == "gpt-2"
    assert tok.eos_id == hf_bpe.eot_id
    assert tok.is_eog(hf_bpe.eot_id)


def test_fixture_sanity(hf):
    """Guard for the test data: the strings exercise multi-token merges and several pre-tokenizer splits."""
    assert len(hf.encode("Hello world").ids) < len(b"Hello world")
    assert _hf_plain_ids(hf, "don't") == hf.encode("don't").ids


@pytest.mark.parametrize("strings", [STRINGS, FUZZ], ids=["handpicked", "fuzz"])
def test_encode_matches_hf(hf, tok, strings):
    assert_all_equal("encode(add_special=False)", strings, lambda s: tok.encode(s, add_special=False),
                     lambda s: hf.encode(s).ids, "Hugging Face tokenizers")


def test_encode_parse_special_matches_hf(hf, tok):
    assert_all_equal("encode(parse_special=True)", SPECIAL_STRINGS,
                     lambda s: tok.encode(s, add_special=False, parse_special=True), lambda s: hf.encode(s).ids,
                     "Hugging Face tokenizers")


def test_special_text_not_parsed_by_default(hf_bpe, hf, tok):
    bad = []
    for s in SPECIAL_STRINGS:
        got = tok.encode(s, add_special=False, parse_special=False)
        want = _hf_plain_ids(hf, s)
        assert hf_bpe.eot_id not in want
        if got != want:
            bad.append((s, got, want))
    fail_if_any(bad, _report("encode(parse_special=False)", bad, len(SPECIAL_STRINGS)))


@pytest.mark.parametrize("strings", [STRINGS, FUZZ], ids=["handpicked", "fuzz"])
def test_decode_round_trip(hf, tok, strings):
    """decode(ids) == HF decode == the original text (byte-level BPE is lossless), where llama.cpp doesn't clean."""
    cases = [s for s in strings if _decode_comparable(s)]
    assert len(cases) > len(strings) // 2
    bad = []
    for s in cases:
        ids = hf.encode(s).ids
        assert hf.decode(ids, skip_special_tokens=False) == s  # the reference itself round-trips
        got = tok.decode(ids)
        if got != s:
            bad.append((s, got, s))
        elif tok.decode_bytes(ids) != s.encode("utf-8"):
            bad.append((s, tok.decode_bytes(ids), s.encode("utf-8")))
    fail_if_any(bad, _report("decode", bad, len(cases)))


def test_decode_special_token(hf_bpe, hf, tok):
    """Special tokens render as their text only with unparse_special=True (llama.cpp), as HF's decode shows them."""
    ids = hf.encode(" world").ids + [hf_bpe.eot_id]
    want_text = hf.decode(ids, skip_special_tokens=False)
    assert want_text == " world" + SPECIAL
    assert tok.decode(ids, unparse_special=True) == want_text
    assert tok.decode(ids, unparse_special=False) == hf.decode(ids, skip_special_tokens=True)


def test_token_to_piece_is_bytes(hf, tok):
    """Byte-level pieces map back to raw bytes: 'Ġ' is a space, and each of the 256 byte symbols is one byte."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    pieces = {}
    for ch in alphabet:
        i = hf.token_to_id(ch)
        assert i is not None
        pieces[ch] = tok.token_to_piece(i)
    assert all(isinstance(p, bytes) and len(p) == 1 for p in pieces.values())
    assert len(set(pieces.values())) == 256
    assert pieces["Ġ"] == b" "
    assert pieces["Ċ"] == b"\n"
    assert pieces["a"] == b"a"


def test_matches_llamacpp_oracle(hf_bpe, tok):
    """llama.cpp on the same GGUF (skips without the oracle): encode both ways, decode (with clean-up), pieces."""
    o = get_oracle(hf_bpe.path)
    bad = []
    for s in STRINGS + FUZZ + SPECIAL_STRINGS:
        for parse_special in (False, True):
            got = tok.encode(s, add_special=False, parse_special=parse_special)
            want = o.tokenize(s, False, parse_special)
            if got != want:
                bad.append((s, f"encode(parse_special={parse_special}) {got}", want))
        ids = o.tokenize(s, False, True)
        for unparse in (False, True):
            got_b, want_b = tok.decode_bytes(ids, unparse_special=unparse), o.detokenize(ids, False, unparse)
            if got_b != want_b:
                bad.append((s, f"decode_bytes(unparse_special={unparse}) {got_b!r}", want_b))
    bad += piece_mismatches(tok, o)
    fail_if_any(bad, _report("encode/decode/token_to_piece", bad, len(STRINGS + FUZZ + SPECIAL_STRINGS),
                            ref="llama.cpp"))
