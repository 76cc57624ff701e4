"""Rank-based BPE (tokenizer.ggml.model "gpt2", llama.cpp's llm_tokenizer_bpe, minillama/tokenizer/encoders/bpe.py).

Expected ids come from peers, never from minillama: Hugging Face tokenizers on LLaMA 3's tokenizer.json (the same
vocab as shared/vocab/ggml-vocab-llama-bpe.gguf), and llama.cpp itself (the oracle) on small vocabs written here.
Covered: words merged by the plain loop (shorter than HEAP_MIN_LEN symbols) and by the heap (longer, up to many
thousand symbols); equal ranks (the same pair at several places: the leftmost merges first); symbols that are no
token (each byte's token where there is one, the rest dropped).
"""

from __future__ import annotations

import pytest
from support.fixtures import gemma4_vocab
from support.merge_words import ALPHABETS, lengths, very_long_words, words
from support.oracle import get_oracle
from support.paths import load, load_file, require_shared

from minillama.tokenizer.encoders.bpe import HEAP_MIN_LEN
from minillama.tokenizer.train import TrainedVocab
from minillama.tokenizer.unicode import BYTE_TO_CHAR

LLAMA3 = "ggml-vocab-llama-bpe"


@pytest.fixture(scope="module")
def hf():
    tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed")
    return tokenizers.Tokenizer.from_file(str(require_shared("vocab", "llama-3.2-tokenizer.json")))


def _hf_ids(hf, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("heap", [False, True], ids=["plain-loop", "heap"])
@pytest.mark.parametrize("alphabet", ALPHABETS)
def test_llama3_words_match_hf(hf, heap, alphabet):
    """One pre-tokenizer word of each length (letters only: llama3 keeps a letter run whole), as HF encodes it."""
    tok = load(LLAMA3)
    for word in words(len(alphabet), lengths(HEAP_MIN_LEN, heap), alphabet):
        assert tok.encode(word, add_special=False) == _hf_ids(hf, word), (alphabet, len(word))


def test_llama3_very_long_word_matches_hf(hf):
    """A word far past the heap threshold, repeating and not."""
    tok = load(LLAMA3)
    for word in very_long_words(7):
        assert tok.encode(word, add_special=False) == _hf_ids(hf, word), word[:20]


def test_llama3_text_matches_hf(hf):
    tok = load(LLAMA3)
    text = ("Hello world! It's 2024, and naïve café owners say: «ça va?»\n\n\tdef f(x):  return x**2  # ok\n"
            "日本語のテキスト、中文文本。 Ελληνικά и русский текст. 🦙🦙🦙 " + "z" * 300 + " end")
    assert tok.encode(text, add_special=False) == _hf_ids(hf, text)


# ---------------------------------------------------------------------------------------------------------------------
# small vocabs written here, checked against llama.cpp
# ---------------------------------------------------------------------------------------------------------------------

def _bytelevel_vocab(tmp_path, merges: list[tuple[str, str]], drop: tuple[str, ...] = ()):
    """A byte-level vocab: <|endoftext|>, the byte characters, then one token per merge, less the tokens in drop."""
    tokens = ["<|endoftext|>", *sorted(BYTE_TO_CHAR)]
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    tokens = [t for t in tokens if t not in drop]
    types = [3] + [1] * (len(tokens) - 1)
    tv = TrainedVocab("bytelevel", "gpt-2", tokens, types, [0.0] * len(tokens), [f"{a} {b}" for a, b in merges],
                      {"bos": 0, "eos": 0})
    path = tmp_path / "bpe.gguf"
    tv.write_gguf(path)
    return load_file(path), get_oracle(path)


def test_equal_ranks_leftmost_first_against_llamacpp(tmp_path):
    """Runs of one letter: every pair has the same rank, the leftmost merges first (plain loop and heap)."""
    tok, oracle = _bytelevel_vocab(tmp_path, [("a", "a"), ("aa", "a"), ("b", "a"), ("a", "b"), ("aa", "aa"),
                                              ("ab", "a"), ("ba", "b"), ("aaa", "aa")])
    sizes = list(range(1, 70)) + [97, 128, 255, 1001]
    for word in words(3, sizes, "ab") + words(4, sizes, "aab", runs=False):
        assert tok.encode(word, add_special=False) == oracle.tokenize(word), word


def test_symbols_without_token_against_llamacpp(tmp_path):
    """Symbols that are no token: a merge whose result is not in the vocab ("ab", "cd") falls back to the tokens of
    its single bytes; a byte character missing from the vocab (Ã, 0xC3, lead byte of é) has no such token and is
    dropped. In short and long words."""
    tok, oracle = _bytelevel_vocab(tmp_path, [("a", "b"), ("c", "d"), ("ab", "cd"), ("a", "a"), ("©", "a")],
                                   drop=("ab", "cd", "Ã"))
    for text in ["ab", "abcd", "cd", "xaby", "ab" * 40, "abcd" * 30, "é", "aé", "ééé", "aa" + "é" * 30, "é" * 60,
                 "aé" * 40, "ü", "naïve café"]:
        assert tok.encode(text, add_special=False) == oracle.tokenize(text), text


@pytest.mark.parametrize("chunk", [3, 1 << 16])
def test_bucket_queue_pops_in_heap_order(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compact merge queue of huge words pops exactly what heapq pops, through pushes of smaller, equal
    and larger ranks while a rank is being served (the cases llama.cpp's heap handles implicitly)."""
    import heapq
    import random

    from minillama.tokenizer.encoders import merge

    monkeypatch.setattr(merge.BucketQueue, "_CHUNK", chunk)
    for seed in range(300):
        rng = random.Random(seed)
        shift = rng.choice([32, 64])
        heap: list[int] = []
        queue = merge.BucketQueue(shift, "i" if shift == 32 else "q")
        for step in range(300):
            if not heap or rng.random() < 0.45:
                key = rng.randrange(5) << shift | rng.randrange(40)
                heapq.heappush(heap, key)
                queue.push(key)
            else:
                assert queue.pop() == heapq.heappop(heap), (seed, step)
        while heap:
            assert queue.pop() == heapq.heappop(heap), seed
        with pytest.raises(IndexError):
            queue.pop()


# --- SPM-style BPE: tokenizer.ggml.model "gemma4" ---------------------------------------------------------------

@pytest.mark.parametrize("pre", [None, "gpt-2"])
def test_gemma4_model_against_llamacpp(tmp_path, pre):
    """tokenizer.ggml.model "gemma4" as llama.cpp runs it whatever tokenizer.ggml.pre says: spaces escaped to `▁`,
    words split only at newline runs (a run that is a token stays whole), merges over characters, a symbol that is
    no token falls back to its bytes' <0xXX> tokens (bytes without one dropped), bos added."""
    path = gemma4_vocab(tmp_path, pre)
    tok, oracle = load_file(path), get_oracle(path)
    assert (tok.vocab.pre, tok.add_bos) == ("gemma4", True)
    for text in ["abc", " abc", " ab c", "a\nb", "\n\n\n", " \n \n\n", "é", " é", "€", "x", " a b c\n\n abc",
                 "ab" * 30, " abc" * 20, "  a", "a  ", "\n"]:
        for special in (False, True):
            assert tok.encode(text, add_special=special) == oracle.tokenize(text, add_special=special), text
        ids = oracle.tokenize(text)
        assert tok.decode(ids).encode() == oracle.detokenize(ids), text
