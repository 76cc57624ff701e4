"""The two backends agree: on the same Vocab, the native core (C) and the pure-Python classes give the same
ids, and those are llama.cpp's stored ids, for every shared vocab the core covers over the conformance
and conformance-diverse texts, plus hypothesis text (raw bytes, surrogates, long words, every category).
Also the switch: MINILLAMA_BACKEND=auto|native|pure, Tokenizer.backend, and what happens without the core.

The native tokenizers are built with MINILLAMA_BACKEND=native, so a run where the core is not built fails
here instead of comparing the pure path with itself; the README's test command builds it in place.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
from helpers import REPO, conformance_vocabs, params_or_skip, read_conformance, vocab_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillama.errors import ArgumentError, MinillamaError, UnsupportedError
from minillama.tokenizer import Tokenizer
from minillama.tokenizer.models import base

PROPERTY = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _build(name: str, backend: str) -> Tokenizer:
    old = os.environ.get("MINILLAMA_BACKEND")
    os.environ["MINILLAMA_BACKEND"] = backend
    try:
        return Tokenizer.from_file(vocab_path(name))
    finally:
        if old is None:
            del os.environ["MINILLAMA_BACKEND"]
        else:
            os.environ["MINILLAMA_BACKEND"] = old


@functools.cache
def pair(name: str) -> tuple[Tokenizer, Tokenizer]:
    """(native, pure) tokenizers of one shared vocab."""
    return _build(name, "native"), _build(name, "pure")


def _covered() -> list[str]:
    """The shared vocabs the native core runs (today: every byte-level BPE vocab)."""
    return [n for n in conformance_vocabs() if n in NATIVE_VOCABS]


# The shared byte-level BPE vocabs: the core covers each of them (a vocab falling back to pure fails below).
NATIVE_VOCABS = ("ggml-vocab-deepseek-coder", "ggml-vocab-deepseek-llm", "ggml-vocab-falcon", "ggml-vocab-gpt-2",
                 "ggml-vocab-llama-bpe", "ggml-vocab-mpt", "ggml-vocab-refact", "ggml-vocab-starcoder")
# The SPM vocabs (llm_tokenizer_spm, spm.c): every one is covered.
NATIVE_VOCABS += ("ggml-vocab-llama-spm", "ggml-vocab-phi-3")
VOCABS = params_or_skip(_covered(), "conformance vocabs the native core covers")


@pytest.mark.parametrize("vocab", VOCABS)
def test_backends_are_what_they_say(vocab):
    native, pure = pair(vocab)
    assert (native.backend, pure.backend) == ("native", "pure")
    assert native.vocab.arrays().token_offsets[-1] == len(native.vocab.arrays().token_bytes)


@pytest.mark.filterwarnings("ignore::minillama.errors.DoubleBosWarning")  # texts that start with bos
@pytest.mark.parametrize("directory", ["conformance", "conformance-diverse"])
@pytest.mark.parametrize("vocab", VOCABS)
def test_parity_with_llamacpp(vocab, directory):
    """Both backends give llama.cpp's ids on every text, plain and with specials added and parsed."""
    native, pure = pair(vocab)
    bad = []
    for r in read_conformance(vocab, directory):
        text = r["text"]
        got = native.encode(text, add_special=False)
        if got != r["ids"] or pure.encode(text, add_special=False) != got:
            bad.append(("plain", text[:60]))
        if native.encode(text, add_special=True, parse_special=True) != r["ids_special"]:
            bad.append(("special", text[:60]))
    assert not bad, f"{len(bad)} texts differ, first: {bad[:3]}"


@pytest.mark.parametrize("vocab", VOCABS)
def test_parity_offsets(vocab):
    """encode_with_offsets gives the same ids and spans on both backends."""
    native, pure = pair(vocab)
    for r in read_conformance(vocab)[:150]:
        assert native.encode_with_offsets(r["text"], False) == pure.encode_with_offsets(r["text"], False)


_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=200)
_RAW = st.binary(max_size=120).map(lambda b: b.decode("utf-8", "surrogateescape"))
_PIECES = st.lists(st.sampled_from(["'s", "'LL", " a", "  ", "\r\n", "\n\n ", "123456", "ß", "é", "日本", "👍🏽",
                                    "\u00a0", "\u3000", "\t", "x" * 60, "ab" * 40, "\ud800", "\udcff", "!!?"]),
                   max_size=40).map("".join)


