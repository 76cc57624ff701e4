"""Tool calls and reasoning: each family's parser against llama.cpp's own parses of the same texts
(tests/data/toolcalls_llamacpp.json, written by tools/make_toolcall_data.py with llama.cpp's server), streaming
splits against whole ones, and /v1/chat/completions with tools driven by the official openai client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import numpy as np
import pytest
from support import REPO
from support.paths import real_gguf

from minillama.errors import ArgumentError
from minillama.toolcalls import Plan, StreamSplitter, detect, thinks

DATA = json.loads((REPO / "tests" / "data" / "toolcalls_llamacpp.json").read_text(encoding="utf-8"))
TEMPLATES = REPO / "tests" / "data" / "toolcall_templates"
TOOLS = DATA["tools"]
# SmolLM2's template (ChatML, no tool support): the family detect() gives for it
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _source(name: str | None) -> str:
    return CHATML if name is None else (TEMPLATES / name).read_text(encoding="utf-8")


def _llamacpp_parsed_a_partial_call(case: dict) -> bool:
    """llama.cpp parses a prefill as an unfinished reply, so a cut-off call comes back as a call with cut-off
    arguments; a finished reply with such a call is content for minillama (a call that does not parse is never
    dropped, never half-made)."""
    calls = case["llamacpp"].get("tool_calls") or []
    for c in calls:
        try:
            json.loads(c["arguments"])
        except ValueError:
            return True
    return False


def _deviation(kind: str, c: dict) -> str | None:
    """Why minillama's answer differs from llama.cpp's on this case, on purpose (None: it must not)."""
    got = c["llamacpp"]
    if kind == "cases" and c["template"] is None and c["text"].startswith("{"):
        return ("llama.cpp (this version) gives a template without tool support content only; minillama keeps "
                "llama.cpp's generic JSON format for it (tested through the server below)")
    if kind == "cases" and not got.get("error") and got["content"].startswith("<think>\n\n</think>") \
            and not c["text"].startswith("<think>\n\n</think>"):
        return "llama.cpp puts the empty thinking block its template renders for a turn before a prefill"
    if kind == "cases" and c["template"] == "gpt_oss.jinja" and (
            "<|channel|>" in c["text"] or got.get("content", "").startswith("<|channel|>analysis<|message|><|end|>")):
        return ("llama.cpp does not parse a Harmony prefill (it leaves it raw, or puts an empty analysis message "
                "before it); Harmony replies are checked as generated replies below")
    if kind == "reasoning" and not got.get("error") and not c["text"].endswith(got["content"]):
        return "llama.cpp's reply was cut by max_tokens"
    return None


def _cases(kind: str) -> list:
    out = []
    for i, c in enumerate(DATA[kind]):
        marks = []
        if _deviation(kind, c):
            marks = [pytest.mark.skip(reason=_deviation(kind, c))]
        elif kind == "cases" and _llamacpp_parsed_a_partial_call(c):
            marks = [pytest.mark.skip(reason="llama.cpp parsed an unfinished call in a prefill (see docstring)")]
        if kind == "cases" and not c["llamacpp"].get("error") and not c["llamacpp"]["content"] \
                and not c["llamacpp"]["tool_calls"] and c["text"].strip():
            marks = [pytest.mark.skip(reason="llama.cpp drops this text (neither content nor a call); minillama "
                                             "keeps a call it cannot parse as content")]
        out.append(pytest.param(c, id=f"{c['template'] or 'chatml'}-{c['reasoning_format']}-{i}", marks=marks))
    return out


def _expected(case: dict) -> tuple[str, str, list[tuple[str, str]]]:
    got = case["llamacpp"]
    if "error" in got:  # llama.cpp refuses the reply (a 500): minillama answers it as content
        return case["text"], "", []
    return got["content"], got["reasoning_content"], [(c["name"], c["arguments"]) for c in got["tool_calls"]]


@pytest.mark.parametrize("case", _cases("cases"))
def test_parse_equals_llamacpp(case: dict) -> None:
    # a prefill is parsed by llama.cpp without splitting thinking: tool calls only here (reasoning: below)
    plan = Plan.make(detect(_source(case["template"])), TOOLS, reasoning_format="none")
    parsed = plan.parse(case["text"])
    assert (parsed.content, parsed.reasoning_content, [(c.name, c.arguments) for c in parsed.tool_calls]) \
        == _expected(case)
    if "ids" in case["llamacpp"]:
        assert [c.id for c in parsed.tool_calls] == case["llamacpp"]["ids"]


def _think_open(source: str, kwargs: dict | None = None) -> str:
    from minillama.chat_template import ChatTemplate
    from minillama.toolcalls import opened_thinking

    return opened_thinking(ChatTemplate(source).render([{"role": "user", "content": "hi"}], True, **(kwargs or {})))


@pytest.mark.parametrize("case", _cases("reasoning"))
def test_reasoning_split_equals_llamacpp(case: dict) -> None:
    source = _source(case["template"])
    plan = Plan.make(detect(source), reasoning_format=case["reasoning_format"], thinking=thinks(source))
    open_ = _think_open(source)
    parsed = plan.parse(case["text"], open_)
    assert (parsed.content, parsed.reasoning_content, []) == _expected(case)


def _streamed(plan: Plan, text: str, think_open: str = "", step: int = 3) -> tuple[str, str, list]:
    s = StreamSplitter(plan, think_open)
    deltas = []
    for n in range(step, len(text) + step, step):
        deltas += s.feed(text[:n])
    end, _ = s.finish(text)
    deltas += end
    calls = [(c["function"]["name"], c["function"]["arguments"]) for d in deltas for c in d.get("tool_calls", [])]
    return ("".join(d.get("content", "") for d in deltas), "".join(d.get("reasoning_content", "") for d in deltas),
            calls)


@pytest.mark.parametrize("case", [c for c in _cases("cases") + _cases("reasoning") if not c.marks])
def test_streamed_split_equals_whole(case) -> None:
    c = case
    source = _source(c["template"])
    fmt = c["reasoning_format"] if c in DATA["reasoning"] else "none"
    plan = Plan.make(detect(source), TOOLS if c in DATA["cases"] else None, reasoning_format=fmt,
                     thinking=thinks(source))
    open_ = _think_open(source) if c in DATA["reasoning"] else ""
    whole = plan.parse(c["text"], open_)
    for step in (1, 4, 1000):
        assert _streamed(plan, c["text"], open_, step) == (
            whole.content, whole.reasoning_content, [(t.name, t.arguments) for t in whole.tool_calls])


def test_detect_families() -> None:
    got = {name: detect(_source(name)) for name in
           ("hermes.jinja", "qwen3.jinja", "llama3.jinja", "mistral.jinja", "qwen3coder.jinja", "deepseek_r1.jinja",
            "gpt_oss.jinja", None)}
    assert got == {"hermes.jinja": "hermes", "qwen3.jinja": "hermes", "llama3.jinja": "llama3",
                   "mistral.jinja": "mistral", "qwen3coder.jinja": "qwen3_coder", "deepseek_r1.jinja": "deepseek_r1",
                   "gpt_oss.jinja": "gpt_oss", None: "generic"}


@pytest.mark.parametrize("tools, choice, message", [
    ("nope", None, "expected tools as a list"),
    ([{"type": "function"}], None, "expected tools[0] to be"),
    ([{"type": "function", "function": {"name": ""}}], None, "tools[0].function.name"),
    (TOOLS, "sometimes", "expected tool_choice 'auto', 'none', 'required'"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}}, "names the function 'missing', which is not in"),
    (None, "required", "needs tools"),
])
def test_bad_tools_are_argument_errors(tools, choice, message) -> None:
    with pytest.raises(ArgumentError, match=re.escape(message)):
        Plan.make("generic", tools, choice)


# -- the server, driven by the openai client (SmolLM2: ChatML, so llama.cpp's generic format) ---------------------

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smol() -> Iterator:
    pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
    pytest.importorskip("openai", reason="the test extra is not installed: pip install -e \".[test]\"")
    from support.serve import Server

    s = Server(real_gguf())
    yield s
    s.stop()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_or_named_tool_choice_gives_a_call_following_the_schema(smol, choice) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    r = smol.client().chat.completions.create(model="m", messages=ASK, tools=WEATHER, tool_choice=choice,
                                              temperature=0, max_tokens=64)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and not ch.message.content
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and len(call.id) == 32
    jsonschema.validate(json.loads(call.function.arguments), WEATHER[0]["function"]["parameters"])


def test_streamed_tool_call_deltas_assemble_to_the_whole_call(smol) -> None:
    client = smol.client()
    kw = dict(model="m", messages=ASK, tools=WEATHER, tool_choice="required", temperature=0, max_tokens=64)
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
            c["id"] = d.id or c["id"]
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
    assert finish == whole.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert all(len(c["id"]) == 32 for c in calls.values())


def test_tool_result_round_trip(smol) -> None:
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}]
    r = smol.client().chat.completions.create(model="m", messages=history, tools=WEATHER, temperature=0,
                                              max_tokens=48)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 100  # the tools and the result are in the prompt
    # without tools a history with calls is still rendered (as the generic format's text)
    r = smol.client().chat.completions.create(model="m", messages=history, temperature=0, max_tokens=4)
    assert r.choices[0].message.tool_calls is None


def test_langchain_bind_tools_and_structured_output_by_function_calling(smol) -> None:
    """LangChain's ChatOpenAI against `minillama serve`: bind_tools (forced to the tool, and auto) gives AIMessage
    tool_calls LangChain parsed itself, and with_structured_output(method="function_calling") an object of the
    schema."""
    langchain_openai = pytest.importorskip("langchain_openai", reason="the test extra is not installed: "
                                           "pip install -e \".[test]\"")
    jsonschema = pytest.importorskip("jsonschema")
    llm = langchain_openai.ChatOpenAI(base_url=smol.url + "/v1", api_key="none", model="m", temperature=0,
                                      max_tokens=64, max_retries=0)
    schema = WEATHER[0]["function"]["parameters"]
    forced = llm.bind_tools(WEATHER, tool_choice="get_weather").invoke("What is the weather in Paris?")
    (call,) = forced.tool_calls
    assert call["name"] == "get_weather" and call["type"] == "tool_call" and len(call["id"]) == 32
    jsonschema.validate(call["args"], schema)
    assert not forced.invalid_tool_calls
    auto = llm.bind_tools(WEATHER).invoke("What is the weather in Paris?")  # the generic format: a call or text
    assert auto.tool_calls or auto.content
    assert not auto.invalid_tool_calls
    streamed = None
    for chunk in llm.bind_tools(WEATHER, tool_choice="get_weather").stream("What is the weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and [(c["name"], c["args"]) for c in streamed.tool_calls] == \
        [(c["name"], c["args"]) for c in forced.tool_calls]
    city = {"title": "City", "description": "A city and how many days of weather", "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}
    got = llm.with_structured_output(city, method="function_calling").invoke("Weather in Rome for 3 days?")
    assert isinstance(got, dict)
    jsonschema.validate(got, city)


@pytest.mark.parametrize("body, message", [
    ({"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "names the function 'nope', which is not in tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": {"get_weather": {}}}, "tools"),
    ({"tools": WEATHER, "tool_choice": "always"}, "tool_choice"),
    ({"reasoning_format": "verbose"}, "reasoning_format"),
])
def test_bad_tool_requests_are_400(smol, body, message) -> None:
    status, got = smol.request("POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **body})
    assert status == 400, got
    assert set(got) == {"error"} and message in got["error"]["message"], got


# -- the Python API with a template that has tool calls of its own ------------------------------------------------

@pytest.fixture(scope="module")
def qwen3_llm():
    from minillama.api import Llama

    return Llama(real_gguf(), seed=1, chat_template=(TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8"))


def test_named_function_in_a_hermes_template_streams_and_parses_alike(qwen3_llm) -> None:
    kw = dict(tools=WEATHER, tool_choice={"type": "function", "function": {"name": "get_weather"}},
              temperature=0, max_tokens=48, reasoning_format="none")
    whole = qwen3_llm.create_chat_completion(ASK, **kw)["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    (call,) = whole["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"])["city"],
                                                                    str)
    deltas = [c["choices"][0]["delta"] for c in qwen3_llm.create_chat_completion(ASK, stream=True, **kw)]
    streamed = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [(t["index"], t["function"]) for t in streamed] == [(0, call["function"])]
    assert "".join(d.get("content") or "" for d in deltas) == ""  # the call never leaks into content


def test_history_with_calls_renders_through_the_templates_own_tool_syntax(qwen3_llm) -> None:
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}]
    from minillama.chat_template import ChatTemplate

    # transformers passes arguments to templates as objects; the rendered text is the template's own syntax
    text = ChatTemplate(qwen3_llm.chat_template).render(
        [*ASK, {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]}, history[2]], True, tools=WEATHER)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    r = qwen3_llm.create_chat_completion(history, tools=WEATHER, temperature=0, max_tokens=1)
    assert r["usage"]["prompt_tokens"] == len(qwen3_llm.tokenize(text, add_special=True, parse_special=True))


def test_chat_template_kwargs_reach_the_template(qwen3_llm) -> None:
    on = qwen3_llm.create_chat_completion(ASK, temperature=0, max_tokens=1)["usage"]["prompt_tokens"]
    off = qwen3_llm.create_chat_completion(ASK, temperature=0, max_tokens=1,
                                           chat_template_kwargs={"enable_thinking": False})["usage"]["prompt_tokens"]
    closed = qwen3_llm.tokenize("<think>\n\n</think>\n\n", add_special=False, parse_special=True)
    assert off - on == len(closed)


_FORCED = [pytest.param(c, id=f"{c['template']}-{c['reasoning_format']}-{i}")
           for i, c in enumerate(DATA["reasoning"]) if c["template"] is not None and not _deviation("reasoning", c)]


@pytest.mark.parametrize("case", _FORCED)
def test_forced_reply_splits_as_llamacpps(case: dict, monkeypatch) -> None:
    """The same text llama.cpp's server was made to generate (a grammar allowing only it), generated by
    minillama through the same template: the reply's reasoning_content and content are llama.cpp's, streamed or
    not."""
    monkeypatch.setattr(Plan, "constraint_grammar", lambda self: f"start: {json.dumps(case['text'])}\n")
    llm = _forced_llm(case["template"])
    kw = dict(temperature=0, max_tokens=64, reasoning_format=case["reasoning_format"])
    r = llm.create_chat_completion([{"role": "user", "content": "hi"}], **kw)
    msg, want = r["choices"][0]["message"], case["llamacpp"]
    assert (msg["content"], msg.get("reasoning_content", "")) == (want["content"], want["reasoning_content"])
    deltas = [c["choices"][0]["delta"] for c in llm.create_chat_completion([{"role": "user", "content": "hi"}],
                                                                           stream=True, **kw)]
    assert "".join(d.get("content") or "" for d in deltas) == want["content"]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == want["reasoning_content"]


_LLMS: dict = {}


def _forced_llm(template: str):
    from minillama.api import Llama

    if template not in _LLMS:
        _LLMS[template] = Llama(real_gguf(), seed=1, chat_template=_source(template))
    return _LLMS[template]


def test_lazy_constraint_starts_when_a_call_starts(qwen3_llm) -> None:
    """Under "auto" the reply is free until <tool_call>; from there only a call that follows the schema."""
    from minillama.toolcalls.lazy import LazyConstraint

    tok = qwen3_llm.tokenizer
    plan = Plan.make("hermes", WEATHER, "auto")
    c = LazyConstraint(tok, plan.lazy_triggers())
    for t in tok.encode("Let me look. Hello", add_special=False):
        assert c.allowed() is None  # free text
        c.accept(t)
    for t in tok.encode(" <tool_call>\n", add_special=False, parse_special=True):
        c.accept(t)
    mask = c.allowed()
    assert mask is not None
    assert mask[tok.encode("{", add_special=False)[0]] and not mask[tok.encode("Hello", add_special=False)[0]]
    for t in tok.encode('{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', add_special=False,
                        parse_special=True):
        assert c.allowed()[t], tok.token_to_piece(t)
        c.accept(t)
    assert c.done and c.allowed().sum() == len([i for i in range(tok.n_vocab) if tok.is_eog(i)])
    # a call to a function that is not in tools cannot be written
    c = LazyConstraint(tok, plan.lazy_triggers())
    for t in tok.encode('<tool_call>\n{"name": "', add_special=False, parse_special=True):
        c.accept(t)
    assert not c.allowed()[tok.encode("nope", add_special=False)[0]]


_CALLS = [pytest.param(c, id=f"{c['template']}-{i}") for i, c in enumerate(DATA["cases"])
          if c["reasoning_format"] == "auto" and c["template"] in ("qwen3coder.jinja", "deepseek_r1.jinja",
                                                                    "llama3.jinja", "hermes.jinja")
          and c["llamacpp"].get("tool_calls") and not _llamacpp_parsed_a_partial_call(c)
          # the constraint lays JSON out one way (constrain.JSON_OPTIONS: ", " and ": "), a compact call is not it
          and not re.search(r'":(?! )|,(?! )', c["text"])]


@pytest.mark.parametrize("case", _CALLS)
def test_lazy_constraint_lets_through_each_call_llamacpp_parses(case: dict, qwen3_llm) -> None:
    """Under "auto", every text llama.cpp's server parses as calls (Qwen3-Coder XML, DeepSeek R1's tokens, bare
    Llama 3 JSON, Hermes) can be written id by id once the call starts, and the constraint ends with the call."""
    from minillama.toolcalls.lazy import LazyConstraint

    tok = qwen3_llm.tokenizer
    plan = Plan.make(detect(_source(case["template"])), TOOLS, "auto", len(case["llamacpp"]["tool_calls"]) > 1)
    c = LazyConstraint(tok, plan.lazy_triggers())
    for t in tok.encode(case["text"], add_special=False, parse_special=True):
        mask = c.allowed()
        assert mask is None or mask[t], tok.token_to_piece(t, special=True)
        c.accept(t)
    assert c.inner is not None and c.done


@pytest.mark.parametrize("family, call, refused_at", [
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree", "three"),
    ("qwen3_coder", "<tool_call>\n<function=nope>", "nope"),
    ("deepseek_r1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                    '{"town', "town"),
    ("llama3", 'Sure: {"name": "add", "parameters": {"a": "x"}}', ' "x'),
])
def test_lazy_constraint_holds_a_started_call_to_the_schema(family: str, call: str, refused_at: str,
                                                            qwen3_llm) -> None:
    """Once a call starts, an argument outside the function's schema (or an unknown function) cannot be written."""
    from minillama.toolcalls.lazy import LazyConstraint

    tok = qwen3_llm.tokenizer
    c = LazyConstraint(tok, Plan.make(family, TOOLS, "auto").lazy_triggers())
    ids = tok.encode(call, add_special=False, parse_special=True)
    for k, t in enumerate(ids):
        mask = c.allowed()
        if mask is not None and not mask[t]:
            at = call.rindex(refused_at)  # the refused id spells part of refused_at
            assert len(tok.decode(ids[:k])) < at + len(refused_at) <= len(call) and len(tok.decode(ids[:k + 1])) > at
            return
        c.accept(t)
    raise AssertionError(f"{call!r} was let through")


