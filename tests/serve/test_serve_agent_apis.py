"""The agents' other APIs: OpenAI's Responses API (/v1/responses) and Anthropic's Messages API (/v1/messages,
/v1/messages/count_tokens), driven by the official `openai` and `anthropic` clients against SmolLM2. Shapes are
the clients' own types (validated strictly, not just parsed leniently); the replies must equal what the chat
path gives for the same conversation, since both APIs are converters onto it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from support.paths import real_gguf

KEY = "agent-key"
INSTRUCTIONS = "You are brief."
ASK = "What is the weather in Paris?"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def smol() -> Iterator:
    pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
    pytest.importorskip("openai", reason="the test extra is not installed: pip install -e \".[test]\"")
    from support.serve import Server

    s = Server(real_gguf(), "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(smol):
    return smol.client(api_key=KEY)


@pytest.fixture(scope="module")
def claude(smol):
    anthropic = pytest.importorskip("anthropic", reason="the test extra is not installed: pip install -e \".[test]\"")
    return anthropic.Anthropic(base_url=smol.url, api_key=KEY, max_retries=0, timeout=120)  # sends x-api-key


def _chat(oai, messages: list[dict], **kw):
    return oai.chat.completions.create(model="m", messages=messages, temperature=0, **kw)


# -- /v1/responses -----------------------------------------------------------------------------------------------

def test_responses_text_reply_is_the_chat_reply(oai) -> None:
    from openai.types.responses import Response

    chat = _chat(oai, [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Say hello."}],
                 max_tokens=24)
    raw = oai.responses.with_raw_response.create(model="m", instructions=INSTRUCTIONS, input="Say hello.",
                                                 temperature=0, max_output_tokens=24)
    Response.model_validate(raw.http_response.json())  # every required field, each of its type
    r = raw.parse()
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.object == "response" and r.id.startswith("resp_") and r.instructions == INSTRUCTIONS
    assert [o.type for o in r.output] == ["message"]
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 1  # the same prompt again: its prefix was cached


# the client's own snapshot types warn when dumped (its Parsed* subclasses); the dump is what is validated
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_responses_stream_events_assemble_to_the_whole_reply(oai) -> None:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    kw = dict(model="m", input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
              temperature=0, max_output_tokens=400)
    whole = oai.responses.create(**kw)
    adapter = TypeAdapter(ResponseStreamEvent)
    with oai.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    for e in events:
        adapter.validate_python(e.model_dump(exclude_unset=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text and text
    # the streamed request finds the first one's prompt in the slot's cache: on the native backend its last row
    # alone gives the whole (short, under 64 rows: attention's row path both times) prompt's bits, so the same
    # reply; the pure backend's float32 BLAS sums a one-row pass in another order, which may part the greedy path
    if os.environ.get("MINILLAMA_BACKEND", "native") != "pure":
        assert text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens


def test_responses_function_call_round_trip(oai) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    tools = [{"type": "function", **WEATHER}]
    r = oai.responses.create(model="m", input=ASK, tools=tools, tool_choice="required", temperature=0,
                             max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].id.startswith("fc_") and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    # streamed, the arguments' deltas assemble to the same call
    with oai.responses.stream(model="m", input=ASK, tools=tools, tool_choice="required", temperature=0,
                              max_output_tokens=64) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert deltas.startswith(streamed[0].arguments) and streamed[0].arguments == calls[0].arguments
    # the call and its output go back as input items: the prompt is the chat path's for the same history
    history = [{"role": "user", "content": ASK}, *[c.model_dump(exclude_none=True) for c in calls],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 24 C"} for c in calls]]
    answer = oai.responses.create(model="m", input=history, tools=tools, temperature=0, max_output_tokens=32)
    chat = _chat(oai, [{"role": "user", "content": ASK},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": c.call_id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}} for c in calls]},
                       *[{"role": "tool", "tool_call_id": c.call_id, "content": "sunny, 24 C"} for c in calls]],
                 tools=[{"type": "function", "function": WEATHER}], parallel_tool_calls=True, max_tokens=32)
    assert answer.usage.input_tokens == chat.usage.prompt_tokens > r.usage.input_tokens


@pytest.mark.parametrize("body, param, words", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
    ({"store": True}, "store", "stateless"),
    ({"frequency_penalty": 1}, "frequency_penalty", "unknown field"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input",
     "text only"),
    ({"tools": [{"type": "web_search"}]}, "tools", "hosted tools"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "item_reference"),
])
def test_responses_refuses_what_it_cannot_honour(smol, body, param, words) -> None:
    from support.serve import error_object

    status, got = smol.request("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 4, **body},
                               {"Authorization": f"Bearer {KEY}"})
    assert status == 400, got
    err = error_object(400, got, param)
    assert words in err["message"] and err["type"] == "invalid_request_error"


# -- /v1/messages ------------------------------------------------------------------------------------------------

#: temperature 0 (the client of this version has no argument for it; the API and the server take it)
GREEDY = {"temperature": 0}


def test_messages_text_reply_is_the_chat_reply(oai, claude) -> None:
    from anthropic.types import Message

    raw = claude.messages.with_raw_response.create(
        model="m", max_tokens=24, extra_body=GREEDY, system=[{"type": "text", "text": INSTRUCTIONS}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])
    Message.model_validate(raw.http_response.json())
    m = raw.parse()
    chat = _chat(oai, [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Say hello."}],
                 max_tokens=24)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == chat.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens and m.id.startswith("msg_")


def test_messages_stream_events_assemble_to_the_whole_reply(claude) -> None:
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    kw = dict(model="m", max_tokens=400, extra_body=GREEDY, messages=[{"role": "user", "content": "Say hello."}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    raw = [e for e in events if e.type in ("message_start", "content_block_start", "content_block_delta",
                                           "content_block_stop", "message_delta", "message_stop")]
    adapter = TypeAdapter(RawMessageStreamEvent)
    for e in raw:
        adapter.validate_python(e.model_dump(exclude_unset=True, include={"type", "index", "delta", "message",
                                                                          "content_block", "usage"}))
    assert [e.type for e in raw][:2] == ["message_start", "content_block_start"]
    assert [e.type for e in raw][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_messages_stop_sequence(claude) -> None:
    kw = dict(model="m", max_tokens=48, extra_body=GREEDY, messages=[{"role": "user", "content": "Name three colours."}])
    text = claude.messages.create(**kw).content[0].text
    word = text.split()[2]
    m = claude.messages.create(stop_sequences=["zzzz", word], **kw)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", word)
    assert m.content[0].text == text[:text.index(word)]


def test_messages_tool_use_round_trip_and_count_tokens(claude) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    messages = [{"role": "user", "content": ASK}]
    m = claude.messages.create(model="m", max_tokens=64, extra_body=GREEDY, tools=tools, messages=messages,
                               tool_choice={"type": "tool", "name": "get_weather"})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER["parameters"])
    with claude.messages.stream(model="m", max_tokens=64, extra_body=GREEDY, tools=tools, messages=messages,
                                tool_choice={"type": "any"}) as stream:
        partial: dict[int, str] = {}  # each tool_use block's input_json_delta pieces, by block index
        for e in stream:
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                partial[e.index] = partial.get(e.index, "") + e.delta.partial_json
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and partial  # one call or more: each block's deltas are its input
    assert {i: json.loads(text) for i, text in partial.items()} == {
        i: b.input for i, b in enumerate(final.content) if b.type == "tool_use"}
    messages += [{"role": "assistant", "content": [u.model_dump() for u in uses]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                               "content": [{"type": "text", "text": "sunny, 24 C"}]} for u in uses]}]
    answer = claude.messages.create(model="m", max_tokens=32, extra_body=GREEDY, tools=tools, messages=messages)
    counted = claude.messages.count_tokens(model="m", tools=tools, messages=messages).input_tokens
    assert counted == answer.usage.input_tokens + answer.usage.cache_read_input_tokens > m.usage.input_tokens


@pytest.mark.parametrize("body, words", [
    ({"max_tokens": None}, "'max_tokens'"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
     "text only"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"top_k": -1}, "top_k"),
])
def test_messages_errors_in_anthropics_shape(smol, claude, body, words) -> None:
    import anthropic

    status, got = smol.request("POST", "/v1/messages", {"model": "m", "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "hi"}], **body},
                               {"x-api-key": KEY})
    assert status == 400 and set(got) == {"type", "error"} and got["type"] == "error", got
    assert got["error"]["type"] == "invalid_request_error" and words in got["error"]["message"], got
    with pytest.raises(anthropic.BadRequestError) as bad:  # the client reads it as Anthropic's error
        claude.messages.create(model="m", max_tokens=4, messages=[{"role": "bot", "content": "hi"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"


def test_messages_api_key(smol, claude) -> None:
    """--api-key: Anthropic's x-api-key header is taken as well as Authorization: Bearer (which this client
    version sends); a wrong key is a 401 in Anthropic's shape."""
    anthropic = pytest.importorskip("anthropic")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert claude.messages.count_tokens(**body).input_tokens > 1
    status, got = smol.request("POST", "/v1/messages/count_tokens", body, {"x-api-key": KEY})
    assert status == 200 and got["input_tokens"] > 1, got
    status, got = smol.request("POST", "/v1/messages/count_tokens", body, {"x-api-key": "not-the-key"})
    assert (status, got) == (401, {"type": "error", "error": {
        "type": "authentication_error",
        "message": "expected the server's API key as 'x-api-key: <key>', found a different key"}})
    wrong = anthropic.Anthropic(base_url=smol.url, api_key="not-the-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.count_tokens(**body)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "authentication_error"
