"""Score-based BPE (tokenizer.ggml.model "llama", llama.cpp's llm_tokenizer_spm, minillama/tokenizer/encoders/spm.py).

Expected ids come from peers, never from minillama: sentencepiece on LLaMA 2's tokenizer.model (the same vocab as
shared/vocab/ggml-vocab-llama-spm.gguf), and llama.cpp itself (the oracle) on small vocabs written here.
Covered: segments merged by the plain loop (shorter than HEAP_MIN_LEN symbols) and by the heap (longer); equal
scores (tokens of one score, and the same pair at several places: the leftmost merges first); byte fallback to
<0xXX> tokens, in short and long words.
"""

from __future__ import annotations

import pytest
from support.merge_words import ALPHABETS, lengths, very_long_words, words
from support.oracle import get_oracle
from support.paths import load, load_file, require_shared

from minillama.tokenizer.encoders.spm import HEAP_MIN_LEN
from minillama.tokenizer.train import TrainedVocab
from minillama.tokenizer.unicode import byte_token

LLAMA2 = "ggml-vocab-llama-spm"
SPACE = "\u2581"


@pytest.fixture(scope="module")
def sp():
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed")
    return spm.SentencePieceProcessor(model_file=str(require_shared("vocab", "llama2-tokenizer.model")))


@pytest.mark.parametrize("heap", [False, True], ids=["plain-loop", "heap"])
@pytest.mark.parametrize("alphabet", ALPHABETS)
def test_llama2_words_match_sentencepiece(sp, heap, alphabet):
    tok = load(LLAMA2)
    for word in words(len(alphabet), lengths(HEAP_MIN_LEN, heap), alphabet):
        assert tok.encode(word, add_special=False) == sp.encode(word), (alphabet, len(word))


def test_llama2_byte_fallback_matches_sentencepiece(sp):
    """Characters that are no token become their UTF-8 bytes as <0xXX> tokens, alone and inside long words."""
    tok = load(LLAMA2)
    rare = "\U0001F9A9\U00010348\u2603\uA9C1"  # flamingo, Gothic hwair, snowman, Javanese
    for text in [rare, "a" + rare + "b", "x" * 60 + rare, (rare + "ab") * 30, "naïve " + rare * 20]:
        ids = sp.encode(text)
        assert any(sp.is_byte(i) for i in ids), text
        assert tok.encode(text, add_special=False) == ids, text


def test_llama2_very_long_word_matches_sentencepiece(sp):
    tok = load(LLAMA2)
    for word in very_long_words(11):
        assert tok.encode(word, add_special=False) == sp.encode(word), word[:20]


def test_llama2_text_matches_sentencepiece(sp):
    tok = load(LLAMA2)
    text = ("Hello world! It's 2024, and naïve café owners say: «ça va?»\n\tdef f(x): return x**2  # ok\n"
            "日本語のテキスト、中文文本。 Ελληνικά и русский текст. " + "z" * 300 + " end")
    assert tok.encode(text, add_special=False) == sp.encode(text)


# ---------------------------------------------------------------------------------------------------------------------
# small vocabs written here, checked against llama.cpp
# ---------------------------------------------------------------------------------------------------------------------

def _spm_vocab(tmp_path, pieces: dict[str, float]):
    """An SPM vocab: <unk> <s> </s>, the 256 <0xXX> byte tokens, then pieces with their scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [byte_token(b) for b in range(256)] + list(pieces)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + list(pieces.values())
    tv = TrainedVocab("spm", "default", tokens, types, scores, [], {"unk": 0, "bos": 1, "eos": 2}, add_bos=True)
    path = tmp_path / "spm.gguf"
    tv.write_gguf(path)
    return load_file(path), get_oracle(path)


def test_equal_scores_against_llamacpp(tmp_path):
    """Pieces of equal score overlap ("ab" and "bc" in "abc"): the leftmost pair merges first, in the plain loop
    and in the heap, whose ranks must keep equal scores equal."""
    pieces = {SPACE: -10.0, "a": -10.0, "b": -10.0, "c": -10.0, "ab": -1.0, "bc": -1.0, "ca": -1.0,
              "abc": -2.0, "bca": -2.0, "aa": -1.0, "aaa": -1.0, "aaaa": -3.0, SPACE + "a": -1.0}
    tok, oracle = _spm_vocab(tmp_path, pieces)
    sizes = list(range(1, 70)) + [97, 128, 255, 1001]
    for word in words(5, sizes, "abc") + words(6, sizes, "aab", runs=False):
        assert tok.encode(word, add_special=False) == oracle.tokenize(word), word


def test_byte_fallback_against_llamacpp(tmp_path):
    """Characters that are no token fall back to <0xXX>, also when they sit between merged pieces of a long word."""
    tok, oracle = _spm_vocab(tmp_path, {SPACE: -5.0, "a": -5.0, "b": -5.0, "ab": -1.0, "ba": -2.0})
    for text in ["d", "é", "adb", "日本", "ab" * 30 + "é" + "ba" * 30, ("aé" + "b") * 40, "a b é"]:
        assert tok.encode(text, add_special=False) == oracle.tokenize(text), text
