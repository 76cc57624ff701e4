"""The Unigram model (tokenizer.ggml.model = "t5", llama.cpp's llm_tokenizer_ugm).

Expected ids come from llama.cpp (shared/conformance/ggml-vocab-unigram8k.jsonl, or the oracle when installed) and
from sentencepiece itself: small unigram models are trained here and converted to GGUF the way llama.cpp's
convert_hf_to_gguf.py does for T5 (tokens, scores and types from the model, the normalizer's precompiled charsmap,
add_dummy_prefix -> add_space_prefix, remove_extra_whitespaces), so those tests need no shared files.

Where sentencepiece and llama.cpp differ by design, the sentencepiece comparisons stay on text where they agree:
* llama.cpp normalizes each text fragment between special tokens separately (each one gets the dummy prefix),
  sentencepiece sees one string: so no special-token text is compared with sentencepiece;
* with remove_extra_whitespaces llama.cpp puts a U+2581 before every run of non-space text even without
  add_dummy_prefix; sentencepiece only between words: the trained models keep add_dummy_prefix when merging spaces;
* the dummy prefix goes before the first non-space character in llama.cpp, so text of spaces only gets none
  (" " -> "▁"), where sentencepiece always prepends one ("▁▁"): such text is compared with llama.cpp only;
* near-ties: llama.cpp sums scores as doubles, sentencepiece as floats; on the Japanese novel they split one
  phrase differently (そうだ|から against そう|だから), so long real text is compared with llama.cpp only.
"""

from __future__ import annotations

import random
import time

import pytest
from support.fixtures import training_lines, write_t5_gguf
from support.oracle import get_oracle
from support.paths import load, load_file, release_tokenizers, require_shared
from support.reference import read_conformance
from support.report import fail_if_any, mismatch_report

try:
    import sentencepiece as spm
except ImportError:  # the sentencepiece tests skip
    spm = None

VOCAB = "ggml-vocab-unigram8k"


def _need_sentencepiece() -> None:
    if spm is None:
        pytest.skip("sentencepiece is not installed (pip install sentencepiece)")


# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp's conformance data (shared/)
# ---------------------------------------------------------------------------------------------------------------------

def test_conformance_encode():
    tok = load(VOCAB)
    rows = read_conformance(VOCAB)
    bad = [(r["text"], got, r["ids"]) for r in rows
           if (got := tok.encode(r["text"], add_special=False, parse_special=False)) != r["ids"]]
    fail_if_any(bad, mismatch_report("encode(add_special=False, parse_special=False)", bad, len(rows), "llama.cpp"))


def test_conformance_encode_special():
    """add_special appends eos (t5: add_bos False, add_eos True); parse_special splits <s>, </s>, <unk> out."""
    tok = load(VOCAB)
    rows = read_conformance(VOCAB)
    bad = [(r["text"], got, r["ids_special"]) for r in rows
           if (got := tok.encode(r["text"], add_special=True, parse_special=True)) != r["ids_special"]]
    fail_if_any(bad, mismatch_report("encode(add_special=True, parse_special=True)", bad, len(rows), "llama.cpp"))


def test_conformance_decode():
    tok = load(VOCAB)
    rows = read_conformance(VOCAB)
    bad = [(r["text"], got, r["detok_hex"]) for r in rows if (got := tok.decode_bytes(r["ids"]).hex()) != r["detok_hex"]]
    fail_if_any(bad, mismatch_report("decode_bytes", bad, len(rows), "llama.cpp"))


# llama.cpp's ids (written down from the oracle) for a control character the charsmap deletes between characters
# that a longer key joins ("d" + U+032D -> U+1E13): llama.cpp matches keys over the text as it is, so the mark stays
# apart (an <unk> of its own); deleting the control character first would join them.
CONTROL_BETWEEN = {
    "d\x16\u032d": [688, 0],
    "d\u032d": [20, 0],
    "a\x01\u0301": [21, 0],
    "\uff45\x9f\u030c": [1695, 0],
    "o\x08\u0300\u0303": [20, 289, 0],
    "6 \u0311h\uff0b\u0416n\x16\u0307": [20, 1394, 20, 0, 693, 1892, 0, 119, 0],
    "\u1100\x10\u1161": [20, 0],
    "\u304b\x05\u3099": [20, 24, 0],
    "e\x7f\u0301 n\x1b\u0303": [1695, 0, 20, 119, 0],
    "A\x8f\u030a": [182, 0],
}