def test_reasoning_format_flag_is_the_servers_default(qwen3_llm, monkeypatch) -> None:
    """--reasoning-format none keeps thinking in content; a request's reasoning_format overrides it (the chat
    path of the server's app, in-process, with a reply forced to llama.cpp's text)."""
    pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
    from starlette.testclient import TestClient

    from minillama.cli import build_parser
    from minillama.serve.app import create_app

    args = build_parser().parse_args(["serve", "--model", "m.gguf", "--reasoning-format", "none"])
    assert args.reasoning_format == "none"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "m.gguf", "--reasoning-format", "verbose"])
    (case,) = [c for c in DATA["reasoning"] if c["template"] == "qwen3.jinja" and c["reasoning_format"] == "auto"
               and c["text"].endswith("Hello!") and c["text"].startswith("<think>")]
    monkeypatch.setattr(Plan, "constraint_grammar", lambda self: f"start: {json.dumps(case['text'])}\n")
    with TestClient(create_app(qwen3_llm, reasoning_format=args.reasoning_format)) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 64}
        msg = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert msg["content"] == case["text"] and "reasoning_content" not in msg
        msg = client.post("/v1/chat/completions", json={**body, "reasoning_format": "auto"}).json()[
            "choices"][0]["message"]
        assert (msg["content"], msg["reasoning_content"]) == (case["llamacpp"]["content"],
                                                              case["llamacpp"]["reasoning_content"])


