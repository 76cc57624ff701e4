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
import random
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from gguf import Keys, TokenType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import REPO
from support.fixtures import gemma4_vocab, hf_bert_from_gguf, unigram_json, write_t5_gguf
from support.oracle import get_oracle
from support.paths import params_or_skip, require_shared, vocab_path
from support.reference import conformance_vocabs, read_conformance

from minillama.errors import ArgumentError, MinillamaError, UnsupportedError
from minillama.tokenizer import Tokenizer, Vocab, encoders
from minillama.tokenizer.encoders import base
from minillama.tokenizer.encoders.bpe import BPEEncoder, native_merges
from minillama.tokenizer.pretokenize import PreTokenizer

PROPERTY = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _build(name: str, backend: str, path: os.PathLike | None = None) -> Tokenizer:
    """The tokenizer of a shared vocab (or of path) built with MINILLAMA_BACKEND=backend."""
    return _with_backend(backend, lambda: Tokenizer.from_file(path or vocab_path(name)))


def _with_backend(backend: str, make: Callable[[], Tokenizer]) -> Tokenizer:
    """make() with MINILLAMA_BACKEND=backend (the variable restored afterwards)."""
    old = os.environ.get("MINILLAMA_BACKEND")
    os.environ["MINILLAMA_BACKEND"] = backend
    try:
        return make()
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
    """The shared vocabs the native core runs (every byte-level BPE, SPM, WordPiece and Unigram vocab)."""
    return [n for n in conformance_vocabs() if n in NATIVE_VOCABS]


# The shared byte-level BPE, SPM, WordPiece and Unigram vocabs: the core covers each of them (a vocab falling back to
# pure fails below).
NATIVE_VOCABS = ("ggml-vocab-deepseek-coder", "ggml-vocab-deepseek-llm", "ggml-vocab-falcon", "ggml-vocab-gpt-2",
                 "ggml-vocab-llama-bpe", "ggml-vocab-mpt", "ggml-vocab-refact", "ggml-vocab-starcoder",
                 "ggml-vocab-bert-bge", "ggml-vocab-unigram8k")
# The SPM vocabs (llm_tokenizer_spm, spm.c): every one is covered.
NATIVE_VOCABS += ("ggml-vocab-llama-spm", "ggml-vocab-phi-3")
# SPM-style BPE (tokenizer.ggml.model "gemma4": merges over UTF-8 characters, <0xXX> byte tokens) in bpe.c.
NATIVE_VOCABS += ("ggml-vocab-gemma-4",)
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
# Every general category (the splitters' classes are llama.cpp's categories), with the ASCII the patterns name.
_CATEGORIES = ("Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
               "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn")
_MIXED = st.text(st.one_of(*(st.characters(categories=[c]) for c in _CATEGORIES),
                           st.sampled_from(list(" \t\n\r\x0b\x0c0123456789'!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~sStT"))),
                 max_size=80)
# Letters (ASCII, full-width, ones with keys in the Unigram charsmaps), control characters (which nmt_nfkc deletes),
# combining marks (which those keys join to the letter before) and spaces, side by side: the reported
# "d", U+0016, U+032D.
_CONTROLS = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]]
_MARKS = [chr(c) for c in [*range(0x300, 0x370), *range(0x1AB0, 0x1ACF), *range(0x1DC0, 0x1E00), *range(0x20D0, 0x20F1)]]
_LETTERS = list("adeoAnhzK6!") + ["\uff41", "\uff45", "\uff2e", "\uff0b", "\uff71", "\u0416", "\u304b", "\u30ab",
                                  "\u1100", "\u1161", "\u11a8", "\u3099", "\u309a", "\ufb01", "\U0001f600"]
_SPACES = [" ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u2581", "\u2002"]
_CTRL_MARKS = st.lists(st.tuples(st.sampled_from(_LETTERS + _MARKS[:8] + _SPACES),
                                  st.lists(st.sampled_from(_CONTROLS), max_size=2).map("".join),
                                  st.lists(st.sampled_from(_MARKS), max_size=2).map("".join)),
                        max_size=5).map(lambda parts: "".join("".join(p) for p in parts))