@pytest.mark.parametrize("text", list(CONTROL_BETWEEN))
def test_control_between_letter_and_mark(text):
    """The text "d", U+0016, U+032D gave [20, 0] (U+1E13 as <unk>) on the pure path, llama.cpp [688, 0]."""
    assert load(VOCAB).encode(text, add_special=False) == CONTROL_BETWEEN[text]


def test_metadata():
    tok = load(VOCAB)
    assert tok.model == "ugm"
    assert not tok.add_bos
    assert tok.encode("", add_special=True) == [tok.eos_id]
    assert tok.encode("", add_special=False) == []


def test_byte_path_matches_conformance(monkeypatch):
    """The exact byte-level path (used for lone surrogates and odd vocabs) alone also gives llama.cpp's ids."""
    tok = load(VOCAB)
    monkeypatch.setattr(tok._encoder, "fast_ok", False)
    tok._encoder.clear_cache()
    try:
        rows = read_conformance(VOCAB)
        bad = [(r["text"], got, r["ids"]) for r in rows[:200]
               if (got := tok.encode(r["text"], add_special=False)) != r["ids"]]
    finally:
        tok._encoder.clear_cache()
    fail_if_any(bad, mismatch_report("byte path encode", bad, 200, "llama.cpp"))


def test_speed_conformance_texts():
    """600 texts (217k characters), both encode flavours: well under the few seconds the project allows."""
    tok = load(VOCAB)
    rows = read_conformance(VOCAB)
    tok._encoder.clear_cache()
    t = time.perf_counter()
    for r in rows:
        tok.encode(r["text"], add_special=False)
        tok.encode(r["text"], add_special=True, parse_special=True)
    assert time.perf_counter() - t < 5.0


def test_botchan_matches_sentencepiece():
    """The whole English novel against the sentencepiece model the vocab was converted from."""
    _need_sentencepiece()
    sp = spm.SentencePieceProcessor(model_file=str(require_shared("vocab", "spm-unigram8k.model")))
    text = require_shared("corpus", "botchan.txt").read_text(encoding="utf-8")
    assert load(VOCAB).encode(text, add_special=False) == sp.encode(text)


def test_corpus_matches_llamacpp():
    """Both novels against llama.cpp itself (skips without the oracle)."""
    o = get_oracle(require_shared("vocab", VOCAB + ".gguf"))
    tok = load(VOCAB)
    for name in ("botchan.txt", "wagahaiwa_nekodearu.txt"):
        text = require_shared("corpus", name).read_text(encoding="utf-8")
        assert tok.encode(text, add_special=False) == o.tokenize(text, False, False), name


# ---------------------------------------------------------------------------------------------------------------------
# small unigram models trained here (no shared files needed)
# ---------------------------------------------------------------------------------------------------------------------

