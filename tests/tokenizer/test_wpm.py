"""WordPiece (tokenizer.ggml.model "bert", llama.cpp's llm_tokenizer_wpm).

Expected ids come from llama.cpp (shared/conformance, the .inp/.out test pairs, the oracle) and from Hugging Face
tokenizers on a small WordPiece vocab trained here and written to GGUF the way llama.cpp's convert_hf_to_gguf does
for BERT (word-initial tokens get a U+2581 prefix, "##" continuations lose it, special tokens keep their text).

Known differences between Hugging Face's BertNormalizer/BertPreTokenizer/WordPiece and llama.cpp, which the strings
compared with HF avoid (the oracle tests cover them against llama.cpp itself):
* llama.cpp's "NFD" keeps only the FIRST code point of each decomposition, so a Hangul syllable becomes its leading
  jamo; HF decomposes fully (and keeps the jamo, which are letters).
* llama.cpp drops every mark (\\p{M}) when stripping accents; HF only nonspacing marks (Mn).
* llama.cpp lowercases one code point to one code point; HF lowercases the whole string (U+0130 becomes two code
  points, a word-final capital sigma becomes a final sigma).
* Whitespace: llama.cpp splits on every White_Space code point (\\v, \\f, U+0085, U+2028, U+2029 too); HF splits on
  \\t \\n \\r and Zs only and removes \\v \\f U+0085 as control characters.
* HF removes unassigned code points (category Cn) as control characters; llama.cpp keeps them.
* HF turns words longer than 100 characters into [UNK]; llama.cpp has no such limit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from gguf import Keys, TokenType
from support.fixtures import training_lines
from support.oracle import get_oracle
from support.paths import load, load_file, release_tokenizers, vocab_path
from support.reference import read_conformance, read_llamacpp_inp_out
from support.report import fail_if_any

from minillama.tokenizer import Tokenizer, Vocab

BGE = "ggml-vocab-bert-bge"
SHOW = 5
SPACE = "\u2581"


def _report(what: str, bad: list) -> str:
    lines = [f"{what}: {len(bad)} mismatches; first {min(SHOW, len(bad))}:"]
    for row in bad[:SHOW]:
        lines.append("  " + " | ".join(repr(x)[:200] for x in row))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp's expected outputs for the real bert-bge vocab (shared/)
# ---------------------------------------------------------------------------------------------------------------------

def test_bge_loads_as_wordpiece():
    tok = load(BGE)
    assert tok.model == "wpm"
    assert (tok.bos_id, tok.unk_id, tok.vocab.special["sep"]) == (101, 100, 102)
    assert tok.vocab.add_bos and tok.vocab.add_sep and not tok.vocab.add_eos and tok.vocab.clean_spaces


def test_bge_conformance():
    tok, rows = load(BGE), read_conformance(BGE)
    bad = []
    for i, row in enumerate(rows):
        text = row["text"]
        for what, got, want in (
            ("ids", tok.encode(text, add_special=False, parse_special=False), row["ids"]),
            ("ids_special", tok.encode(text, add_special=True, parse_special=True), row["ids_special"]),
            ("detok", tok.decode_bytes(row["ids"]).hex(), row["detok_hex"]),
        ):
            if got != want:
                bad.append((i, what, text[:80], got, want))
    fail_if_any(bad, _report(f"{BGE} conformance ({len(rows)} texts)", bad))


def test_bge_llamacpp_inp_out():
    tok = load(BGE)
    pairs = read_llamacpp_inp_out(vocab_path(BGE))
    bad = [(text, tok.encode(text, add_special=False, parse_special=False), want) for text, want in pairs
           if tok.encode(text, add_special=False, parse_special=False) != want]
    fail_if_any(bad, _report(f"{BGE}.gguf.inp/.out ({len(pairs)} texts)", bad))


def test_bge_known_cases():
    """A few hand-checked llama.cpp results: punctuation and CJK split, accents stripped, Hangul to its first jamo."""
    tok = load(BGE)
    t = tok.vocab.token_to_id
    assert tok.encode("Hello, WORLD!", add_special=False) == [t["▁hello"], t["▁,"], t["▁world"], t["▁!"]]
    assert tok.encode("Hello", add_special=True) == [101, t["▁hello"], 102]
    assert tok.encode("", add_special=True) == [101, 102]
    assert tok.encode("café CAFÉ cafe\u0301", add_special=False) == [t["▁cafe"]] * 3
    assert tok.encode("中文", add_special=False) == [t["▁中"], t["▁文"]]
    assert tok.encode("안", add_special=False) == [t["▁ᄋ"]]  # U+C548 -> U+110B (the first code point of its NFD)
    assert tok.encode("a\x00b\ufffdc\u200bd", add_special=False) == tok.encode("abcd", add_special=False)
    assert tok.encode("🚀", add_special=False) == [100]  # a word without a full match is one [UNK]


def test_bge_timing():
    """Encoding the 600 conformance texts twice stays well under the budget (a coarse guard, not a benchmark)."""
    import time

    release_tokenizers()
    rows = read_conformance(BGE)
    t0 = time.perf_counter()
    tok = load(BGE)
    for _ in range(2):
        for row in rows:
            tok.encode(row["text"], add_special=False)
    assert time.perf_counter() - t0 < 10


def _fuzz_strings(rng: random.Random, n: int) -> list[str]:
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789 \t\n\r.,;:'\"!?-_()[]{}<>@#$%^&*+=/\\|~`")
            + list("éÉüÖñçÅøßİıΣσςДжЖ中文字日本語안녕하세요ひらがなカタカナ\u0301\u0308\u0903\u20dd\u200b\u200d\ufeff")
            + list("\u00a0\u3000\u2581🚀🇺🇸👍🏽…—–“”‘’€£¥©®™°±×÷\x00\ufffd\x7f\x85\x0b\x0c\u2028\u2029\U000e0001\U0001fb00")
            + ["\U00011f43", "\U00013440", "\U00011b00", "\u0cf3", "\U0002a6df", "\U0002b820", "\U0002b920"])
    words = ["the", "un", "##", "affable", "running", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "don't", "it's",
             "hello", "supercalifragilisticexpialidocious", "a" * 120]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 12)):
            parts.append(rng.choice(words) if rng.random() < 0.3
                         else "".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            parts.append(rng.choice([" ", "", "  ", "\n"]))
        out.append("".join(parts))
    return out


def test_bge_against_oracle():
    """Random mixtures (controls, marks, Unicode whitespace, CJK, Hangul, Unicode 15 additions) against llama.cpp."""
    path = vocab_path(BGE)
    oracle = get_oracle(path)
    tok = load(BGE)
    bad = []
    for s in _fuzz_strings(random.Random(7), 1500):
        for add, parse in ((False, False), (True, True)):
            want = oracle.tokenize(s, add, parse)
            got = tok.encode(s, add_special=add, parse_special=parse)
            if got != want:
                bad.append((s, add, parse, got, want))
        ids = oracle.tokenize(s, False, False) + [101, 102, 0, 103]
        for remove, unparse in ((False, False), (True, True), (True, False)):
            if tok.decode_bytes(ids, remove, unparse) != oracle.detokenize(ids, remove, unparse):
                bad.append((s, "detokenize", remove, unparse))
    fail_if_any(bad, _report("bert-bge vs llama.cpp", bad))


# llama.cpp's ids (written down from the oracle) for control characters between letters and combining marks
# (where the pure Unigram path once differed): WordPiece drops the control and strips the mark.
CONTROL_BETWEEN = {"d\x16\u032d": [1040], "a\x01\u0301": [1037], "\uff45\x9f\u030c": [100], "o\x08\u0300\u0303": [1051],
                   "6 \u0311h\uff0b\u0416n\x16\u0307": [1020, 100], "\u1100\x10\u1161": [1455, 30006],
                   "\u304b\x05\u3099": [1651], "e\x7f\u0301 n\x1b\u0303": [1041, 1050], "A\x8f\u030a": [1037]}


def test_bge_control_between_letter_and_mark():
    tok = load(BGE)
    assert {t: tok.encode(t, add_special=False) for t in CONTROL_BETWEEN} == CONTROL_BETWEEN


def test_bge_pieces_against_oracle():
    path = vocab_path(BGE)
    oracle = get_oracle(path)
    tok = load(BGE)
    bad = [(i, special) for i in range(tok.n_vocab) for special in (True, False)
           if tok.token_to_piece(i, special) != oracle.piece(i, special)]
    fail_if_any(bad, _report("bert-bge token_to_piece vs llama.cpp", bad))


# ---------------------------------------------------------------------------------------------------------------------
# no shared files: hand-made vocabs
# ---------------------------------------------------------------------------------------------------------------------

def _vocab(words: list[str], **extra) -> Tokenizer:
    """A bert vocab in memory: [PAD] [UNK] [CLS] [SEP] [MASK] (control) + the given tokens (normal)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = specials + words
    types = [int(TokenType.CONTROL)] * len(specials) + [int(TokenType.NORMAL)] * len(words)
    md = {Keys.Tokenizer.MODEL: "bert", Keys.Tokenizer.LIST: tokens,
          Keys.Tokenizer.TOKEN_TYPE: np.array(types, np.int32), Keys.Tokenizer.UNK_ID: 1,
          Keys.Tokenizer.BOS_ID: 2, Keys.Tokenizer.SEP_ID: 3, Keys.Tokenizer.PAD_ID: 0, Keys.Tokenizer.MASK_ID: 4,
          **extra}
    return Tokenizer(Vocab.from_metadata(md))