_PIECES = st.lists(st.sampled_from(["'s", "'LL", " a", "  ", "\r\n", "\n\n ", "123456", "ß", "é", "日本", "👍🏽",
                                    "\u00a0", "\u3000", "\t", "x" * 60, "ab" * 40, "\ud800", "\udcff", "!!?"]),
                   max_size=40).map("".join)


@pytest.mark.parametrize("vocab", VOCABS)
@PROPERTY
@given(text=st.one_of(_TEXT, _RAW, _PIECES, _MIXED, _CTRL_MARKS))
def test_parity_hypothesis(vocab, text):
    native, pure = pair(vocab)
    assert native.encode(text, add_special=False) == pure.encode(text, add_special=False)


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-bpe", "ggml-vocab-gpt-2", "ggml-vocab-falcon",
                                   "ggml-vocab-bert-bge", "ggml-vocab-unigram8k", "ggml-vocab-gemma-4"])
def test_parity_long_words(vocab):
    """Words past the plain scan (the heap merge), a word of 100,000 characters, runs of raw bytes."""
    native, pure = pair(vocab)
    texts = ["a" * 100_000, "ab" * 3000, "".join(chr(0x61 + i * 7 % 26) for i in range(5000)),
             "日本語" * 700, "\udcff\udcc3" * 300]
    for t in texts:
        assert native.encode(t, add_special=False) == pure.encode(t, add_special=False), t[:20]


def test_gemma4_small_vocab_both_backends(tmp_path):
    """SPM-style BPE in the core's character mode on a vocab made to reach its corners: characters that are no
    token falling back to their bytes' <0xXX> tokens (or dropped where a byte has none), newline runs kept whole
    only where the run is a token, spaces and a literal U+2581 as one character, lone surrogates, words past the
    plain scan (the heap merge). Both backends give llama.cpp's ids."""
    path = gemma4_vocab(tmp_path, None)
    native, pure = (_build("", b, path) for b in ("native", "pure"))
    assert (native.backend, pure.backend) == ("native", "pure")
    oracle = get_oracle(path)
    texts = ["abc", " abc", "\u2581abc", " ab c", "a\nb", "\n\n\n", "\n\n\n\n\n", " \n \n\n", "é", " é", "€",
             "日本", "x", "x é€ y", " a b c\n\n abc", "ab" * 30, " abc" * 20, "é€" * 40, "  a", "a  ", "\n", ""]
    bad = [row for t in texts for row in _three_way(native, pure, oracle, t)]
    assert not bad, bad[:3]
    for t in ["\ud800abc \udcff", "ab\udce9" * 30]:  # lone surrogates: the raw-byte path, the same on both
        assert native.encode(t, add_special=False) == pure.encode(t, add_special=False), t


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-bpe", "ggml-vocab-bert-bge", "ggml-vocab-unigram8k"])
def test_threads_share_one_native_tokenizer(vocab):
    """encode_batch on 2 threads (the GIL released in C, one shared word cache) equals a plain loop."""
    native, pure = pair(vocab)
    texts = [r["text"] for r in read_conformance(vocab, "conformance-diverse")]
    native._encoder.clear_cache()
    assert native.encode_batch(texts, num_threads=2, add_special=False) == \
        [pure.encode(t, add_special=False) for t in texts]


def test_native_cache_bound(monkeypatch):
    """The native word cache holds the bounds Python passes in (encoders/base.py), in bytes and in words."""
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


def test_uncovered_vocab_stays_pure(monkeypatch):
    """A vocab of a kind the core does not cover keeps its Python class, and says so."""
    monkeypatch.delitem(encoders.NATIVE, "wpm")
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


# The vocabs whose pre-tokenizer the core splits itself (pretok.c, pretok_multi.c): no Python regex runs.
C_SPLIT = ("ggml-vocab-falcon", "ggml-vocab-gpt-2", "ggml-vocab-llama-bpe", "ggml-vocab-mpt", "ggml-vocab-refact",
           "ggml-vocab-starcoder", "ggml-vocab-gemma-4")


