"""The streaming decoder: push(id) text concatenated with flush() equals decode(ids), and text comes out
as soon as it is complete. The reference is llama.cpp's detokenize (conformance detok_hex) through
Tokenizer.decode, which the conformance tests check against llama.cpp."""

from __future__ import annotations

import random

import pytest
from support.paths import load, params_or_skip
from support.reference import conformance_vocabs, read_conformance

from minillama.tokenizer import Tokenizer, default_vocab_path


def _stream(tok: Tokenizer, ids: list[int], skip_special: bool = True) -> tuple[str, list[str]]:
    d = tok.stream_decoder(skip_special_tokens=skip_special)
    parts = [d.push(i) for i in ids]
    parts.append(d.flush())
    return "".join(parts), parts


@pytest.mark.parametrize("vocab", params_or_skip(conformance_vocabs(), "conformance vocabs"))
def test_stream_equals_decode_on_conformance(vocab: str) -> None:
    tok = load(vocab)
    rnd = random.Random(vocab)
    bad = []
    for case in read_conformance(vocab):
        want_text = bytes.fromhex(case["detok_hex"]).decode("utf-8", "replace")  # llama.cpp's own bytes
        got, _ = _stream(tok, case["ids"])
        if got != want_text:
            bad.append((case["text"][:40], got[:60], want_text[:60]))
        for ids in (case["ids_special"], [rnd.randrange(tok.n_vocab) for _ in range(24)]):
            for skip in (True, False):
                got, _ = _stream(tok, ids, skip)
                if got != tok.decode(ids, unparse_special=not skip):
                    bad.append((ids[:8], skip, got[:60]))
    assert not bad, bad[:5]


@pytest.mark.parametrize("vocab", ["ggml-vocab-gpt-2", "ggml-vocab-llama-bpe"])
def test_stream_clean_spaces_patterns(vocab: str) -> None:
    """Random sequences of the pieces llama.cpp's space clean-up rewrites (' ?', " ' ", " 're" ...)."""
    tok = load(vocab)
    pieces = [" ", "'", " '", "s", "m", "re", "ve", "t", "?", "!", ".", ",", " .", "r", "e", "a", " a"]
    ids = [tok.encode(p, add_special=False) for p in pieces]
    ids = [i[0] for i in ids if len(i) == 1]
    rnd = random.Random(7)
    for _ in range(3000):
        seq = [rnd.choice(ids) for _ in range(rnd.randrange(1, 12))]
        got, _ = _stream(tok, seq)
        assert got == tok.decode(seq), seq


def test_split_character_is_held_until_complete() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    text = "llama 🦙 and 日本"
    ids = tok.encode(text, add_special=False)
    got, parts = _stream(tok, ids)
    assert got == text
    assert "\ufffd" not in "".join(parts)
    # every emitted part is whole characters, and the emoji's bytes come out at once
    assert any("🦙" in p for p in parts)


def test_invalid_bytes_become_replacement_characters() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    lead = next(i for i in range(tok.n_vocab) if tok.token_to_piece(i) == b"\xc3")  # a lone UTF-8 lead byte
    lone = [lead]
    seq = [lead, *tok.encode("x", add_special=False)]  # ... that never completes
    d = tok.stream_decoder()
    out = [d.push(i) for i in seq]
    assert out[-1] == "\ufffdx"
    assert d.flush() == ""
    d = tok.stream_decoder()
    assert d.push(lone[0]) == "" and d.flush() == "\ufffd"


def test_out_of_range_id() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    with pytest.raises(ValueError, match=str(tok.n_vocab)):
        tok.stream_decoder().push(tok.n_vocab)
