"""minillama against llama.cpp on vocabs derived from the shared ones (tests/derived_vocabs.py): special
tokens that are not whole UTF-8 (they match inside a character, as llama.cpp matches bytes) and the
tiny_aya / cohere2moe digit splitter. Expected ids: tests/data/derived_expected.json, made by llama.cpp
(tools/make_derived_expected.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import DATA
from support.derived_vocabs import RECIPES
from support.paths import require_shared

from minillama.tokenizer import Tokenizer

EXPECTED = json.loads((DATA / "derived_expected.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("derived")


def test_every_recipe_has_expected_ids() -> None:
    assert set(EXPECTED) == set(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_derived_vocab_matches_llamacpp(name: str, vocab_dir: Path) -> None:
    from support.derived_vocabs import build
    tok = Tokenizer.from_file(build(name, require_shared("vocab"), vocab_dir))
    bad = []
    for case in EXPECTED[name]:
        text = bytes.fromhex(case["hex"]).decode("utf-8", "surrogateescape")
        got = tok.encode(text, add_special=False, parse_special=False)
        got_special = tok.encode(text, add_special=True, parse_special=True)
        if got != case["ids"] or got_special != case["ids_special"]:
            bad.append((text, case["ids"], got, case["ids_special"], got_special))
    assert not bad, f"{len(bad)} of {len(EXPECTED[name])} differ from llama.cpp, first: {bad[:3]}"
