"""`minillama serve` refusing malformed requests: every one gets a 4xx with OpenAI's error object
{"error": {"message", "type", "param", "code"}} whose message names the field; none gets a 5xx.

The kinds of malformed request, each sent to every endpoint it applies to: JSON nested too deep (inside a field,
and deeper than the JSON parser itself goes), numbers too large for a float or outside a field's range (10**400,
1e400, Infinity, NaN, an id of 2**70), a lone surrogate ("\\ud800", which is not Unicode: llama.cpp's JSON
parser refuses it too) in a value, in a field's name and in a wrongly typed value. Then the chat content given as
parts (joined by newlines, as llama.cpp's common_chat_msgs_to_json_oaicompat joins them), a JSON grammar that
fails after the first token, a path with a trailing slash, and /v1/models' "meta" (expected values from the
`gguf` package's reader of the same file).
"""

from __future__ import annotations

import http.client
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.serve import N_CTX, Server, second_vocab, write_tiny_chat_model

from minillama.tokenizer import Tokenizer

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("openai", reason="the test extra is not installed: pip install -e \".[test]\"")
gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return write_tiny_chat_model(tmp_path_factory.mktemp("serve_errors") / "tiny-chat.gguf")


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Iterator[Server]:
    s = Server(tiny_path, "--parallel", "4", "--vocab", str(second_vocab()))
    yield s
    s.stop()


#: endpoint -> a valid body (the malformed kinds are changes of it)
ENDPOINTS = {
    "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/embeddings": {"input": "Hi"},
    "/tokenize": {"content": "Hi"},
    "/detokenize": {"tokens": [1, 2]},
}
#: each endpoint's required field: where the nesting and surrogates go
MAIN = {"/v1/completions": "prompt", "/v1/chat/completions": "messages", "/v1/embeddings": "input",
        "/tokenize": "content", "/detokenize": "tokens"}
GENERATION = ("/v1/completions", "/v1/chat/completions")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def kinds(path: str) -> list[tuple[str, bytes, str]]:
    """(name, raw body, the field the message must name) of every malformed kind that applies to path."""
    base, main = ENDPOINTS[path], MAIN[path]

    def body(**change: object) -> bytes:
        return json.dumps({**base, **change}).encode()

    def raw(text: str) -> bytes:  # a body with a value json.dumps cannot write (10**400 as a JSON number, ...)
        return ("{" + json.dumps(base)[1:-1] + ", " + text + "}").encode()

    out = [
        ("nested-100-in-field", raw(f'"{main}": {nested(100)}'), main),
        ("nested-100000-body", ("{" + f'"{main}": ' + nested(100_000) + "}").encode(), "nested"),
        ("surrogate-in-unknown-name", raw('"bad\\ud800": 1'), "bad"),
        ("surrogate-in-unknown-name-only", b'{"\\ud800": 1}', "ud800"),
    ]
    surrogate_value = {"/v1/chat/completions": '[{"role": "user", "content": "a\\ud800"}]',
                       "/detokenize": '"\\ud800"'}.get(path, '"a\\ud800"')
    out.append(("surrogate-in-value", ("{" + f'"{main}": {surrogate_value}' + "}").encode(), main))
    if path not in GENERATION:
        return out
    out.append(("surrogate-echoed", raw('"echo": true') if path == "/v1/completions" else
                raw('"stop": ["\\udc00"]'), main if path == "/v1/completions" else "stop"))
    if path == "/v1/completions":
        out[-1] = ("surrogate-echoed", json.dumps({"prompt": "x\ud800", "echo": True, "max_tokens": 1}).encode(),
                   "prompt")
    out.append(("surrogate-in-wrong-type", raw('"temperature": "\\ud800"'), "temperature"))
    for field in ("temperature", "repeat_penalty", "presence_penalty", "frequency_penalty", "top_p", "min_p"):
        out.append((f"{field}-10**400", raw(f'"{field}": {10**400}'), field))
        out.append((f"{field}-1e400", raw(f'"{field}": 1e400'), field))
    out += [("temperature-Infinity", raw('"temperature": Infinity'), "temperature"),
            ("temperature-NaN", raw('"temperature": NaN'), "temperature"),
            ("presence_penalty--Infinity", raw('"presence_penalty": -Infinity'), "presence_penalty"),
            ("logit_bias-value-10**400", raw(f'"logit_bias": {{"5": {10**400}}}'), "logit_bias"),
            ("logit_bias-value-Infinity", raw('"logit_bias": {"5": Infinity}'), "logit_bias"),
            ("repeat_last_n-10**20", raw(f'"repeat_last_n": {10**20}'), "repeat_last_n"),
            ("max_tokens-10**20", body(max_tokens=10**20), "max_tokens"),
            ("top_k-10**20", body(top_k=10**20), "top_k"),
            ("seed-10**30", body(seed=10**30), "seed"),
            ("n-true", body(n=True), "n")]
    if path == "/v1/completions":
        out.append(("logprobs-10**20", body(logprobs=10**20), "logprobs"))
    else:
        out += [("top_logprobs-10**20", body(logprobs=True, top_logprobs=10**20), "top_logprobs"),
                ("max_completion_tokens-10**20", body(max_completion_tokens=10**20), "max_completion_tokens"),
                ("content-part-image", body(messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]), "text only")]
    return out