class _Ids:
    """A tokenizer stand-in for the budget's state machine: ids 0..199, each piece one ASCII byte."""

    n_vocab = 200

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return b"x"


def _forcing_steps(seq: list[int], budget: int, forced: tuple, ends: tuple = ((101,),), prefill: tuple = ()) -> list:
    """Per id of seq (fed after checking the mask, as llama.cpp's test-reasoning-budget.cpp does): the one id forced
    at that step, or None."""
    from minillama.reasoning_budget import BudgetGate
    from minillama.request import ReasoningBudget

    gate = BudgetGate(ReasoningBudget(budget, (100,), ends, forced, prefill), _Ids())
    out = []
    for t in seq:
        mask = gate.allowed()
        out.append(None if mask is None else int(np.flatnonzero(mask)[0]) if mask.sum() == 1 else "many")
        gate.accept(t)
    return out


def test_reasoning_budget_state_machine_as_llamacpps() -> None:
    """The cases of llama.cpp's tests/test-reasoning-budget.cpp: where forcing starts and what it forces."""
    from minillama.reasoning_budget import utf8_complete

    # natural end before the budget is spent: never forced
    assert _forcing_steps([100, 50, 51, 101, 52], 5, (102,)) == [None] * 5
    # budget 2 spent at i=2: the forced sequence at i=3 and i=4, then free again
    assert _forcing_steps([100, 50, 51, 102, 101, 60], 2, (102, 101)) == [None, None, None, 102, 101, None]
    # budget 0 with the start tag in the prefill: forced from the first step
    assert _forcing_steps([102, 101, 50], 0, (102, 101), prefill=(100,)) == [102, 101, None]
    # after the end a new start tag gets a fresh budget
    assert _forcing_steps([100, 101, 100, 50, 102, 101], 1, (102, 101)) == [None, None, None, None, 102, 101]
    # the longest end sequence ending at an id wins; a later start re-arms
    from minillama.reasoning_budget import DONE, BudgetGate
    from minillama.request import ReasoningBudget

    gate = BudgetGate(ReasoningBudget(5, (100,), ((104,), (103, 104)), (102, 104)), _Ids())
    for t in (100, 103, 104):
        gate.accept(t)
    assert gate.state == DONE
    for piece, complete in [(b"hello", True), (b"", True), (b"\xc2\xa0", True), (b"\xf0\x9f\x98\x80", True),
                            (b"\xc2", False), (b"\xe2\x80", False), (b"\xf0\x9f\x98", False), (b"\x80", False),
                            (b"hello\xc3", False), (b"hello\xc3\xa9", True)]:
        assert utf8_complete(piece) is complete, piece
    with pytest.raises(ArgumentError, match="reasoning budget"):
        ReasoningBudget(-2, (100,), ((101,),))


