"""The speed machinery keeps ids and memory bounded: the two-generation word cache, the provable cuts
(SPM pairs, Unigram segments), and the Unigram tables for very long tokens.

Expected ids come from llama.cpp (the shared conformance set, or the oracle when installed); the cache
tests count the work done, so they assert behaviour, not timing.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import gguf
from support.paths import load, vocab_path
from support.reference import read_conformance

from minillama.tokenizer import Tokenizer
from minillama.tokenizer.encoders import base, ugm


def _conformance_texts(vocab: str, n: int) -> list[str]:
    return [r["text"] for r in read_conformance(vocab, "conformance-diverse")[:n]]


def test_cache_second_pass_never_recomputes_more(monkeypatch):
    """With a cache far smaller than the text's distinct words, a second pass does no more work than the
    first, and words repeated within every generation stay cached (the Python cache: the native one is
    tested in test_backend_parity)."""
    monkeypatch.setattr(base, "CACHE_MAX_WORDS", 50)
    monkeypatch.setenv("MINILLAMA_BACKEND", "pure")
    tok = Tokenizer.from_file(vocab_path("ggml-vocab-llama-bpe"))
    encoder = tok._encoder
    encoder.clear_cache()
    calls = []
    real = encoder.encode_word
    monkeypatch.setattr(encoder, "encode_word", lambda w: calls.append(w) or real(w))
    words = [f"w{i}x" for i in range(400)]
    text = " ".join(w + " the" for w in words)  # " the" is hot: used all the time
    first = tok.encode(text, add_special=False)
    n_first = len(calls)
    calls.clear()
    assert tok.encode(text, add_special=False) == first
    assert len(calls) <= n_first
    assert " the" not in calls  # the hot word was never forgotten in the second pass
    info = encoder.cache_info()
    assert info["words"] <= 50 and info["old_words"] <= 50


def test_cache_bounded_in_bytes(monkeypatch):
    monkeypatch.setattr(base, "CACHE_MAX_BYTES", 20_000)
    tok = load("ggml-vocab-llama-spm")
    encoder = tok._encoder
    encoder.clear_cache()
    rng = random.Random(1)
    for _ in range(200):
        tok.encode(" ".join("".join(rng.choice("abcdefgh") for _ in range(30)) for _ in range(20)))
        info = encoder.cache_info()
        assert info["bytes"] <= 20_000 and info["old_bytes"] <= 20_000


def test_long_words_are_not_cached(monkeypatch):
    monkeypatch.setattr(base, "CACHE_MAX_BYTES", 80_000)  # entries over 10,000 bytes are not cached
    tok = load("ggml-vocab-llama-spm")
    encoder = tok._encoder
    encoder.clear_cache()
    for i in range(20):
        word = "".join(chr(0x61 + (i * 7 + k) % 26) for k in range(1500))
        tok.encode(word)
    info = encoder.cache_info()
    assert info["largest_entry"] <= 10_000 and info["longest_word"] < 1500


def test_spm_pair_segments_match_llamacpp():
    """Encoding with the pair cuts equals llama.cpp on the diverse conformance texts (the cut is on)."""
    rows = read_conformance("ggml-vocab-llama-spm", "conformance-diverse")
    tok = load("ggml-vocab-llama-spm")
    encoder = tok._encoder
    assert any(len(encoder.segments(encoder.prepare(r["text"], True))) > 1 for r in rows[:50])
    bad = [r["text"][:60] for r in rows[:300] if tok.encode(r["text"], add_special=False) != r["ids"]]
    assert not bad


def test_exact_sum_limit():
    assert ugm._exact_sum_limit([-1.0, -2.5, 0.0]) == int(2.0 ** 53 * 2.0 ** -23 / 2.5)  # 1.0 = 0.5 * 2**1: its float32 ulp is 2**-23
    assert ugm._exact_sum_limit([-1.0, float("nan")]) == 0
    assert ugm._exact_sum_limit([-1.0, float("-inf")]) == 0
    tiny = ugm._exact_sum_limit([-20.0, -1e-30])  # a tiny score: no text is long enough to split safely
    assert tiny < 1


def test_unigram_segments_equal_whole_viterbi():
    """The per-segment Viterbi with cached segments gives what one Viterbi over the fragment gives."""
    texts = _conformance_texts("ggml-vocab-unigram8k", 300)
    tok = load("ggml-vocab-unigram8k")
    encoder = tok._encoder
    assert encoder.split_limit > 10 ** 6
    for text in texts:
        if not text or "\udc80" <= max(text) or any("\ud800" <= c <= "\udfff" for c in text):
            continue
        mapped = encoder._normalize_chars(text)
        if mapped is None:
            continue
        s = encoder._whitespace(mapped, ugm.SPACE)
        assert encoder.encode(text) == encoder._viterbi(s), text[:60]


def _t5_gguf(path, tokens: list[tuple[str, float, int]]) -> None:
    w = gguf.GGUFWriter(str(path), "t5")
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list([t.encode() for t, _, _ in tokens])
    w.add_token_scores([s for _, s, _ in tokens])
    w.add_token_types([k for _, _, k in tokens])
    w.add_unk_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


BASE_TOKENS = [("<unk>", 0.0, 2), ("</s>", 0.0, 3), ("\u2581", -1.0, 1), ("a", -2.0, 1), ("b", -3.0, 1)]


def test_unigram_long_token_loads_in_bounded_memory(tmp_path):
    """A 100 KB file holding one 100,000-character token: every prefix of it would take gigabytes."""
    path = tmp_path / "long.gguf"
    _t5_gguf(path, BASE_TOKENS + [("x" * 100_000, -4.0, 1)])
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (600 << 20, 600 << 20))
        from minillama.tokenizer import Tokenizer
        t = Tokenizer.from_file({str(path)!r})
        print(t.encode("ab" + "x" * 100_000 + "ab", add_special=False))
        print(t.encode("ab" + "x" * 100_001 + "ab\\udcff", add_special=False))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    # llama.cpp (checked with the oracle): [3, 4, 5, 3, 4] and [3, 4, 0, 5, 3, 4, 0]
    assert out.stdout.split("\n")[:2] == ["[3, 4, 5, 3, 4]", "[3, 4, 0, 5, 3, 4, 0]"]


def test_unigram_long_user_defined_token_loads(tmp_path):
    """A user-defined token of 600 characters (its trie was frozen recursively: RecursionError)."""
    path = tmp_path / "user.gguf"
    _t5_gguf(path, BASE_TOKENS + [("u" * 600, 0.0, 4)])
    from minillama.tokenizer import Tokenizer

    tok = Tokenizer.from_file(path)
    assert tok.encode("ab" + "u" * 600 + "a", add_special=False) == [3, 4, 5, 3]