def raw_request(server: Server, path: str, data: bytes, method: str = "POST") -> tuple[int, dict | str, dict]:
    """(status, the JSON body or the text, the headers) of one request, redirects not followed."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(text), dict(r.getheaders())
    except ValueError:
        return r.status, text, dict(r.getheaders())


def assert_error_object(status: int, body: dict | str, names: str, what: str) -> dict:
    assert 400 <= status < 500, (what, status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, (what, body)
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), (what, err)
    assert err["type"] == "invalid_request_error", (what, err)
    assert names in err["message"] or names == err["param"], (what, err)
    assert "\n" not in err["message"], (what, err)
    return err


@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_malformed_requests_get_4xx_naming_the_field(server: Server, path: str) -> None:
    """Every malformed kind on every endpoint: a 4xx error object naming the field (none a 5xx, as 21 of 96
    were in the load test)."""
    wrong = []
    for name, data, names in kinds(path):
        status, body, _ = raw_request(server, path, data)
        try:
            err = assert_error_object(status, body, names, f"{path} {name}")
            if name.startswith("nested"):
                assert "64 levels" in err["message"], err
            if "surrogate" in name:
                assert err["code"] == "invalid_unicode", err
        except AssertionError as exc:
            wrong.append(str(exc)[:300])
    assert not wrong, "\n".join(wrong)
    # the server is still well: a valid request afterwards
    status, _, _ = raw_request(server, path, json.dumps(ENDPOINTS[path]).encode())
    assert status == 200


def test_out_of_range_messages_say_the_range_and_what_was_found(server: Server) -> None:
    status, body = server.request("POST", "/v1/completions", b'{"prompt": "Hi", "temperature": 1e400}')
    assert status == 400 and body["error"]["message"] == \
        "expected 'temperature' to be a number from 0 to 3.4e+38, found Infinity", body
    status, body = server.request("POST", "/v1/completions", f'{{"prompt": "Hi", "top_p": {10**400}}}'.encode())
    assert status == 400 and body["error"]["message"] == \
        "expected 'top_p' to be a number greater than 0 and at most 1, found an integer of 401 digits", body
    status, body = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2**31})
    assert status == 400 and body["error"]["param"] == "max_tokens" and "2,147,483,647" in \
        body["error"]["message"] and "2147483648" in body["error"]["message"], body


def test_logit_bias_ids_past_the_vocab_are_skipped_and_false_bans(server: Server, tok: Tokenizer) -> None:
    """An id past the vocab (2**70 included) is skipped as llama.cpp's server skips it; `false` bans a token,
    as in llama.cpp's server."""
    greedy = {"prompt": "Hello", "max_tokens": 4, "temperature": 0, "seed": 1}
    status, plain = server.request("POST", "/v1/completions", greedy)
    assert status == 200
    status, skipped = server.request("POST", "/v1/completions", {**greedy, "logit_bias": {str(2**70): 50,
                                                                                          "100000": 50}})
    assert status == 200 and skipped["choices"][0]["text"] == plain["choices"][0]["text"], skipped
    first = tok.encode(plain["choices"][0]["text"], add_special=False)[0]
    status, banned = server.request("POST", "/v1/completions", {**greedy, "logit_bias": {str(first): False}})
    assert status == 200 and tok.encode(banned["choices"][0]["text"], add_special=False)[:1] != [first], banned