def _pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.vocab.tokens[i] for i in ids]


def test_greedy_longest_match_and_unk():
    tok = _vocab(["▁un", "▁unaff", "aff", "able", "▁a", "ble", "a", "b", "▁x"])
    assert _pieces(tok, tok.encode("unaffable", add_special=False)) == ["▁unaff", "able"]
    assert _pieces(tok, tok.encode("unab", add_special=False)) == ["▁un", "a", "b"]
    # greedy, no backtracking: "▁ab" + "c" fails although "▁a" + "bc" would work
    greedy = _vocab(["▁ab", "▁a", "bc"])
    assert _pieces(greedy, greedy.encode("abc", add_special=False)) == ["[UNK]"]
    # one position that starts no token turns the whole word into a single [UNK], the other words are unaffected
    assert _pieces(tok, tok.encode("unz x", add_special=False)) == ["[UNK]", "▁x"]
    assert _pieces(tok, tok.encode("x unab", add_special=True)) == ["[CLS]", "▁x", "▁un", "a", "b", "[SEP]"]


def test_preprocessing_words():
    """Word splitting and normalisation as llm_tokenizer_wpm_session::preprocess does it."""
    tok = _vocab(["▁a"])
    words = tok._encoder.words  # type: ignore[attr-defined]
    assert words("Hello,  WORLD!\tfoo\nbar") == ["hello", ",", "world", "!", "foo", "bar"]
    assert words("a$b+c€d") == ["a", "$", "b", "+", "c€d"]  # ASCII symbols split, other symbols do not
    assert words("x中文y") == ["x", "中", "文", "y"]
    assert words("Ça\u0301 é\u20dd İ Σ ǅ") == ["ca", "e", "i", "σ", "ǆ"]  # strip marks, lowercase per code point
    assert words("한국 어") == ["ᄒᄀ", "ᄋ"]  # llama.cpp's one-code-point "NFD": a syllable's leading jamo
    assert words("a\x00b\ufffdc\u200bd\x7fe") == ["abcde"]  # NUL, U+FFFD, \p{C} vanish inside a word
    assert words("a\x0bb\x0cc\x85d\u2028e\u3000f") == ["a", "b", "c", "d", "e", "f"]  # White_Space splits
    assert words("a\U000e0080b") == ["a\U000e0080b"]  # unassigned code points are kept
    assert words("a\U00011f43b\U00013440c") == ["a", "\U00011f43", "bc"]  # Unicode 15.0 punctuation and marks