@pytest.mark.filterwarnings("ignore::minillama.errors.DoubleBosWarning")
@pytest.mark.parametrize("vocab", params_or_skip([n for n in C_SPLIT if n in _covered()], "C-split vocabs"))
def test_core_splits_without_python(vocab, monkeypatch):
    """Falcon's and StarCoder's pattern lists (punctuation runs / single numbers, then GPT-2, then digit
    triples) run in C: with Python's splitting disabled, both conformance directories still give llama.cpp's
    ids, plain and with specials added and parsed."""
    native, _ = pair(vocab)
    native._encoder.clear_cache()

    def refuse(*args, **kwargs):
        raise AssertionError("Python's pre-tokenizer ran")

    monkeypatch.setattr(PreTokenizer, "split", refuse)
    monkeypatch.setattr(BPEEncoder, "words", refuse)
    for directory in ("conformance", "conformance-diverse"):
        for r in read_conformance(vocab, directory):
            assert native.encode(r["text"], add_special=False) == r["ids"], r["text"][:60]
            assert native.encode(r["text"], add_special=True, parse_special=True) == r["ids_special"], r["text"][:60]


@pytest.mark.filterwarnings("ignore::minillama.errors.DoubleBosWarning")
@pytest.mark.parametrize("threads", [1, 2])
def test_batch_fast_path_is_encode(threads):
    """encode_batch through the core's encode_many (one call per run of texts) gives llama.cpp's ids, with the
    bos that add_special adds, and texts with lone surrogates (which the core hands back) the raw-byte way."""
    native, pure = pair("ggml-vocab-llama-bpe")
    rows = read_conformance("ggml-vocab-llama-bpe", "conformance-diverse")[:400]
    texts = [r["text"] for r in rows]
    bos = native.bos_id
    assert native.encode_batch(texts, num_threads=threads, add_special=False) == [r["ids"] for r in rows]
    assert native.encode_batch(texts, num_threads=threads) == [[bos, *r["ids"]] for r in rows]
    raw = ["ab\udcff cd", "\udcc3\udca9t\u00e9", "plain"]
    assert native.encode_batch(raw, num_threads=threads) == [pure.encode(t) for t in raw]


def _bpe_vocab(tokens: list[str], merges: list[str]) -> Vocab:
    return Vocab.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
                                "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges})


def test_core_resolves_merges_as_python():
    """The core's merge resolution at load (merges.c) gives Vocab.arrays().merges' rows: llama.cpp's split at
    the first space after position 0, -1 for a part or result that is no token; every shared vocab, and odd
    merges (no space, a leading or trailing space, unknown parts, multi-byte first characters, a newline or
    surrogates, where Python's resolution is kept)."""
    from minillama._native import _core
    for name in _covered():
        v = pair(name)[0].vocab
        if v.kind != "bpe":
            continue
        assert (native_merges(v, _core) == v.arrays().merges).all(), name
    odd = [["a", "b", "ab", " ", "é", "é b", "éb", "b ", "\n", "a\nb"],
           ["a", "b", "ab", "\udcc3\udca9", "é"]]
    merges = ["a b", "x y", "nospace", " a", "a ", "é b", "é  b", "", "a b c", "b  "]
    for tokens in odd:
        for extra in ([], ["a\nb c"], ["\udcc3\udca9 b"]):
            v = _bpe_vocab(tokens, merges + extra)
            assert (native_merges(v, _core) == v.arrays().merges).all(), (tokens, extra)
    offsets = np.array([0, 1, 2], np.int64)  # tokens "a", "b"
    assert np.frombuffer(_core.BPE.resolve_merges(b"ab", offsets, b"a b\nb a", 2), np.int32).tolist() == \
        [0, 1, -1, 1, 0, -1]
    for text, n in ((b"a b", 2), (b"a b\nb a", 1), (b"a b\n", 1), (b"a", 0)):  # lines != n_merges: refused
        assert _core.BPE.resolve_merges(b"ab", offsets, text, n) is None, (text, n)
    with pytest.raises(ValueError):
        _core.BPE.resolve_merges(b"ab", offsets, b"a b", -1)


