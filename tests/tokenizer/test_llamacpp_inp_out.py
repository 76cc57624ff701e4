"""llama.cpp's own tokenizer test cases (tests/test-tokenizer-0 inputs): shared/vocab/<vocab>.gguf.inp / .out.

Each .inp holds the texts separated by "\\n__ggml_vocab_test__\\n" (and ends with one); each .out line holds the
expected ids for one text, from llama_tokenize(add_special=False, parse_special=False).
"""

from __future__ import annotations

import pytest
from support.paths import load, params_or_skip, release_tokenizers, shared_roots, vocab_path
from support.reference import LLAMACPP_TEST_SEP, read_llamacpp_inp_out
from support.report import fail_if_any


def _inp_out_vocabs() -> list[str]:
    names = []
    for inp in sorted(p for root in shared_roots() for p in (root / "vocab").glob("*.gguf.inp")):
        name = inp.name[: -len(".gguf.inp")]
        if inp.with_suffix(".out").exists():
            names.append(name)
    return names


VOCABS = _inp_out_vocabs()


@pytest.fixture(scope="module", params=params_or_skip(VOCABS, "vocab/*.gguf.inp"))
def vocab(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tok(vocab):
    yield load(vocab)
    release_tokenizers()


def test_split_matches_llamacpp_reader(vocab):
    """Sanity check of the reader: as many texts as id lines, known first/last texts, no separator left over."""
    cases = read_llamacpp_inp_out(vocab_path(vocab))
    texts = [t for t, _ in cases]
    assert len(cases) >= 40  # llama.cpp's test-tokenizer-0 inputs (46 in the shipped files)
    assert texts[0] == "ied 4 ½ months"
    assert texts[2] == "" and cases[2][1] == []  # empty input, empty ids line
    assert texts[-1].endswith("We'Ve a'lL")
    assert not any(LLAMACPP_TEST_SEP.strip() in t for t in texts)


def test_llamacpp_inp_out(vocab, tok):
    cases = read_llamacpp_inp_out(vocab_path(vocab))
    bad = []
    for text, want in cases:
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            bad.append((text, got, want))
    msg = "\n".join(f"  text={t!r}\n    got  {g}\n    want {w}" for t, g, w in bad[:5])
    fail_if_any(bad, f"{vocab}: {len(bad)} of {len(cases)} llama.cpp test cases differ; first ones:\n{msg}")
