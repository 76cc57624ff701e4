"""WordPiece and Unigram tokenizer.json files load, and tokenize as their GGUF twins and as HF tokenizers.

The tokenizer.json files are made here from shared material with Hugging Face tokenizers (nothing from ../shared is
copied into the repository):
* WordPiece: an HF BERT tokenizer (BertNormalizer, BertPreTokenizer, WordPiece, BertProcessing) holding the vocab of
  ggml-vocab-bert-bge.gguf, its U+2581 phantom prefixes turned back into '##' marks;
* Unigram: spm-unigram8k.model as transformers' SpmConverter + T5Converter write it (pieces and scores, Precompiled
  charsmap, Strip, Replace(' {2,}'), Metaspace, '$A </s>'), checked once against transformers' own output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import Keys
from support.fixtures import hf_bert_from_gguf, unigram_json
from support.paths import load, require_shared, vocab_path
from support.reference import read_conformance

from minillama.errors import UnsupportedError
from minillama.tokenizer import Tokenizer
from minillama.tokenizer.formats import read_metadata

K = Keys.Tokenizer


@pytest.fixture(scope="module")
def bert_json(tmp_path_factory):
    tok = load("ggml-vocab-bert-bge")
    hf = hf_bert_from_gguf(tok)
    path = tmp_path_factory.mktemp("bert") / "tokenizer.json"
    hf.save(str(path))
    return hf, path


@pytest.fixture(scope="module")
def t5_json(tmp_path_factory):
    hf = unigram_json(str(require_shared("vocab", "spm-unigram8k.model")))
    path = tmp_path_factory.mktemp("t5") / "tokenizer.json"
    hf.save(str(path))
    return hf, path


def _same_metadata(a: dict, b: dict, keys) -> None:
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            assert np.array_equal(np.asarray(va), np.asarray(vb)), k
        else:
            assert va == vb, k


def test_wordpiece_json_is_its_gguf_twin(bert_json):
    hf, path = bert_json
    md, twin = read_metadata(path), read_metadata(vocab_path("ggml-vocab-bert-bge"))
    assert md[K.MODEL] == "bert"
    _same_metadata(md, twin, [K.LIST, K.TOKEN_TYPE, K.UNK_ID, K.SEP_ID, K.PAD_ID, K.MASK_ID])
    tok, gguf_tok = Tokenizer.from_file(path), load("ggml-vocab-bert-bge")
    assert (tok.bos_id, tok.vocab.special["sep"]) == (gguf_tok.bos_id, gguf_tok.vocab.special["sep"])
    rows = read_conformance("ggml-vocab-bert-bge")
    agree = 0
    for r in rows:
        t = r["text"]
        assert tok.encode(t, add_special=False) == r["ids"]  # llama.cpp's own ids, as the GGUF gives
        assert tok.encode(t, parse_special=True) == gguf_tok.encode(t, parse_special=True)
        ids = tok.encode(t)
        if ids == hf.encode(t).ids:
            agree += 1
    assert agree >= 0.5 * len(rows)  # HF and llama.cpp differ on marks, Hangul, some whitespace (test_wpm.py)


def test_unigram_json_is_its_gguf_twin(t5_json):
    hf, path = t5_json
    md, twin = read_metadata(path), read_metadata(vocab_path("ggml-vocab-unigram8k"))
    assert md[K.MODEL] == "t5"
    _same_metadata(md, twin, [K.LIST, K.SCORES, K.TOKEN_TYPE, K.PRECOMPILED_CHARSMAP, K.ADD_PREFIX, K.REMOVE_EXTRA_WS,
                              K.UNK_ID, K.BOS_ID, K.EOS_ID, K.ADD_BOS, K.ADD_EOS])
    tok = Tokenizer.from_file(path)
    rows = read_conformance("ggml-vocab-unigram8k")
    agree = 0
    for r in rows:
        t = r["text"]
        assert tok.encode(t, add_special=False) == r["ids"]  # llama.cpp's own ids
        assert tok.encode(t, parse_special=True) == r["ids_special"]
        if tok.encode(t) == hf.encode(t).ids:
            agree += 1
    assert agree >= 0.5 * len(rows), f"HF agrees with llama.cpp on {agree}/{len(rows)} texts"


def test_other_models_still_refused(tmp_path):
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps({"model": {"type": "WordLevel", "vocab": {"a": 0}}}))
    with pytest.raises(UnsupportedError, match="'WordLevel'.*WordPiece.*Unigram"):
        Tokenizer.from_file(p)


@pytest.mark.parametrize("model, expected", [
    ({"type": "Unigram", "vocab": [["a", "x"]]}, "expected a \\[piece, score\\] pair"),
    ({"type": "Unigram", "vocab": {"a": 0}}, "expected list"),
    ({"type": "Unigram", "vocab": []}, "empty"),
    ({"type": "WordPiece", "vocab": {"a": 0, "b": 5}}, "without gaps"),
    ({"type": "WordPiece", "vocab": {"a": 0, "b": 10 ** 15}}, "without gaps"),
    ({"type": "WordPiece", "vocab": {"a": -1, "b": 0, "c": 2}}, "without gaps"),  # a KeyError once
    ({"type": "WordPiece", "vocab": {"a": "0"}}, "expected int"),
    ({"type": "WordPiece", "vocab": []}, "expected dict"),
])
def test_hostile_wordpiece_unigram_json(tmp_path, model, expected):
    from minillama.errors import FormatError

    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps({"model": model}))
    with pytest.raises(FormatError, match=expected):
        Tokenizer.from_file(p)


def test_hostile_unigram_charsmap(tmp_path):
    from minillama.errors import MinillamaError

    p = tmp_path / "tokenizer.json"
    vocab = [["<unk>", 0.0], ["a", -1.0], ["\u2581", -2.0]]
    norm = {"type": "Precompiled", "precompiled_charsmap": "not base64!"}
    p.write_text(json.dumps({"model": {"type": "Unigram", "unk_id": 0, "vocab": vocab}, "normalizer": norm}))
    with pytest.raises(MinillamaError, match="base64"):
        Tokenizer.from_file(p)
    norm["precompiled_charsmap"] = "AAAA/////w=="  # decodes, but no charsmap a tokenizer wrote
    p.write_text(json.dumps({"model": {"type": "Unigram", "unk_id": 0, "vocab": vocab}, "normalizer": norm}))
    with pytest.raises(MinillamaError):
        Tokenizer.from_file(p).encode("a a")


@pytest.mark.parametrize("which, vocab", [("bert_json", "ggml-vocab-bert-bge"), ("t5_json", "ggml-vocab-unigram8k")])
def test_converted_json_is_read_by_llamacpp(which, vocab, request, tmp_path):
    """`minillama convert tokenizer.json out.gguf`: llama.cpp itself gives the conformance ids on the result."""
    from support.oracle import get_oracle

    from minillama.gguffile.writer import write_vocab_gguf

    _, path = request.getfixturevalue(which)
    out = tmp_path / "converted.gguf"
    write_vocab_gguf(read_metadata(path), out)
    oracle = get_oracle(out)
    rows = read_conformance(vocab)[::3]
    bad = [r["text"][:40] for r in rows if oracle.tokenize(r["text"], False, False) != r["ids"]]
    assert not bad, f"llama.cpp differs on {len(bad)}/{len(rows)} texts, e.g. {bad[:3]}"