# --- Unigram and WordPiece -------------------------------------------------------------------------------------

def _from_metadata(md: dict) -> tuple[Tokenizer, Tokenizer]:
    """(native, pure) tokenizers of one in-memory vocab."""
    native, pure = (_with_backend(b, lambda: Tokenizer(Vocab.from_metadata(md))) for b in ("native", "pure"))
    assert (native.backend, pure.backend) == ("native", "pure")
    return native, pure


def _outcome(tok: Tokenizer, text: str) -> object:
    """The ids, or the error's type and message."""
    try:
        return tok.encode(text, add_special=False)
    except MinillamaError as e:
        return type(e).__name__, str(e)


@functools.cache
def _spm_pair(name: str) -> tuple[Tokenizer, Tokenizer]:
    """(native, pure) tokenizers of a SentencePiece .model under shared/vocab."""
    pytest.importorskip("sentencepiece")
    path = require_shared("vocab", name)
    native, pure = (_with_backend(b, lambda: Tokenizer.from_file(path)) for b in ("native", "pure"))
    return native, pure


@pytest.mark.parametrize("name", ["spm-unigram8k.model", "spm-unigram-ja-test.model"])
@pytest.mark.parametrize("directory", ["conformance", "conformance-diverse"])
def test_unigram_sentencepiece_models(name, directory):
    """Unigram vocabs read by the SentencePiece loader run natively and agree with the pure path on every
    conformance text; spm-unigram8k.model (the source of ggml-vocab-unigram8k.gguf) gives llama.cpp's ids."""
    native, pure = _spm_pair(name)
    assert (native.backend, pure.backend) == ("native", "pure")
    bad = []
    for r in read_conformance("ggml-vocab-unigram8k", directory):
        got = native.encode(r["text"], add_special=False)
        if got != pure.encode(r["text"], add_special=False) or (name == "spm-unigram8k.model" and got != r["ids"]):
            bad.append(r["text"][:60])
    assert not bad, f"{len(bad)} texts differ, first: {bad[:3]}"


@pytest.mark.parametrize("name", ["spm-unigram8k.model", "spm-unigram-ja-test.model"])
@PROPERTY
@given(text=st.one_of(_TEXT, _RAW, _PIECES, _CTRL_MARKS))
def test_unigram_sentencepiece_models_hypothesis(name, text):
    native, pure = _spm_pair(name)
    assert native.encode(text, add_special=False) == pure.encode(text, add_special=False)


def _ctrl_marks_texts(n: int = 1500, seed: int = 34) -> list[str]:
    """The reported cases and n random mixtures of letters, control characters, combining marks and spaces
    (a letter, then up to two controls, then up to two marks, a few times over; or any of them at random)."""
    rng = random.Random(seed)
    out = ["d\x16\u032d", "d\u032d", "a\x01\u0301", "\uff45\x9f\u030c", "o\x08\u0300\u0303", "\u1100\x10\u1161",
           "\u304b\x05\u3099", "e\x7f\u0301 n\x1b\u0303", "A\x8f\u030a", "6 \u0311h\uff0b\u0416n\x16\u0307"]
    groups = [_LETTERS, _CONTROLS, _MARKS, _SPACES]
    for i in range(n):
        if i % 2:
            parts = []
            for _ in range(rng.randint(1, 4)):
                parts.append(rng.choice(rng.choice([_LETTERS, _LETTERS, _MARKS, _SPACES])))
                parts += [rng.choice(_CONTROLS) for _ in range(rng.randint(0, 2))]
                parts += [rng.choice(_MARKS) for _ in range(rng.randint(0, 2))]
            out.append("".join(parts))
        else:
            out.append("".join(rng.choice(rng.choice(groups)) for _ in range(rng.randint(1, 12))))
    return out


CTRL_MARKS_TEXTS = _ctrl_marks_texts()

# Every Unigram and WordPiece vocab the tests load: the shared GGUFs, the SentencePiece models, and the
# tokenizer.json files made from them (their GGUF twins are llama.cpp's vocab: test_hf_json_wpm_ugm.py checks
# the metadata are the same).
UGM_WPM = ["ggml-vocab-unigram8k", "ggml-vocab-bert-bge", "spm-unigram8k.model", "spm-unigram-ja-test.model",
           "bert-bge tokenizer.json", "unigram8k tokenizer.json"]