_BUDGET = [pytest.param(c, id=f"{c['template']}-{c['reasoning_format']}-{json.dumps(c['request'])}")
           for c in DATA["budget"]]


@pytest.mark.parametrize("case", _BUDGET)
def test_reasoning_budget_cuts_thinking_as_llamacpp(case: dict) -> None:
    """A greedy reply under a thinking template with reasoning_budget_tokens (thinking_budget_tokens, its alias on
    the server) and reasoning_budget_message: the text llama.cpp's server wrote, cut where it forced the end tag
    (with reasoning_format "none" the whole text, the prompt's opening tag included)."""
    llm = _forced_llm(case["template"])
    req = dict(case["request"])
    if "thinking_budget_tokens" in req:
        req["reasoning_budget_tokens"] = req.pop("thinking_budget_tokens")
    r = llm.create_chat_completion([{"role": "user", "content": "What is 2+2?"}], max_tokens=12, temperature=0,
                                   reasoning_format=case["reasoning_format"], **req)
    msg, want = r["choices"][0]["message"], case["llamacpp"]
    if case["reasoning_format"] == "none":
        assert msg["content"] == want["content"]
    else:  # minillama's split drops the blanks that open each part (see test_forced_reply_splits_as_llamacpps)
        assert (msg["content"], msg.get("reasoning_content", "")) == (want["content"].lstrip(),
                                                                      want["reasoning_content"].lstrip())