def test_normalizer_options():
    cased = _vocab(["▁Hello", "▁hello", "▁é", "▁e"], **{"tokenizer.ggml.normalizer.lowercase": False})
    assert _pieces(cased, cased.encode("Hello é", add_special=False)) == ["▁Hello", "▁é"]
    assert cased._encoder.words("Héllo É") == ["Héllo", "É"]  # type: ignore[attr-defined]
    lower_only = _vocab(["▁é", "▁e"], **{"tokenizer.ggml.normalizer.strip_accents": False})
    assert lower_only._encoder.words("HÉLLO") == ["héllo"]  # type: ignore[attr-defined]
    strip_only = _vocab(["▁e"], **{"tokenizer.ggml.normalizer.lowercase": False,
                                   "tokenizer.ggml.normalizer.strip_accents": True})
    assert strip_only._encoder.words("HÉLLO") == ["HELLO"]  # type: ignore[attr-defined]


def test_decode_pieces_and_clean_spaces():
    tok = _vocab(["▁hello", "▁,", "▁world", "▁!", "▁it", "▁'", "▁s"])
    ids = tok.encode("hello, world! it's", add_special=True)
    assert _pieces(tok, ids) == ["[CLS]", "▁hello", "▁,", "▁world", "▁!", "▁it", "▁'", "▁s", "[SEP]"]
    # pieces: " hello" " ," ... " s"; then llama.cpp's clean-up drops the space in " ,", " !" and " ' "
    assert tok.decode(ids) == " hello, world! it's"
    assert tok.decode(ids, unparse_special=True) == "[CLS] hello, world! it's[SEP]"
    assert tok.decode(ids, remove_special=True, unparse_special=True) == " hello, world! it's[SEP]"  # bos only
    assert tok.token_to_piece(2, special=False) == b""
    assert tok.token_to_piece(tok.vocab.token_to_id["▁world"]) == b" world"