def train_unigram(prefix: str, vocab_size: int, **options):
    """A unigram model on training_lines() with T5's special ids (pad 0, eos 1, unk 2, no bos)."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()), model_prefix=prefix, model_type="unigram",
        vocab_size=vocab_size, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, minloglevel=2,
        **options,
    )
    with open(prefix + ".model", "rb") as f:
        proto = f.read()
    return spm.SentencePieceProcessor(model_file=prefix + ".model"), proto


# Text to compare: English like the training text, whitespace runs and edges, characters NFKC folds (full-width
# forms, ligatures, compatibility digits, NBSP, ideographic space, combining sequences, Hangul jamo), characters the
# model never saw (-> one <unk> per run), control characters the charsmap deletes, and U+2581 itself.
STRINGS = [
    "", " ", "   ", "\n", "\t", "\r\n",
    "Hello world", " Hello world", "  Hello   world  ", "Hello\nworld", "Hello\tworld\t\t!", "a  b\n\nc",
    "The quick brown fox jumps over the lazy dog.",
    "I've been told he's there, but we'll see. They're sure it'll rain; you'd better take an umbrella!",
    "In 1984, the price was $3.50 per pound; by 2024 it had risen to $12.99 (an increase of 271%).",
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Kraków, Ångström, crème brûlée.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "Ｆｕｌｌ－ｗｉｄｔｈ　ｔｅｘｔ！ and ｶﾀｶﾅ", "ﬁne ﬂour", "Ⅻ ① ² ½ ™ …", "no\u00a0break", "ideographic\u3000space",
    "e\u0301 a\u0308 n\u0303 A\u030a c\u0327", "\u1100\u1161\u11a8 \u1112\u1161\u11ab", "か\u3099 は\u309a",
    "日本語のテキストです。", "Привет, мир!", "emoji 🦙🚀 and 😶‍🌫️ 🇺🇸", "mixed 中文 English 混合",
    "ctrl\x01\x02chars\x7f and \x0b\x0c", "zero\u200bwidth", "the block \u2581 char \u2581\u2581",
    "x" * 300, " ".join(["word"] * 80), "supercalifragilisticexpialidocious",
    # a control character the charsmap deletes between a letter and a combining mark: no key spans it
    "d\x16\u032d", "a\x01\u0301 e\x7f\u0301", "ｅ\x9f\u030c", "\u1100\x10\u1161", "か\x05\u3099", "A\x8f\u030a",
]


def _fuzz(n: int = 300, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz ABCDEFG  0123456789.,;!?'\"\n\t-") + [
        "é", "ü", "ç", "中", "文", "🦙", "\u00a0", "\u3000", "\u2581", "Ａ", "１", "ﬁ", "\u0301", "ｶ", "ﾞ", "the ",
        " and ", "  ", "\n\n", "ing", " sea shells", "'ll", "\r\n", "\x01", "ß", "İ", "Ω",
    ]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


FUZZ = _fuzz()

CONFIGS = {
    # T5's way: NFKC-based normalization, dummy prefix, runs of spaces merged
    "nmt_nfkc": {"normalization_rule_name": "nmt_nfkc"},
    # plain NFKC (a different charsmap), spaces kept as they are, no dummy prefix
    "nfkc-keep-spaces": {"normalization_rule_name": "nfkc", "remove_extra_whitespaces": False,
                         "add_dummy_prefix": False},
    # no charsmap at all
    "identity": {"normalization_rule_name": "identity", "remove_extra_whitespaces": False},
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def trained(request, tmp_path_factory):
    _need_sentencepiece()
    d = tmp_path_factory.mktemp("ugm")
    sp, proto = train_unigram(str(d / "m"), 300, **CONFIGS[request.param])
    path = d / "m.gguf"
    write_t5_gguf(sp, proto, path)
    yield request.param, sp, path
    release_tokenizers()


def _sp_comparable(config: str, strings: list[str]) -> list[str]:
    """The strings on which sentencepiece and llama.cpp agree by design (see the module docstring)."""
    opts = CONFIGS[config]
    if opts.get("add_dummy_prefix", True) and not opts.get("remove_extra_whitespaces", True):
        return [s for s in strings if s.strip(" ") or not s]
    return strings


@pytest.mark.parametrize("strings", [STRINGS, FUZZ], ids=["handpicked", "fuzz"])
def test_encode_matches_sentencepiece(trained, strings):
    config, sp, path = trained
    tok = load_file(path)
    strings = _sp_comparable(config, strings)
    bad = [(s, got, want) for s in strings if (got := tok.encode(s, add_special=False)) != (want := sp.encode(s))]
    fail_if_any(bad, mismatch_report("encode(add_special=False)", bad, len(strings), "sentencepiece"))


def test_add_special_appends_eos(trained):
    config, sp, path = trained
    tok = load_file(path)
    for s in _sp_comparable(config, STRINGS):
        assert tok.encode(s, add_special=True) == sp.encode(s) + [sp.eos_id()]


def test_byte_path_matches_sentencepiece(trained, monkeypatch):
    config, sp, path = trained
    tok = load_file(path)
    monkeypatch.setattr(tok._encoder, "fast_ok", False)
    tok._encoder.clear_cache()
    try:
        bad = [(s, got, want) for s in _sp_comparable(config, STRINGS + FUZZ)
               if (got := tok.encode(s, add_special=False)) != (want := sp.encode(s))]
    finally:
        tok._encoder.clear_cache()
    fail_if_any(bad, mismatch_report("byte path encode", bad, len(STRINGS + FUZZ), "sentencepiece"))


def test_decode_matches_sentencepiece(trained):
    """decode of sentencepiece's ids, where no <unk> is involved (sentencepiece renders it as ' \u2047 ')."""
    _, sp, path = trained
    tok = load_file(path)
    bad = []
    for s in STRINGS + FUZZ:
        ids = sp.encode(s)
        if sp.unk_id() in ids:
            continue
        if (got := tok.decode(ids)) != (want := sp.decode(ids)):
            bad.append((s, got, want))
    fail_if_any(bad, mismatch_report("decode", bad, len(STRINGS + FUZZ), "sentencepiece"))


