"""Huge single inputs: a fragment longer than CHUNK_CHARS is encoded a piece at a time.

The pieces must not change a single id. With CHUNK_CHARS forced tiny, texts crafted so that cuts
fall everywhere (runs of spaces before newlines, lines starting with a space, digits, punctuation,
unknown characters on both sides of a cut, a long run of one letter) must encode exactly as with no
chunking, for every tokenizer kind; where the llama.cpp oracle is installed, exactly as llama.cpp does.
A subprocess under RLIMIT_AS shows that a few-MB encode stays under a memory bound.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from support.oracle import get_oracle
from support.paths import SHARED, load, require_shared, vocab_path

from minillama.tokenizer.encoders import base

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")

# one vocab per tokenizer kind, and BPE pre-tokenizers of different shapes (several patterns, digit groups)
VOCABS = ["ggml-vocab-llama-spm", "ggml-vocab-llama-bpe", "ggml-vocab-gpt-2", "ggml-vocab-deepseek-coder",
          "ggml-vocab-falcon", "ggml-vocab-bert-bge", "ggml-vocab-unigram8k"]

_LINES = ["Hello world.  \n", "  \n", "\n\n", " indented line\n", "x\n", "12345678 9\n", "!!?\n", "\t tab\n",
          "a" * 150 + "\n", "ZZ\u00e9\u4e2d\u6587\n", "   \n  end", "\u2581\u2581 marker\n", "\U0001f600\U0001f600 \n",
          "don't  WE'LL\r\n", "\u0416\u0416\u0416 \u0416\n", "\u3000\u3000x\n", "\ufffd\ufffd \ufffd\n"]


def _crafted() -> str:
    corpus = ""
    if SHARED is not None and (SHARED / "corpus" / "diverse.txt").is_file():
        corpus = (SHARED / "corpus" / "diverse.txt").read_text(encoding="utf-8")[:6000]
    parts = [_LINES[(7 * i) % len(_LINES)] for i in range(120)]
    return corpus + "".join(parts) + corpus[:2000] + "b" * 400


def _chunked(monkeypatch: pytest.MonkeyPatch, tok, text: str, size: int) -> list[int]:
    tok._encoder.clear_cache()
    monkeypatch.setattr(base, "CHUNK_CHARS", size)
    try:
        return tok.encode(text, add_special=False)
    finally:
        monkeypatch.undo()
        tok._encoder.clear_cache()


@pytest.mark.parametrize("name", VOCABS)
def test_chunked_encode_is_unchunked_encode(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load(name)
    text = _crafted()
    whole = tok.encode(text, add_special=False)
    for size in (64, 97, 300):  # the BPE margin (4096) reaches past small pieces: cuts land everywhere
        assert _chunked(monkeypatch, tok, text, size) == whole, (name, size)
    # and the pieces really were cut (the test would prove nothing if every text stayed whole)
    monkeypatch.setattr(base, "CHUNK_CHARS", 64)
    encoder = tok._encoder
    prepared = encoder.prepare(text, True)
    if name == "ggml-vocab-falcon":  # its first pattern (punctuation runs) never ends at a newline: no cut
        assert len(list(encoder.word_chunks(prepared))) == 1
    elif hasattr(encoder, "_cut_at"):
        s = encoder._whitespace(encoder._normalize_chars(prepared), "\u2581")
        assert len(list(base.pieces(s, encoder._cut_at))) > 10
    else:
        assert len(list(encoder.word_chunks(prepared))) > 10
    monkeypatch.undo()


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm", "ggml-vocab-llama-bpe", "ggml-vocab-bert-bge",
                                  "ggml-vocab-unigram8k"])
def test_chunked_encode_matches_llamacpp(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = vocab_path(name)
    oracle = get_oracle(path)
    text = _crafted()
    assert _chunked(monkeypatch, load(name), text, 97) == list(oracle.tokenize(text, False, False))


_CHILD = textwrap.dedent("""
    import resource, sys
    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
    base = open(sys.argv[2], encoding="utf-8").read()
    text = (base * (4_000_000 // len(base) + 1))[:4_000_000]
    tok.encode("warm up")
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    mapped = int(status["VmSize"].split()[0]) * 1024  # RLIMIT_AS caps the address space, not the RSS
    limit = mapped + 40 * len(text.encode()) + (64 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    ids = tok.encode(text + "a" * 500_000)
    print(len(ids))
""")


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm", "ggml-vocab-unigram8k"])
def test_huge_encode_under_address_space_limit(name: str) -> None:
    """A 4.5 MB encode (diverse text, then a 500,000-letter run) with the address space capped at what is
    mapped after loading + 40 bytes per input byte + 64 MiB: it must finish, not raise MemoryError.
    (Unigram's list-based Viterbi took ~100 bytes a character on the run; see bench_huge.py for figures.)"""
    corpus = require_shared("corpus", "diverse.txt")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(vocab_path(name)), str(corpus)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) > 500_000


_RUN_CHILD = textwrap.dedent("""
    import resource, sys
    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
    n = int(sys.argv[2])
    text = "a" * n
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    mapped = int(status["VmSize"].split()[0]) * 1024
    limit = mapped + 40 * n + (48 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(len(tok.encode(text)))
""")


@pytest.mark.parametrize("name", ["ggml-vocab-llama-bpe", "ggml-vocab-llama-spm", "ggml-vocab-bert-bge",
                                  "ggml-vocab-unigram8k"])
def test_one_letter_run_under_40_bytes_a_byte(name: str) -> None:
    """One word of 2,000,000 letters (the merge heaps' worst case) encodes with the address space capped at
    what is mapped after loading + 40 bytes per letter + 48 MiB (the bound). The heap of Python ints
    needed 66-75 bytes a letter; the merge queue keeps entries in machine arrays (encoders/merge.py)."""
    out = subprocess.run([sys.executable, "-c", _RUN_CHILD, str(vocab_path(name)), "2000000"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) > 100_000
