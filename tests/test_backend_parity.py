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
from helpers import (
    REPO,
    conformance_vocabs,
    get_oracle,
    params_or_skip,
    read_conformance,
    require_shared,
    vocab_path,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillama.errors import ArgumentError, MinillamaError, UnsupportedError
from minillama.tokenizer import Tokenizer
from minillama.tokenizer.models import base

PROPERTY = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _build(name: str, backend: str, path: os.PathLike | None = None) -> Tokenizer:
    """The tokenizer of a shared vocab (or of path) built with MINILLAMA_BACKEND=backend."""
    old = os.environ.get("MINILLAMA_BACKEND")
    os.environ["MINILLAMA_BACKEND"] = backend
    try:
        return Tokenizer.from_file(path or vocab_path(name))
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


# --- SPM (spm.c) ------------------------------------------------------------------------------------------------

SPM_VOCABS = params_or_skip([n for n in ("ggml-vocab-llama-spm", "ggml-vocab-phi-3") if n in conformance_vocabs()],
                            "SPM conformance vocabs")
# Long words (the heap merge), a word of 100,000 characters, runs of spaces, text without spaces (cut only between
# characters no token holds side by side), and characters no token covers (byte fallback) inside long words.
_SPM_LONG = ["a" * 100_000, " " * 5000, "ab" * 3000, "".join(chr(0x61 + i * 7 % 26) for i in range(5000)),
             "日本語の文章です。" * 400, "\u0d9e\U0001f600\ua000" * 300, "ab" * 30 + "\U0001f9ec" + "ba" * 30,
             "def f(x):\n    return x\n" * 200]


@pytest.mark.parametrize("vocab", SPM_VOCABS)
def test_spm_long_words_match_llamacpp(vocab):
    """The native SPM encoder gives llama.cpp's ids on long and space-free text, and the pure path agrees."""
    native, pure = pair(vocab)
    oracle = get_oracle(vocab_path(vocab))
    for t in _SPM_LONG:
        got = native.encode(t, add_special=False)
        assert got == oracle.tokenize(t), t[:20]
        assert got == pure.encode(t, add_special=False), t[:20]


_RAW_SPM = ["\udcff\udcc3" * 300, "\udce2 a" * 100, "x\udce2\u2581 y" * 50, "\udcc3a b\udcf0abc d" * 40,
            "a\udce2\udc96\udc81b" * 30, "\udcf0\u2581\u2581 x" * 20]


@pytest.mark.parametrize("vocab", SPM_VOCABS)
def test_spm_raw_bytes_match_llamacpp(vocab):
    """Raw bytes (surrogate escapes): a lead byte takes the next bytes into its symbol whatever they are, also a
    U+2581 after it, as llama.cpp cuts symbols; the ids are llama.cpp's for those bytes."""
    native, pure = pair(vocab)
    oracle = get_oracle(vocab_path(vocab))
    for t in _RAW_SPM:
        got = native.encode(t, add_special=False)
        assert got == oracle.tokenize(t.encode("utf-8", "surrogateescape")), t[:20]
        assert got == pure.encode(t, add_special=False), t[:20]


@pytest.mark.parametrize("path", ["llama2c-tokenizer.bin", "llama2-tokenizer.model"])
def test_spm_loaders_run_native(path):
    """llama2.c's tokenizer.bin and SentencePiece's .model of the llama2 vocab run on the native core, with the
    ids llama.cpp gives for the GGUF of the same vocab."""
    tok = _build("", "native", require_shared("vocab", path))
    assert tok.backend == "native"
    for r in read_conformance("ggml-vocab-llama-spm")[:300]:
        assert tok.encode(r["text"], add_special=False) == r["ids"], r["text"][:40]


def test_spm_threads_share_one_native_tokenizer():
    """encode_batch on 2 threads over one native SPM tokenizer (one word cache, GIL released) gives llama.cpp's
    ids."""
    native, _ = pair("ggml-vocab-llama-spm")
    rows = read_conformance("ggml-vocab-llama-spm", "conformance-diverse")
    native._encoder.clear_cache()
    assert native.encode_batch([r["text"] for r in rows], num_threads=2, add_special=False) == [r["ids"] for r in rows]


def test_spm_native_cache_bound(monkeypatch):
    """The native SPM word cache holds the bounds Python passes in (models/base.py), in bytes and in words."""
    monkeypatch.setattr(base, "CACHE_MAX_BYTES", 40_000)
    monkeypatch.setattr(base, "CACHE_MAX_WORDS", 300)
    native = _build("ggml-vocab-llama-spm", "native")
    for r in read_conformance("ggml-vocab-llama-spm", "conformance-diverse")[:300]:
        assert native.encode(r["text"], add_special=False) == r["ids"]
        info = native._encoder.cache_info()
        assert info["bytes"] <= 40_000 and info["old_bytes"] <= 40_000
        assert info["words"] <= 300 and info["old_words"] <= 300
    assert info["words"] > 0 and info["old_words"] > 0 and (info["max_bytes"], info["max_words"]) == (40_000, 300)
    native.encode("x" * 20_000)  # one word larger than an eighth of the bound is never cached
    assert native._encoder.cache_info()["longest_word"] < 20_000
