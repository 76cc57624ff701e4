"""minillama.toolcalls: tool calls and reasoning in chat replies, as llama.cpp's server handles them.

    fam = detect(template_source)                  # "hermes", "llama3", "mistral", "qwen3_coder", "deepseek_r1",
                                                   # "gpt_oss", or "generic" for a template without tool support
    plan = Plan.make(fam, tools, tool_choice, parallel_tool_calls, reasoning_format)
    messages = plan.messages(messages)             # histories with calls and tool results, polyfilled if needed
    parsed = plan.parse(reply_text)                # Parsed(content, reasoning_content, tool_calls)

Each family's format is one module (its parse, the markers that start a call); a call that does not parse (or
names a function not in tools) is left in content, never dropped. plan.constraint_grammar() is the Lark grammar
(llguidance) that makes the reply a call when tool_choice is "required" or names a function (and the whole reply
the generic JSON for a template without tool support), with the arguments following each function's schema.
Reasoning (<think>...</think>, the prompt possibly ending inside <think>) goes to reasoning_content unless
reasoning_format is "none".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError
from . import deepseek_r1, generic, gpt_oss, hermes, llama3, mistral, qwen3_coder
from .base import Parsed, ToolCall, held_back, new_call_id, schema_json

__all__ = ["FAMILIES", "REASONING_FORMATS", "Parsed", "Plan", "ToolCall", "detect", "new_call_id", "opened_thinking", "split_reasoning", "thinks"]

FAMILIES: dict[str, ModuleType] = {"generic": generic, "hermes": hermes, "llama3": llama3, "mistral": mistral,
                                   "qwen3_coder": qwen3_coder, "deepseek_r1": deepseek_r1, "gpt_oss": gpt_oss}
#: llama.cpp's --reasoning-format choices ("auto": as deepseek, thinking to reasoning_content).
REASONING_FORMATS = ("none", "deepseek", "auto")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def detect(source: str | None) -> str:
    """The tool-call family a chat template speaks, from the markers its text holds (as llama.cpp tells them
    apart); "generic" when it has none of them (no tool support of its own)."""
    s = source or ""
    if "<|channel|>" in s:
        return "gpt_oss"
    if deepseek_r1.BEGIN in s:
        return "deepseek_r1"
    if "<function=" in s and "<parameter=" in s:
        return "qwen3_coder"
    if "<tool_call>" in s:
        return "hermes"
    if "[TOOL_CALLS]" in s:
        return "mistral"
    if "<|start_header_id|>" in s and ("<|python_tag|>" in s or "ipython" in s) and "tools" in s:
        return "llama3"
    return "generic"


def thinks(source: str | None) -> bool:
    """Whether a chat template writes thinking (<think> or a message's reasoning_content): only then is a
    reply's <think> block split off, as llama.cpp does."""
    s = source or ""
    return THINK_OPEN in s or "reasoning_content" in s or "<|channel|>" in s


def opened_thinking(prompt_tail: str) -> str:
    """The text that opens thinking at the end of a prompt ("<think>\n" when the template makes the reply start
    inside a thinking block, as DeepSeek R1's does), or ""."""
    i = prompt_tail.rfind(THINK_OPEN)
    return prompt_tail[i:] if i >= 0 and not prompt_tail[i:].strip()[len(THINK_OPEN):] else ""


def split_reasoning(text: str, reasoning_format: str, think_open: str = "") -> tuple[str, str]:
    """(reasoning, rest) of a reply, as llama.cpp splits it: what stands between <think> (or the start, when the
    prompt opened thinking: think_open is that text) and </think>, without its leading blanks; the rest without
    its leading blanks. Without </think>, a reply that opened thinking is all reasoning. "none": no split, and
    the prompt's opening text stays in front of the reply (llama.cpp's content then starts with it)."""
    if reasoning_format == "none":
        return "", think_open + text
    body = text.lstrip()
    opened = bool(think_open)
    if body.startswith(THINK_OPEN):
        body, opened = body[len(THINK_OPEN):], True
    if not opened:
        return "", text
    end = body.find(THINK_CLOSE)
    if end < 0:
        return body.lstrip(), ""
    return body[:end].lstrip(), body[end + len(THINK_CLOSE):].lstrip()


def _tools_by_name(tools: Any) -> dict[str, dict[str, Any]]:
    """tools checked (OpenAI's [{"type": "function", "function": {"name", "parameters"?, ...}}]): name -> schema."""
    if not isinstance(tools, Sequence) or isinstance(tools, str | bytes):
        raise ArgumentTypeError(f"expected tools as a list of {{'type': 'function', 'function': {{...}}}}, found "
                                f"{type(tools).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(t.get("function"), Mapping):
            raise ArgumentError(f"expected {where} to be {{'type': 'function', 'function': {{'name': ..., "
                                f"'parameters': ...}}}}, found {json.dumps(t, default=str)[:80]}")
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"expected {where}.function.name to be a non-empty string, found {name!r:.60}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ArgumentError(f"expected {where}.function.parameters to be a JSON schema object, found "
                                f"{type(params).__name__}")
        if name in out:
            raise ArgumentError(f"expected tools with different names, found {name!r} twice")
        out[name] = dict(params)
    return out


def _chosen(tool_choice: Any, names: Mapping[str, Any]) -> tuple[str, str | None]:
    """("auto" | "none" | "required", the one function named or None)."""
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ArgumentError(f"expected tool_choice 'auto', 'none', 'required' or {{'type': 'function', "
                                f"'function': {{'name': ...}}}}, found {tool_choice!r:.60}")
        if tool_choice == "auto" and not names:
            return "none", None
        if tool_choice == "required" and not names:
            raise ArgumentError("tool_choice 'required' needs tools, found none")
        return tool_choice, None
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ArgumentError("expected tool_choice 'auto', 'none', 'required' or {'type': 'function', 'function': "
                            f"{{'name': ...}}}}, found {json.dumps(tool_choice, default=str)[:80]}")
    if name not in names:
        raise ArgumentError(f"tool_choice names the function {name!r:.60}, which is not in tools "
                            f"({', '.join(names) or 'none given'})")
    return "required", name


def _call_schema(names: Mapping[str, dict[str, Any]], args_key: str = "arguments") -> dict[str, Any]:
    one = [{"type": "object", "properties": {"name": {"const": n}, args_key: p}, "required": ["name", args_key],
            "additionalProperties": False} for n, p in names.items()]
    return one[0] if len(one) == 1 else {"anyOf": one}


@dataclass
class Plan:
    """One request's tool and reasoning settings, and what they mean for the prompt, the output and the reply."""

    family: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    names: dict[str, dict[str, Any]] = field(default_factory=dict)
    choice: str = "none"
    parallel: bool = False
    reasoning_format: str = "auto"

    @classmethod
    def make(cls, family: str, tools: Any = None, tool_choice: Any = None, parallel_tool_calls: bool | None = None,
             reasoning_format: str | None = None, thinking: bool = True) -> Plan:
        """The plan for a request (ArgumentError for tools, a tool_choice or a reasoning_format it cannot take);
        thinking: the template thinks (else reasoning is never split off). parallel_tool_calls defaults to False,
        as in llama.cpp's server: the constrained reply is then one call (a free reply's calls all parse)."""
        fmt = "auto" if reasoning_format is None else reasoning_format
        if fmt not in REASONING_FORMATS:
            raise ArgumentError(f"expected reasoning_format {', '.join(map(repr, REASONING_FORMATS))}, found "
                                f"{fmt!r:.60}")
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise ArgumentTypeError(f"expected parallel_tool_calls as a bool, found {parallel_tool_calls!r:.60}")
        names = _tools_by_name(tools) if tools is not None else {}
        choice, only = _chosen(tool_choice, names)
        if only is not None:
            names = {only: names[only]}
        if choice == "none":
            names = {}
        return cls(family, [t for t in (tools or []) if t["function"]["name"] in names], names, choice,
                   bool(parallel_tool_calls), fmt if thinking else "none")

    @property
    def module(self) -> ModuleType:
        return FAMILIES[self.family]

    @property
    def active(self) -> bool:
        """Tool calls are looked for in the reply."""
        return bool(self.names)

    def reply_schema(self) -> dict[str, Any]:
        """The generic format's JSON schema of the reply."""
        return generic.schema(_call_schema(self.names), self.parallel, self.choice == "required")

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """messages for the template: calls' arguments as objects (what templates expect), and for a template
        without tool support the generic polyfill."""
        if self.family == "generic":
            return generic.polyfill(messages, self.tools, self.reply_schema() if self.tools else {})
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments":
                                                      generic._object(c["function"].get("arguments"))}}
                                   for c in m["tool_calls"]]
            out.append(m)
        return out

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the template is given (none for the generic format: they are in the system message)."""
        return None if self.family == "generic" or not self.tools else self.tools

    def constraint_grammar(self) -> str | None:
        """The Lark grammar the reply must follow, or None (free text)."""
        if not self.active:
            return None
        if self.family == "generic":
            return f"start: %json{schema_json(self.reply_schema())}\n"
        if self.choice != "required" or not hasattr(self.module, "grammar"):
            return None
        key = "parameters" if self.family == "llama3" else "arguments"
        return self.module.grammar(schema_json(_call_schema(self.names, key)), self.parallel)

    def lazy_triggers(self) -> dict[str, str]:
        """Under "auto": trigger -> the Lark grammar of the call that follows it (see lazy.LazyConstraint)."""
        if not self.active or self.choice != "auto" or self.family == "generic":
            return {}
        from .lazy import triggers

        key = "parameters" if self.family == "llama3" else "arguments"
        return triggers(self.family, schema_json(_call_schema(self.names, key)), self.parallel, self.names)

    def parse(self, text: str, think_open: str = "") -> Parsed:
        """The reply split into reasoning, content and calls."""
        if self.family == "gpt_oss":  # channels, not <think>
            if self.reasoning_format == "none":
                return Parsed(gpt_oss.unsplit(text))
            return gpt_oss.parse_reply(text, self.names) or Parsed(text)
        reasoning, rest = split_reasoning(text, self.reasoning_format, think_open)
        if not self.active:
            return Parsed(rest, reasoning)
        got = self.module.parse(rest, self.names)
        if got is None:  # a call that does not parse stays in the content
            return Parsed(rest, reasoning)
        content, calls = got
        return Parsed(content, reasoning, calls)


class StreamSplitter:
    """A streamed reply split as it comes: feed(text so far) gives the new reasoning and content to send (content
    that may start a call is held back), finish(text) the rest and the calls."""

    def __init__(self, plan: Plan, think_open: str = "") -> None:
        self.plan, self.think_open = plan, think_open
        self.reasoning = self.content = ""

    def _deltas(self, reasoning: str, content: str) -> list[dict[str, Any]]:
        out = []
        if reasoning.startswith(self.reasoning) and len(reasoning) > len(self.reasoning):
            out.append({"reasoning_content": reasoning[len(self.reasoning):]})
            self.reasoning = reasoning
        if content.startswith(self.content) and len(content) > len(self.content):
            out.append({"content": content[len(self.content):]})
            self.content = content
        return out

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas to send now for the reply so far."""
        fmt = self.plan.reasoning_format
        if self.plan.family == "gpt_oss":
            return []  # Harmony's channels: the reply is split once it is whole
        body = text.lstrip()
        if fmt != "none" and not self.think_open and THINK_OPEN.startswith(body):
            return []  # may be the start of <think>
        reasoning, rest = split_reasoning(text, fmt, self.think_open)
        if fmt != "none" and (self.think_open or body.startswith(THINK_OPEN)) and THINK_CLOSE not in text:
            return self._deltas(reasoning[:held_back(reasoning, (THINK_CLOSE,))], "")
        if self.plan.active:
            if self.plan.family == "generic":
                return self._deltas(reasoning, "")  # one JSON object: its response comes at the end
            rest = rest[:held_back(rest, self.plan.module.MARKERS)]
        return self._deltas(reasoning, rest)

    def finish(self, text: str) -> tuple[list[dict[str, Any]], Parsed]:
        """The last deltas (calls included, with their index) and the whole reply parsed."""
        parsed = self.plan.parse(text, self.think_open)
        out = self._deltas(parsed.reasoning_content, parsed.content)
        if parsed.tool_calls:
            out.append({"tool_calls": [c.to_openai(i) for i, c in enumerate(parsed.tool_calls)]})
        return out, parsed
