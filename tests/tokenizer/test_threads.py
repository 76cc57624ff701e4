"""One Tokenizer shared by threads gives the results of one thread: 8 threads encode different texts at
once (with their lazily built tables and word caches shared, the caches kept small so that they clear
themselves while other threads read them), and encode_batch equals a plain loop, in order."""

from __future__ import annotations

import sys
import threading

import pytest
from support.paths import SHARED, params_or_skip, vocab_path

from minillama.errors import ArgumentError, ArgumentTypeError
from minillama.tokenizer import Tokenizer
from minillama.tokenizer.encoders import base

N_THREADS = 8
VOCABS = params_or_skip(["ggml-vocab-llama-spm", "ggml-vocab-gpt-2", "ggml-vocab-bert-bge", "ggml-vocab-unigram8k"]
                        if SHARED is not None else [], "shared vocabs")


def _texts() -> list[str]:
    """Different texts per thread: real prose in two languages, raw bytes, long words, special tokens."""
    en = (SHARED / "corpus" / "botchan.txt").read_text(encoding="utf-8")[:60_000]
    ja = (SHARED / "corpus" / "wagahaiwa_nekodearu.txt").read_text(encoding="utf-8")[:20_000]
    chunks = [en[i:i + 2500] for i in range(0, len(en), 2500)] + [ja[i:i + 1000] for i in range(0, len(ja), 1000)]
    chunks += ["a" * 3000, "\udcff\udcc3a raw \ud800 bytes " * 50, "<s>[CLS]</s> <|endoftext|> " * 40]
    return chunks


@pytest.fixture
def tiny_cache(monkeypatch):
    """Word caches of 64 entries: they clear themselves constantly while other threads use them."""
    monkeypatch.setattr(base, "CACHE_MAX_WORDS", 64)


@pytest.fixture
def busy_switching():
    """Switch threads as often as CPython allows, so that interleavings are many."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("vocab", VOCABS)
def test_threads_equal_serial(vocab, tiny_cache, busy_switching):
    path = vocab_path(vocab)
    texts = _texts()
    serial_tok = Tokenizer.from_file(path)
    expected = [serial_tok.encode(t, add_special=True, parse_special=i % 2 == 0) for i, t in enumerate(texts)]
    expected_text = [serial_tok.decode(ids) for ids in expected]

    tok = Tokenizer.from_file(path)  # fresh: tables built on first use are built while threads race
    results: dict[int, list[int]] = {}
    decoded: dict[int, str] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(N_THREADS)

    def work(k: int) -> None:
        try:
            start.wait()
            for rep in range(2):
                for i in range(k, len(texts), N_THREADS):
                    ids = tok.encode(texts[i], add_special=True, parse_special=i % 2 == 0)
                    if rep == 0:
                        results[i] = ids
                        decoded[i] = tok.decode(ids)
                    elif ids != results[i]:
                        raise AssertionError(f"text {i}: second encode differs")
                # another thread's texts too, so that the same words meet in the caches
                j = (k + 1) % len(texts)
                assert tok.encode(texts[j], add_special=True, parse_special=j % 2 == 0) == expected[j]
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[0]
    assert [results[i] for i in range(len(texts))] == expected
    assert [decoded[i] for i in range(len(texts))] == expected_text
    assert tok.pieces is tok.pieces  # built once


@pytest.mark.parametrize("vocab", VOCABS)
def test_encode_batch(vocab, tiny_cache):
    tok = Tokenizer.from_file(vocab_path(vocab))
    texts = _texts()
    expected = [tok.encode(t, add_special=False, parse_special=True) for t in texts]
    for n in (None, 1, 3, N_THREADS, 100):
        assert tok.encode_batch(texts, add_special=False, parse_special=True, num_threads=n) == expected
    assert tok.encode_batch(iter(texts[:5]), 2, add_special=False, parse_special=True) == expected[:5]
    assert tok.encode_batch([]) == []


def test_encode_batch_arguments():
    from minillama.tokenizer import default_vocab_path

    tok = Tokenizer.from_file(default_vocab_path())
    with pytest.raises(ArgumentTypeError):
        tok.encode_batch("a single string")
    with pytest.raises(ArgumentTypeError, match="item 1"):
        tok.encode_batch(["ok", b"bytes"])
    with pytest.raises(ArgumentError):
        tok.encode_batch(["a"], num_threads=0)
    with pytest.raises(ArgumentTypeError):
        tok.encode_batch(["a"], num_threads=2.5)