@functools.cache
def _ugm_wpm(name: str, workdir: str) -> tuple[Tokenizer, Tokenizer, str]:
    """(native, pure, the GGUF llama.cpp loads for the same vocab) of one UGM_WPM entry."""
    if name.startswith("ggml-vocab-"):
        return (*pair(name), str(vocab_path(name)))
    if name == "spm-unigram8k.model":
        return (*_spm_pair(name), str(vocab_path("ggml-vocab-unigram8k")))
    if name == "spm-unigram-ja-test.model":
        spm = pytest.importorskip("sentencepiece")
        model = require_shared("vocab", name)
        path = os.path.join(workdir, "ja.gguf")  # converted as llama.cpp's converter does, for the oracle
        write_t5_gguf(spm.SentencePieceProcessor(model_file=str(model)), model.read_bytes(), path)
        return (*_spm_pair(name), path)
    twin = "ggml-vocab-bert-bge" if name.startswith("bert") else "ggml-vocab-unigram8k"
    hf = hf_bert_from_gguf(pair(twin)[1]) if name.startswith("bert") else \
        unigram_json(str(require_shared("vocab", "spm-unigram8k.model")))
    path = os.path.join(workdir, f"{twin}.json")
    hf.save(path)
    return (*(_build("", b, path) for b in ("native", "pure")), str(vocab_path(twin)))


@pytest.fixture(scope="module", params=UGM_WPM)
def ugm_wpm(request, tmp_path_factory):
    """(native, pure, llama.cpp) for one Unigram or WordPiece vocab; skips without shared/ or the oracle."""
    native, pure, gguf_path = _ugm_wpm(request.param, str(tmp_path_factory.mktemp("ugm_wpm")))
    assert (native.backend, pure.backend) == ("native", "pure")
    return native, pure, get_oracle(gguf_path)


def _three_way(native: Tokenizer, pure: Tokenizer, oracle, text: str) -> list:
    """The (text, flags, native, pure, llama.cpp) rows where a backend differs from llama.cpp."""
    bad = []
    for add, parse in ((False, False), (True, True)):
        want = oracle.tokenize(text, add, parse)
        got = [t.encode(text, add_special=add, parse_special=parse) for t in (native, pure)]
        if got != [want, want]:
            bad.append((text, add, parse, *got, want))
    return bad


def test_control_combining_match_llamacpp(ugm_wpm):
    """Control characters between letters and combining marks, on every Unigram and WordPiece vocab:
    both backends give llama.cpp's ids (pure once joined "d", U+0016, U+032D into one key)."""
    native, pure, oracle = ugm_wpm
    bad = [row for t in CTRL_MARKS_TEXTS for row in _three_way(native, pure, oracle, t)]
    assert not bad, f"{len(bad)} differ from llama.cpp, first: {bad[:3]}"


@PROPERTY
@given(text=_CTRL_MARKS)
def test_control_combining_hypothesis(ugm_wpm, text):
    native, pure, oracle = ugm_wpm
    assert not _three_way(native, pure, oracle, text)


@pytest.mark.slow
def test_wordpiece_table_is_the_pure_normaliser():
    """The core's per-code-point table (wpm.norm_table) says, for every code point and every option pair, what
    the pure path's _NormTable makes of it: a space, dropped, a word of its own, or kept as which code point."""
    from minillama.tokenizer.encoders.wpm import _NormTable, norm_table
    for lowercase in (True, False):
        for strip_accents in (True, False):
            table, pure = norm_table(lowercase, strip_accents).tolist(), _NormTable(lowercase, strip_accents)
            bad = []
            for cp, e in enumerate(table):
                v = pure.normalise(cp)
                want = (1, 0) if v == " " else (2, 0) if v == "" else (3, ord(v[1])) if len(v) == 3 else (0, ord(v))
                if want != (e >> 21, e & 0x1FFFFF if e >> 21 in (0, 3) else 0):
                    bad.append(hex(cp))
            assert not bad, f"lowercase={lowercase} strip_accents={strip_accents}: {len(bad)} differ: {bad[:5]}"