def test_reasoning_budget_on_the_server() -> None:
    """reasoning_budget_tokens (and its alias thinking_budget_tokens) on /v1/chat/completions, --reasoning-budget
    as the default a request's -1 keeps, and Anthropic's thinking.budget_tokens on /v1/messages: llama.cpp's cut."""
    pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
    from starlette.testclient import TestClient

    from minillama.cli import build_parser
    from minillama.serve.app import create_app

    args = build_parser().parse_args(["serve", "--model", "m.gguf", "--reasoning-budget", "3",
                                      "--reasoning-budget-message", " Enough."])
    assert (args.reasoning_budget, args.reasoning_budget_message) == (3, " Enough.")
    want = {json.dumps(c["request"], sort_keys=True): c["llamacpp"] for c in DATA["budget"]
            if c["template"] == "qwen3_thinking.jinja" and c["reasoning_format"] == "auto"}
    llm = _forced_llm("qwen3_thinking.jinja")
    body = {"messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0, "max_tokens": 12}

    def split(msg: dict) -> tuple[str, str]:
        return msg["content"] or "", msg.get("reasoning_content", "")

    def llamacpp(request: dict) -> tuple[str, str]:
        got = want[json.dumps(request, sort_keys=True)]
        return got["content"].lstrip(), got["reasoning_content"].lstrip()

    with TestClient(create_app(llm)) as client:
        for request in ({"reasoning_budget_tokens": 3}, {"thinking_budget_tokens": 5}):
            r = client.post("/v1/chat/completions", json={**body, **request})
            assert split(r.json()["choices"][0]["message"]) == llamacpp(request)
        r = client.post("/v1/chat/completions", json={**body, "reasoning_budget_tokens": -2})
        assert r.status_code == 400 and "reasoning_budget_tokens" in r.json()["error"]["message"]
        r = client.post("/v1/messages", json={**body, "thinking": {"type": "enabled", "budget_tokens": 3}})
        blocks = r.json()["content"]
        assert [b["thinking"] for b in blocks if b["type"] == "thinking"] == [llamacpp(
            {"reasoning_budget_tokens": 3})[1]]
    with TestClient(create_app(llm, reasoning_budget=args.reasoning_budget,
                               reasoning_budget_message=args.reasoning_budget_message)) as client:
        for request in ({}, {"reasoning_budget_tokens": -1}):  # -1: the server's budget, as llama-server
            r = client.post("/v1/chat/completions", json={**body, **request})
            assert split(r.json()["choices"][0]["message"]) == llamacpp(
                {"reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough."})


def test_lazy_constraint_waits_out_the_thinking(qwen3_llm) -> None:
    """As llama.cpp's (its budget sampler made for a lazy grammar even without a budget): a <tool_call> written
    while thinking does not start the call's constraint; one after </think> does."""
    from minillama.reasoning_budget import BudgetGate, make_budget
    from minillama.toolcalls.lazy import LazyConstraint

    tok = qwen3_llm.tokenizer
    plan = Plan.make("hermes", WEATHER, "auto")
    gate = BudgetGate(make_budget(tok, "hermes", -1, "", "<|im_start|>assistant\n<think>\n"), tok,
                      LazyConstraint(tok, plan.lazy_triggers()))
    for t in tok.encode("Maybe <tool_call>\n{\"name\": \"nope\"} is wrong.", add_special=False, parse_special=True):
        assert gate.allowed() is None
        gate.accept(t)
    for t in tok.encode("\n</think>\n\n", add_special=False, parse_special=True):
        assert gate.allowed() is None
        gate.accept(t)
    for t in tok.encode("<tool_call>\n", add_special=False, parse_special=True):
        gate.accept(t)
    mask = gate.allowed()
    assert mask is not None and not mask[tok.encode("nope", add_special=False)[0]]
