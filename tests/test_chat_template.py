"""Tokenizer.apply_chat_template against Hugging Face transformers' rendering.

tests/data/chat_templates.json holds chat templates (from the SmolLM2 and phi-3 GGUFs, plus hand-written ones
that use tools, namespace(), tojson, extra keyword arguments and raise_exception) and what transformers'
apply_chat_template renders for a set of conversations; tools/make_chat_template_data.py writes it (transformers
is needed only there). The Gemma 3 GGUF at hand (gemma-3-270m, a base model) carries no template.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import vocab_path

from minillama.chat_template import ChatTemplate
from minillama.errors import ArgumentError, ChatTemplateRefused, MinillamaError
from minillama.tokenizer import Tokenizer, default_vocab_path

DATA = json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text(encoding="utf-8"))
TEMPLATES = {t["name"]: t for t in DATA["templates"]}


def _cases(entry):
    return [pytest.param(entry, c, id=f"{entry['name']}-{k}") for k, c in enumerate(entry["cases"])]


@pytest.mark.parametrize("entry, case", [p for e in DATA["templates"] for p in _cases(e)])
def test_render_matches_transformers(entry, case):
    sp = entry["special_tokens"]
    tmpl = ChatTemplate(entry["source"], bos_token=sp.get("bos_token", ""), eos_token=sp.get("eos_token", ""),
                        special_tokens=sp)
    args = (case["messages"], case["add_generation_prompt"])
    if "error" in case:
        with pytest.raises(ChatTemplateRefused, match=case["error"]):  # transformers: jinja2.TemplateError
            tmpl.render(*args, tools=case["tools"], **case["kwargs"])
    else:
        assert tmpl.render(*args, tools=case["tools"], **case["kwargs"]) == case["expected"]


def _check_tokenizer(tok: Tokenizer, entry) -> None:
    """apply_chat_template on the GGUF's own template, special tokens taken from its vocab, as transformers."""
    assert tok.vocab.metadata["tokenizer.chat_template"] == entry["source"]
    for case in entry["cases"]:
        if "error" in case:
            continue
        got = tok.apply_chat_template(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                                      tools=case["tools"], **case["kwargs"])
        assert got == case["expected"]
        ids = tok.apply_chat_template(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                                      tokenize=True, tools=case["tools"], **case["kwargs"])
        # transformers tokenizes the rendered text with add_special_tokens=False: the template's own bos only
        want = tok.encode(case["expected"], add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id is not None and want[:1] != [tok.bos_id]:
            want = [tok.bos_id] + want  # a template without bos: the vocab's add_bos still adds one
        assert ids == want
        assert ids[:2] != [tok.bos_id, tok.bos_id]


def test_phi3_apply_chat_template():
    entry = TEMPLATES["ggml-vocab-phi-3.gguf"]
    tok = Tokenizer.from_file(vocab_path("ggml-vocab-phi-3"))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True)[:2] == [tok.bos_id, tok.token_to_id("<|user|>")]
    _check_tokenizer(tok, entry)


def test_real_model_apply_chat_template():
    path = os.environ.get("MINILLAMA_TEST_GGUF")
    if not path or not os.path.isfile(path):
        pytest.skip("MINILLAMA_TEST_GGUF is not set to a model file (SmolLM2-135M-Instruct.Q4_1.gguf)")
    entry = TEMPLATES.get(os.path.basename(path))
    if entry is None:
        pytest.skip(f"no stored transformers rendering for {os.path.basename(path)}")
    _check_tokenizer(Tokenizer.from_file(path), entry)


def test_errors_are_minillama_errors():
    tok = Tokenizer.from_file(default_vocab_path())  # no template
    with pytest.raises(MinillamaError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    refuse = TEMPLATES["raise-on-system"]["source"]
    with pytest.raises(ArgumentError, match="no system role"):
        tok.apply_chat_template([{"role": "system", "content": "x"}], chat_template=refuse)
    with pytest.raises(MinillamaError, match="does not compile"):
        tok.apply_chat_template([], chat_template="{% for %}")
    assert tok.apply_chat_template([{"role": "user", "content": " x "}], chat_template=refuse) == \
        "<user>x</user>\n<assistant>"