def test_trained_matches_llamacpp(trained):
    """Everything, including special-token text and lone invalid bytes, against llama.cpp (skips without it)."""
    _, sp, path = trained
    o = get_oracle(path)
    tok = load_file(path)
    bad = []
    for s in STRINGS + FUZZ + ["<unk></s>a</s> b", "</s>", " </s> x"]:
        for add, parse in ((False, False), (True, True)):
            if (got := tok.encode(s, add, parse)) != (want := o.tokenize(s, add, parse)):
                bad.append((s, got, want))
    for b in (b"\xff", b"a\x80b", b"\xe3\x81", b"\xe3\x81x", b"\xed\xa0\x80", b"\xc0\x80", b"\xf0\x9f\xa6 z"):
        s = b.decode("utf-8", "surrogateescape")  # lone surrogate escapes stand for the raw bytes
        if (got := tok.encode(s, False, False)) != (want := o.tokenize(b, False, False)):
            bad.append((b, got, want))
    fail_if_any(bad, mismatch_report("encode", bad, 2 * len(STRINGS + FUZZ), "llama.cpp"))


@pytest.fixture(scope="module")
def with_user_defined(tmp_path_factory):
    """nmt_nfkc model plus added tokens (USER_DEFINED, as the converter writes added_tokens.json entries)."""
    _need_sentencepiece()
    d = tmp_path_factory.mktemp("ugm_ud")
    sp, proto = train_unigram(str(d / "m"), 300, normalization_rule_name="nmt_nfkc")
    n = sp.get_piece_size()
    added = {"<extra_id_0>": n, "<extra_id_1>": n + 1, "ｘｙ": n + 2, "▁▁": n + 3, "é!": n + 4}
    path = d / "m.gguf"
    write_t5_gguf(sp, proto, path, added)
    yield path
    release_tokenizers()


def test_user_defined_matches_llamacpp(with_user_defined):
    """User-defined tokens: split out before normalization, prefixes of them kept verbatim (a partial byte-wise
    match even stops inside a character: "—" shares its first byte with "▁"), score 0 in the Viterbi pass."""
    o = get_oracle(with_user_defined)
    tok = load_file(with_user_defined)
    strings = STRINGS + FUZZ + [
        "a<extra_id_0>b", "<extra_id_1> x <extra_id_0>", "<extra_id_", "<extra", "<e", "<<>>", "ｘｙｚ ｘ ｙ",
        "x y ｘｙ", "— dash – en ‘quote’ “dq”", "▁▁▁", "é! é? e\u0301!", "ééé!",
    ]
    bad = []
    for s in strings:
        for add, parse in ((False, False), (True, True)):
            if (got := tok.encode(s, add, parse)) != (want := o.tokenize(s, add, parse)):
                bad.append((s, got, want))
    for i in range(tok.n_vocab):  # pieces: user-defined raw, normal with U+2581 as space, control/unknown hidden
        for remove, unparse in ((False, False), (True, True)):
            if (got := tok.decode_bytes([i, i], remove, unparse)) != (want := o.detokenize([i, i], remove, unparse)):
                bad.append((f"<decode {i}, {i}>", got, want))
    fail_if_any(bad, mismatch_report("encode/decode", bad, 2 * len(strings) + 2 * tok.n_vocab, "llama.cpp"))