@pytest.mark.parametrize("vocab", VOCABS)
@PROPERTY
@given(text=st.one_of(_TEXT, _RAW, _PIECES))
def test_parity_hypothesis(vocab, text):
    native, pure = pair(vocab)
    assert native.encode(text, add_special=False) == pure.encode(text, add_special=False)


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-bpe", "ggml-vocab-gpt-2", "ggml-vocab-falcon"])
def test_parity_long_words(vocab):
    """Words past the plain scan (the heap merge) and a word of 100,000 characters."""
    native, pure = pair(vocab)
    texts = ["a" * 100_000, "ab" * 3000, "".join(chr(0x61 + i * 7 % 26) for i in range(5000)),
             "日本語" * 700, "\udcff\udcc3" * 300]
    for t in texts:
        assert native.encode(t, add_special=False) == pure.encode(t, add_special=False), t[:20]


def test_threads_share_one_native_tokenizer():
    """encode_batch on 2 threads (the GIL released in C, one shared word cache) equals a plain loop."""
    native, pure = pair("ggml-vocab-llama-bpe")
    texts = [r["text"] for r in read_conformance("ggml-vocab-llama-bpe", "conformance-diverse")]
    native._encoder.clear_cache()
    assert native.encode_batch(texts, num_threads=2, add_special=False) == \
        [pure.encode(t, add_special=False) for t in texts]


def test_native_cache_bound(monkeypatch):
    """The native word cache holds the bounds Python passes in (models/base.py), in bytes and in words."""
    monkeypatch.setattr(base, "CACHE_MAX_BYTES", 40_000)
    monkeypatch.setattr(base, "CACHE_MAX_WORDS", 300)
    native = _build("ggml-vocab-llama-bpe", "native")
    texts = [r["text"] for r in read_conformance("ggml-vocab-llama-bpe", "conformance-diverse")[:300]]
    for t in texts:
        native.encode(t)
        info = native._encoder.cache_info()
        assert info["bytes"] <= 40_000 and info["old_bytes"] <= 40_000
        assert info["words"] <= 300 and info["old_words"] <= 300
        assert info["largest_entry"] <= 40_000 // 8
    assert info["words"] > 0 and info["old_words"] > 0 and (info["max_bytes"], info["max_words"]) == (40_000, 300)
    native.encode("x" * 20_000)  # one word larger than an eighth of the bound is never cached
    assert native._encoder.cache_info()["longest_word"] < 20_000


def test_uncovered_vocab_stays_pure():
    """A vocab the core does not cover (WordPiece today) keeps its Python class, and says so."""
    assert _build("ggml-vocab-bert-bge", "native").backend == "pure"


def test_invalid_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MINILLAMA_BACKEND", "fast")
    with pytest.raises(ArgumentError, match=r"MINILLAMA_BACKEND is 'fast', expected one of auto, native, pure"):
        Tokenizer.from_file(vocab_path("ggml-vocab-gpt-2"))


def _run(code: str, backend: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINILLAMA_BACKEND": backend, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


_NO_CORE = "import sys; sys.modules['minillama._native._core'] = None\n"  # an import of it now fails


def test_pure_never_imports_the_core():
    code = ("import sys\nfrom minillama.tokenizer import Tokenizer\n"
            f"t = Tokenizer.from_file({str(vocab_path('ggml-vocab-gpt-2'))!r})\n"
            "print(t.backend, 'minillama._native._core' in sys.modules)")
    assert _run(code, "pure").stdout.split() == ["pure", "False"]


def test_missing_core_native_fails_auto_falls_back():
    code = (_NO_CORE + "from minillama.tokenizer import Tokenizer\nfrom minillama.errors import UnsupportedError\n"
            "try:\n"
            f"    print(Tokenizer.from_file({str(vocab_path('ggml-vocab-gpt-2'))!r}).backend)\n"
            "except UnsupportedError as e:\n    print('error:', e)")
    native = _run(code, "native").stdout
    assert native.startswith("error: MINILLAMA_BACKEND=native, but the native core minillama._native._core is not "
                             "built"), native
    assert _run(code, "auto").stdout.split() == ["pure"]
    assert issubclass(UnsupportedError, MinillamaError)


def test_backend_is_read_when_built(monkeypatch):
    """The choice is made when a tokenizer is built: changing the variable later changes nothing."""
    monkeypatch.setenv("MINILLAMA_BACKEND", "pure")
    tok = Tokenizer.from_file(vocab_path("ggml-vocab-gpt-2"))
    monkeypatch.setenv("MINILLAMA_BACKEND", "native")
    assert tok.backend == "pure"