# ---------------------------------------------------------------------------------------------------------------------
# Hugging Face tokenizers: a trained WordPiece written to GGUF like convert_hf_to_gguf (BertModel.set_vocab)
# ---------------------------------------------------------------------------------------------------------------------

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

HF_STRINGS = [
    "", " ", "\n", "Hello world", "  Hello   world  ", "Hello\nworld\tagain\r\n",
    "The quick brown fox jumps over the lazy dog.",
    "I've been told he's there, but we'll see. They're sure it'll rain; you'd better take an umbrella!",
    "In 1984, the price was $3.50 per pound; by 2024 it had risen to $12.99 (an increase of 271%).",
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Kraków, Ångström, crème brûlée.",
    "CAFÉ NAÏVE ÜBER SEÑOR GARÇON ÉLAN DÉJÀ",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Les élèves étudient à l'école.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "email me at someone@example.com or visit https://example.org/path?query=1&lang=en#top.",
    "Punctuation!!! Really??? Yes... no -- maybe; (perhaps) [certainly] {never} <sometimes> \"quoted\".",
    "a+b=c ^ d|e ~f `g` $h", "中文字 日本語の文", "mixed中文text", "emoji 🚀 rocket 👍🏽 ok",
    "unknownwordxyzqq zzzzzz qqqq", "supercalifragilisticexpialidocious", "don't won't can't",
    "¿Qué? ¡Sí! «quoted» „low“ — dash – en…", "numbers 0 1 22 333 4444 55555 3.14159",
    "e\u0301 a\u0308 n\u0303",  # decomposed accents
]


def _train_hf_wordpiece(lowercase: bool, vocab_size: int = 800):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

    hf = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    hf.train_from_iterator([*training_lines(), "中文字 日本語の文 mixed中文text"], trainer=trainer)
    hf.post_processor = processors.BertProcessing(("[SEP]", hf.token_to_id("[SEP]")),
                                                  ("[CLS]", hf.token_to_id("[CLS]")))
    return hf