_K = Keys.Tokenizer


def _bert(words: list[str], **extra) -> dict:
    """bert metadata: [PAD] [UNK] [CLS] [SEP] [MASK] (control) + words (normal)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [int(TokenType.CONTROL)] * 5 + [int(TokenType.NORMAL)] * len(words)
    return {_K.MODEL: "bert", _K.LIST: specials + words, _K.TOKEN_TYPE: np.array(types, np.int32), _K.UNK_ID: 1,
            _K.BOS_ID: 2, _K.SEP_ID: 3, _K.PAD_ID: 0, _K.MASK_ID: 4, **extra}


_WPM_WORDS = ["▁un", "▁unaff", "aff", "able", "▁a", "ble", "a", "b", "▁x", "▁é", "▁É", "▁Hello", "▁hello", "▁",
              "▁中", "é", "\u2581\u2581", "▁ab", "bc", "▁!", "▁,"]
_WPM_TEXTS = ["unaffable", "unab", "abc", "unz x", "Hello, É é! 中文", "", "   ", "\u2581", "\u2581\u2581 x", "a\x00b",
              "x\ufffd\u200by", "ÉCOLE", "\udcff\udcc3a", "a\ud800b", "\U000e0080", "é" * 3000]


@pytest.mark.parametrize("options", [{}, {"tokenizer.ggml.normalizer.lowercase": False},
                                     {"tokenizer.ggml.normalizer.strip_accents": False},
                                     {"tokenizer.ggml.normalizer.lowercase": False,
                                      "tokenizer.ggml.normalizer.strip_accents": True}])
def test_wordpiece_options_and_edges(options):
    """Hand-made WordPiece vocabs, every normaliser option pair: the same ids (or the same error) on both
    backends, for texts around the edges (greedy failure, unknown words, the U+2581 prefix itself as a token,
    dropped and raw code points)."""
    native, pure = _from_metadata(_bert(_WPM_WORDS, **options))
    for text in _WPM_TEXTS:
        assert _outcome(native, text) == _outcome(pure, text), text[:20]


def test_wordpiece_without_unknown_token():
    """A word no token covers, in a vocab without [UNK]: the same FormatError on both backends."""
    md = _bert(["▁a", "b"])
    del md[_K.UNK_ID]
    md[_K.LIST] = ["[PAD]", "[NOUNK]", *md[_K.LIST][2:]]
    native, pure = _from_metadata(md)
    for text in ["a ab", "a z", "z"]:
        assert _outcome(native, text) == _outcome(pure, text)
    assert _outcome(native, "z")[0] == "FormatError"  # type: ignore[index]


def _t5(tokens: list[str], scores: list[float], types: list[int] | None = None, **extra) -> dict:
    types = types or [int(TokenType.CONTROL)] * 2 + [int(TokenType.NORMAL)] * (len(tokens) - 2)
    return {_K.MODEL: "t5", _K.LIST: tokens, _K.SCORES: np.array(scores, np.float32),
            _K.TOKEN_TYPE: np.array(types, np.int32), _K.EOS_ID: 1, _K.PAD_ID: 0, **extra}


_UGM_TOKENS = ["<pad>", "</s>", "<unk>", "▁a", "b", "▁", "ab", "c", "▁ab", "<user>", "é", "\u2581\u2581", "日本", "日"]
_UGM_SCORES = [0, 0, 0, -1, -2, -3, -1.5, -4, -2.5, 0, -0.5, -6, -1, -2]
_UGM_TYPES = [int(TokenType.CONTROL)] * 2 + [int(TokenType.UNKNOWN)] + [int(TokenType.NORMAL)] * 6 + \
    [int(TokenType.USER_DEFINED)] + [int(TokenType.NORMAL)] * 4
_UGM_TEXTS = ["ab c", "ab z", "zz zz", "  a  b  ", "", " ", "<user>ab<user>", "<use", "日本日本語", "a\udcffb",
              "\udcc3\udca9", "a\ud800", "é\u0301", "x" * 5000, "ab " * 2000]


@pytest.mark.parametrize("options", [{}, {"tokenizer.ggml.add_space_prefix": False},
                                     {"tokenizer.ggml.remove_extra_whitespaces": True},
                                     {"tokenizer.ggml.remove_extra_whitespaces": False,
                                      "tokenizer.ggml.add_space_prefix": True}])
def test_unigram_options_and_edges(options):
    """Hand-made Unigram vocabs (unknown, user-defined and byte-odd texts; the space options): the same ids on
    both backends, including unknown runs merged and raw bytes read as llama.cpp reads them."""
    native, pure = _from_metadata(_t5(_UGM_TOKENS, _UGM_SCORES, _UGM_TYPES, **{_K.UNK_ID: 2, **options}))
    for text in _UGM_TEXTS:
        assert _outcome(native, text) == _outcome(pure, text), text[:20]



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
    """The native SPM word cache holds the bounds Python passes in (encoders/base.py), in bytes and in words."""
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


_SPM_PLAIN = ["", " ", "  a ", "plain ascii text", "caf\u00e9 \u00ff\u00a0x", "\u0100 \u2581x \u2581 ", "日本 語 ",
              "\U0001f600 a\U0001f9ec", "x\udcff y", "\ud800 a", "a" * 3000 + " b" * 100, "\t\n \r"]


@pytest.mark.filterwarnings("ignore::minillama.errors.DoubleBosWarning")
@pytest.mark.parametrize("vocab", SPM_VOCABS)
def test_spm_fast_path_is_encode(vocab):
    """Tokenizer.encode's fast path for SPM (encode_plain: the dummy prefix and U+2581 for spaces written in C from
    the str's 1-, 2- or 4-byte characters) and encode_batch's encode_many give the usual path's ids; so do texts
    with lone surrogates (handed back to it) and empty ones."""
    native, pure = pair(vocab)
    assert native._plain is not None
    for t in _SPM_PLAIN:
        assert native.encode(t, add_special=False) == pure.encode(t, add_special=False), t[:20]
        assert native.encode(t) == pure.encode(t), t[:20]
    assert native._encoder.encode_plain("x\udcff y") is None
    for threads in (1, 2):
        assert native.encode_batch(_SPM_PLAIN, num_threads=threads, add_special=False) == \
            [pure.encode(t, add_special=False) for t in _SPM_PLAIN]


@pytest.mark.parametrize("vocab", VOCABS)
def test_native_decode_is_the_pure_join(vocab):
    """decode through the core's Pieces.join gives the pure table's bytes for any ids (control, byte and unknown
    tokens among them) with every flag; items that are not int ids still raise the pure path's errors."""
    native, pure = pair(vocab)
    assert native.pieces._native is not None and pure.pieces._native is None
    n, v = native.n_vocab, native.vocab
    rng = np.random.default_rng(7)
    special = [i for i in (v.special.get("bos"), v.special.get("eos"), v.special.get("unk")) if i is not None]
    runs = [[], [0], special, special[::-1], [*special, 5, *special]]
    runs += [[int(x) for x in rng.integers(0, n, size)] + special[:k] for size, k in ((1, 0), (50, 1), (5000, 2))]
    runs += [special[:1] + [int(x) for x in rng.integers(0, n, 300)] for _ in range(3)]
    for ids in runs:
        for remove_special in (False, True):
            for unparse_special in (False, True):
                got = native.decode_bytes(ids, remove_special, unparse_special)
                assert got == pure.decode_bytes(ids, remove_special, unparse_special), ids[:5]
                assert got == native.decode_bytes(np.array(ids, np.int64), remove_special, unparse_special)
    for bad in ([1, n], [1, -1], [1, 2**70], [1, "2"], [1, 2.0]):
        with pytest.raises(Exception) as want:
            pure.decode_bytes(bad)
        with pytest.raises(want.type, match=str(bad[1]) if isinstance(bad[1], int) else None):
            native.decode_bytes(bad)
    assert native.decode_bytes([True, 1]) == pure.decode_bytes([True, 1])