@pytest.fixture(scope="module")
def tok(tiny_path: Path) -> Tokenizer:
    return Tokenizer.from_file(tiny_path)


def test_content_parts_are_joined_by_newlines(server: Server) -> None:
    """Text parts joined by "\\n" (llama.cpp's concat_typed_text): the same reply as that text as one string."""
    greedy = {"max_tokens": 6, "temperature": 0, "seed": 1}
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    status, a = server.request("POST", "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": parts}], **greedy})
    assert status == 200, a
    status, b = server.request("POST", "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "Hello\nthere"}], **greedy})
    assert status == 200 and a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]


def _grammar_breaking_bias(tok: Tokenizer) -> dict[str, bool]:
    """logit_bias banning (false) every token that can follow "{" in a JSON object: '"' and '}' starts."""
    return {str(i): False for i in range(tok.n_vocab) if tok.token_to_piece(i)[:1] in (b'"', b"}")}


def test_grammar_failure_after_the_first_token_is_a_one_line_400(server: Server, tok: Tokenizer) -> None:
    """The first token "{" is allowed; then the bias leaves nothing the schema allows: one line, never
    llguidance's parser dump; streamed, the same error object as an event after the first chunk."""
    body = {"prompt": "x", "max_tokens": 5, "temperature": 0, "response_format": {"type": "json_object"},
            "logit_bias": _grammar_breaking_bias(tok)}
    status, r = server.request("POST", "/v1/completions", body)
    err = assert_error_object(status, r, "logit_bias", "grammar")
    assert "after 1 generated tokens" in err["message"] and "<state>" not in err["message"], err
    status, text, _ = raw_request(server, "/v1/completions", json.dumps({**body, "stream": True}).encode())
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
    assert status == 200 and events[0]["choices"][0]["text"] == "{", text
    assert events[-1]["error"]["message"] == err["message"], events


def test_trailing_slash_is_a_404_not_a_redirect(server: Server) -> None:
    status, body, headers = raw_request(server, "/v1/completions/", json.dumps({"prompt": "Hi"}).encode())
    assert status == 404 and "location" not in {k.lower() for k in headers}, (status, headers)
    assert "/v1/completions, without the trailing slash" in body["error"]["message"], body


def test_models_meta_has_the_models_numbers(server: Server, tiny_path: Path) -> None:
    """n_vocab, n_ctx_train, n_embd, n_params and size, as llama-server's /v1/models "meta", from gguf's reader."""
    reader = gguf.GGUFReader(tiny_path)
    status, body = server.request("GET", "/v1/models")
    assert status == 200
    meta = body["data"][0]["meta"]
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert meta["n_vocab"] == len(tokens.data)
    assert meta["n_ctx_train"] == N_CTX == int(reader.fields["llama.context_length"].parts[-1][0])
    assert meta["n_embd"] == int(reader.fields["llama.embedding_length"].parts[-1][0])
    assert meta["n_params"] == sum(int(t.n_elements) for t in reader.tensors)
    assert meta["size"] == sum(int(t.n_bytes) for t in reader.tensors)
    assert not any(isinstance(v, float) and math.isnan(v) for v in meta.values())


def test_the_servers_sampling_fields_are_the_requests() -> None:
    """Every SamplingParams setting a client may send is a field of both generation endpoints under the same name
    (n_probs comes from logprobs / top_logprobs), so the server has every control a Request has."""
    import dataclasses

    from minillama.request import SamplingParams
    from minillama.serve import params

    names = {f.name for f in dataclasses.fields(SamplingParams)} - {"n_probs"}
    for table in (params.COMPLETION, params.CHAT):
        assert names <= {n for n, f in table.items() if f.kwarg == ""}