def write_bert_gguf(path: Path, hf, lowercase: bool = True) -> None:
    """A Hugging Face WordPiece tokenizer as GGUF, the way llama.cpp's converter writes BERT vocabs."""
    import gguf

    j = json.loads(hf.to_str())
    vocab: dict[str, int] = j["model"]["vocab"]
    special = {a["content"] for a in j["added_tokens"] if a.get("special")}
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(len(by_id))), "HF vocab ids are not contiguous"
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id]

    def phantom(tok: str, toktype: gguf.TokenType) -> str:
        if toktype == gguf.TokenType.CONTROL:
            return tok
        return tok[2:] if tok.startswith("##") else SPACE + tok

    tokens = [phantom(t, tt) for (t, _), tt in zip(by_id, types, strict=True)]
    w = gguf.GGUFWriter(str(path), "bert")
    # minimal architecture keys, so that llama.cpp (the oracle) loads the vocab-only file too
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    # gguf's SpecialVocab: no bos_token in a BERT config, so bos is the cls token
    w.add_bos_token_id(vocab["[CLS]"])
    w.add_sep_token_id(vocab["[SEP]"])
    w.add_unk_token_id(vocab["[UNK]"])
    w.add_pad_token_id(vocab["[PAD]"])
    w.add_mask_token_id(vocab["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
    if not lowercase:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def hf_wordpiece(request, tmp_path_factory):
    pytest.importorskip("tokenizers")
    hf = _train_hf_wordpiece(lowercase=request.param)
    path = tmp_path_factory.mktemp("hf_wpm") / f"hf-wpm-{'uncased' if request.param else 'cased'}.gguf"
    write_bert_gguf(path, hf, lowercase=request.param)
    return hf, path


def _hf_safe_fuzz(rng: random.Random, n: int) -> list[str]:
    """Random strings over characters on which HF and llama.cpp normalise and split the same way."""
    pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n.,;:'\"!?-_()[]{}<>@#$%^&*+=/|~`")
    pool += list("éÉüÜñÑçÇåÅöÖàèìòùâêîôû中文字日本語の¿¡«»—–…€£©🚀\u0301\u0308")
    out = []
    for _ in range(n):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        out.append(s)
    return out


def test_hf_wordpiece_encode(hf_wordpiece):
    hf, path = hf_wordpiece
    tok = load_file(path)
    assert tok.model == "wpm"
    bad = []
    for s in HF_STRINGS + _hf_safe_fuzz(random.Random(3), 2000):
        want = hf.encode(s, add_special_tokens=False).ids
        got = tok.encode(s, add_special=False, parse_special=False)
        if got != want:
            bad.append((s, "plain", got, want))
        want = hf.encode(s).ids
        got = tok.encode(s, add_special=True, parse_special=False)
        if got != want:
            bad.append((s, "special", got, want))
    fail_if_any(bad, _report(f"{path.name} vs Hugging Face", bad))


def test_hf_wordpiece_special_tokens_in_text(hf_wordpiece):
    """HF always matches its special tokens in text; llama.cpp does with parse_special=True."""
    hf, path = hf_wordpiece
    tok = load_file(path)
    bad = []
    for s in ["[CLS] hello [SEP] world [MASK]", "x[SEP]y", "[UNK]", "a [PAD] b", "[MASK]."]:
        want = hf.encode(s).ids
        got = tok.encode(s, add_special=True, parse_special=True)
        if got != want:
            bad.append((s, got, want))
    fail_if_any(bad, _report(f"{path.name} special tokens vs Hugging Face", bad))


def test_hf_wordpiece_against_oracle(hf_wordpiece):
    """The converted vocab in llama.cpp itself, on the HF strings and on strings where HF and llama.cpp differ."""
    _, path = hf_wordpiece
    oracle = get_oracle(path)
    tok = load_file(path)
    assert oracle.model == "wpm"
    strings = HF_STRINGS + _fuzz_strings(random.Random(11), 800) + [
        "한국어 안녕하세요", "İstanbul ΟΔΟΣ", "a\x0bb\x0cc\x85d\u2028e", "x" * 150, "a\U000e0080b", "ऄ\u0903",
    ]
    bad = []
    for s in strings:
        for add, parse in ((False, False), (True, True), (True, False)):
            want = oracle.tokenize(s, add, parse)
            got = tok.encode(s, add_special=add, parse_special=parse)
            if got != want:
                bad.append((s, add, parse, got, want))
        ids = oracle.tokenize(s, True, False)
        for remove, unparse in ((False, False), (True, True)):
            if tok.decode_bytes(ids, remove, unparse) != oracle.detokenize(ids, remove, unparse):
                bad.append((s, "detokenize", remove, unparse))
    fail_if_any(bad, _report(f"{path.name} vs llama.cpp", bad))
