"""llama2.c's tokenizer.bin holds the LLaMA 2 vocab (pieces and scores, no token types): loaded by minillama it must
tokenize exactly like llama.cpp does with ggml-vocab-llama-spm.gguf (the same vocab as GGUF).

Expected ids are llama.cpp's, from shared/conformance/ggml-vocab-llama-spm.jsonl.
"""

from __future__ import annotations

import pytest
from support.paths import load, release_tokenizers
from support.reference import read_conformance
from support.report import assert_all_equal, fail_if_any, mismatch_report

SPM_CONFORMANCE = "ggml-vocab-llama-spm"


@pytest.fixture(scope="module")
def tok():
    yield load("llama2c-tokenizer.bin")
    release_tokenizers()


@pytest.fixture(scope="module")
def rows():
    return read_conformance(SPM_CONFORMANCE)


def _report(what, bad, total):
    return mismatch_report(f"llama2c-tokenizer.bin: {what}", bad, total, "llama.cpp (llama-spm.gguf)")


def test_metadata(tok):
    assert tok.n_vocab == 32000
    assert tok.bos_id == 1
    assert tok.eos_id == 2
    assert tok.model == "spm"
    assert tok.is_eog(2)
    assert not tok.is_eog(1)


@pytest.mark.parametrize("add_special", [False, True])
def test_encode_matches_llama_spm(tok, rows, add_special):
    """add_special=False: llama_tokenize(text, False, False); add_special=True: llama_tokenize(text, True, True)."""
    key = "ids_special" if add_special else "ids"
    assert_all_equal(f"llama2c-tokenizer.bin: encode(add_special={add_special}, parse_special={add_special})", rows,
                     lambda r: tok.encode(r["text"], add_special=add_special, parse_special=add_special),
                     lambda r: r[key], "llama.cpp (llama-spm.gguf)", text=lambda r: r["text"])


def test_decode_matches_llama_spm(tok, rows):
    """decode_bytes(ids) == llama_detokenize(ids, False, False) on llama-spm.gguf; decode() is its text."""
    bad = []
    for r in rows:
        want = bytes.fromhex(r["detok_hex"])
        got = tok.decode_bytes(r["ids"])
        if got != want:
            bad.append((r["text"], got, want))
        elif tok.decode(r["ids"]) != want.decode("utf-8", errors="replace"):
            bad.append((r["text"], tok.decode(r["ids"]), want.decode("utf-8", errors="replace")))
    fail_if_any(bad, _report("decode", bad, len(rows)))
