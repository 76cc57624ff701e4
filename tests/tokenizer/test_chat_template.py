"""Tokenizer.apply_chat_template against Hugging Face transformers' rendering.

tests/data/chat_templates.json holds chat templates (from the SmolLM2 and phi-3 GGUFs, plus hand-written ones
that use tools, namespace(), tojson, extra keyword arguments and raise_exception) and what transformers'
apply_chat_template renders for a set of conversations; tools/make_chat_template_data.py writes it (transformers
is needed only there). The Gemma 3 GGUF at hand (gemma-3-270m, a base model) carries no template.
Its "apply_chat_template" section holds what transformers' own apply_chat_template returns (its defaults,
return_dict=False, continue_final_message, truncation, padded batches) on the llama 3 tokenizer.json, and its
signature: Tokenizer.apply_chat_template must take the same parameters with the same defaults.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re

import numpy as np
import pytest
from support import DATA
from support.paths import require_shared, vocab_path

from minillama.chat_template import ChatTemplate
from minillama.errors import ArgumentError, ChatTemplateRefused, MinillamaError, UnsupportedError
from minillama.tokenizer import BatchEncoding, Tokenizer, default_vocab_path

DATA = json.loads((DATA / "chat_templates.json").read_text(encoding="utf-8"))
TEMPLATES = {t["name"]: t for t in DATA["templates"]}
CALLS = DATA["apply_chat_template"]


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
        kwargs = case["kwargs"]  # those the template never reads too: transformers passes them all
        got = tok.apply_chat_template(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                                      tools=case["tools"], tokenize=False, **kwargs)
        assert got == case["expected"]
        ids = tok.apply_chat_template(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                                      return_dict=False, tools=case["tools"], **kwargs)
        # transformers tokenizes the rendered text with add_special_tokens=False: the template's own bos only
        assert ids == tok.encode(case["expected"], add_special=False, parse_special=True)


def test_phi3_apply_chat_template():
    entry = TEMPLATES["ggml-vocab-phi-3.gguf"]
    tok = Tokenizer.from_file(vocab_path("ggml-vocab-phi-3"))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], return_dict=False)[:2] == \
        [tok.bos_id, tok.token_to_id("<|user|>")]  # the template's own {{ bos_token }}
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
    assert tok.apply_chat_template([{"role": "user", "content": " x "}], chat_template=refuse, tokenize=False,
                                   add_generation_prompt=True) == "<user>x</user>\n<assistant>"
    with pytest.raises(ArgumentError, match="empty conversation"):
        tok.apply_chat_template([], chat_template=refuse)


def test_signature_and_defaults_match_transformers():
    """The parameters of transformers' apply_chat_template, in its order, with its defaults (tokenize=True,
    add_generation_prompt=False, return_dict=True), then **kwargs for the template's variables."""
    params = list(inspect.signature(Tokenizer.apply_chat_template).parameters.values())[1:]
    assert [[p.name, None if p.default is p.empty else p.default] for p in params[:-1]] == CALLS["signature"]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD


@functools.lru_cache(maxsize=1)
def _llama3_for_calls() -> Tokenizer:
    tok = Tokenizer.from_file(require_shared("vocab", CALLS["tokenizer_json"]))
    sp = CALLS["special_tokens"]
    assert (tok.id_to_token(tok.bos_id), tok.id_to_token(tok.eos_id)) == (sp["bos_token"], sp["eos_token"])
    tok.pad_id = tok.token_to_id(sp["pad_token"])
    return tok


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c['template']}-{c['messages']}-{k}")
                                  for k, c in enumerate(CALLS["cases"])])
def test_calls_match_transformers(case):
    """Each stored transformers call replayed: the same text, ids, BatchEncoding or numpy arrays. Among them
    the issue's case: SmolLM2's template on the llama 3 vocab gives no bos at all (transformers tokenizes with
    add_special_tokens=False), where minillama added one."""
    tok = _llama3_for_calls()
    convs = CALLS["conversations"]
    messages = convs if case["messages"] == "all" else convs[case["messages"]]
    call = lambda: tok.apply_chat_template(messages, chat_template=TEMPLATES[case["template"]]["source"],  # noqa: E731
                                           **case["call"])
    if "error" in case:
        with pytest.raises(ChatTemplateRefused, match=re.escape(case["error"])):
            call()
        return
    got = call()
    if "dict" in case:
        assert isinstance(got, BatchEncoding) and list(got) == list(case["dict"])
        assert got.input_ids is got["input_ids"]
        if case["np"]:
            assert all(isinstance(v, np.ndarray) and v.dtype == np.int64 for v in got.values())
            got = {k: v.tolist() for k, v in got.items()}
        assert dict(got) == case["dict"]
    else:
        assert got == case["value"]
        if isinstance(got, list) and got and isinstance(got[0], int):
            assert got[0] != tok.bos_id or "bos_token" in TEMPLATES[case["template"]]["source"]


def test_keywords_and_unsupported_options():
    """Extra keywords are template variables (transformers refuses none, so a misspelt one is passed on unread
    too); the options minillama does not implement are errors naming them."""
    tok = Tokenizer.from_file(default_vocab_path())
    tmpl = TEMPLATES["tools-and-namespace"]["source"]
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=False, add_generation_promt=True) == \
        tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=False)
    assert tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=False, custom_flag=1).endswith("(custom=1)")
    with pytest.raises(UnsupportedError, match="sanitize_control_tokens"):
        tok.apply_chat_template(msgs, chat_template=tmpl, sanitize_control_tokens=True)
    with pytest.raises(ArgumentError, match="exclude each other"):
        tok.apply_chat_template(msgs, chat_template=tmpl, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(UnsupportedError, match="return_tensors='pt'"):
        tok.apply_chat_template(msgs, chat_template=tmpl, return_tensors="pt")




def test_extra_keywords_reach_the_template_as_transformers_passes_them():
    """apply_chat_template(..., enable_thinking=False): a template variable, read or not (transformers passes
    **kwargs to the template; it refuses none)."""
    tok = Tokenizer.from_file(default_vocab_path())
    source = ("{% for m in messages %}{{ m.content }}{% endfor %}"
              "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs, chat_template=source, tokenize=False, enable_thinking=False) == \
        "Hi<think></think>"
    assert tok.apply_chat_template(msgs, chat_template=source, tokenize=False, enable_thinking=True) == "Hi"
    assert tok.apply_chat_template(msgs, chat_template="{{ messages[0].content }}", tokenize=False,
                                   enable_thinking=False, some_unread_flag=1) == "Hi"
