"""`minillama serve` as a drop-in for llama.cpp's llama-server: its native routes, fields, response shapes and error
object, checked against llama-server itself (xllamacpp runs it in this process, on its own port) on the same model
and the same requests: the same keys, and at temperature 0 the same content and ids (on the native backend, whose
forward pass has llama.cpp's bits; the pure one's float order differs, so only the first tokens are compared
there), log-probabilities within rounding.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.paths import real_gguf
from support.serve import Server, http_request

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install -e \".[serve]\"")

#: the pure backend's floats round differently from llama.cpp's: its greedy path may part after a few tokens
EXACT = os.environ.get("MINILLAMA_BACKEND", "native") != "pure"
SHORT = 5  # tokens both backends agree with llama.cpp on, for the prompts below
TOL = 0.02 if EXACT else 0.05  # log-probabilities: llama.cpp's within rounding; the pure backend's float order


class Http:
    """Raw JSON requests to host:port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http_request(self.host, self.port, method, path, body, timeout=300)



def events(h: Http | Server, path: str, body: dict) -> tuple[list[dict], str]:
    """A streamed answer's `data:` events (JSON) and the raw text."""
    _, text = h.request("POST", path, body)
    assert isinstance(text, str), text
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")], text


@pytest.fixture(scope="module")
def theirs() -> Iterator[Http]:
    """llama.cpp's llama-server (xllamacpp, in this process) on the test model."""
    xlc = pytest.importorskip("xllamacpp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = xlc.CommonParams()
    p.model.path = str(real_gguf())
    p.n_ctx = 2048
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 1
    p.warmup = False
    p.port = port
    p.hostnames = ["127.0.0.1"]
    server = xlc.Server(p)
    h = Http("127.0.0.1", port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if h.request("GET", "/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    yield h
    del server


@pytest.fixture(scope="module")
def ours() -> Iterator[Server]:
    s = Server(real_gguf())
    yield s
    s.stop()


def _both(theirs: Http, ours: Server, path: str, body: Any) -> tuple[tuple[int, Any], tuple[int, Any]]:
    return theirs.request("POST", path, body), ours.request("POST", path, body)


# ---------------------------------------------------------------------------------------------------------------------
# POST /completion
# ---------------------------------------------------------------------------------------------------------------------

GREEDY = {"temperature": 0, "n_predict": SHORT}
CASES = {
    "text": {"prompt": "The capital of France is", "n_probs": 2, "return_tokens": True},
    "ids and text": {"prompt": [504, " capital of France is"], "return_tokens": True},
    "ids": {"prompt": [504, 3575, 282, 4649, 314], "return_tokens": True},
    "stop word": {"prompt": "The capital of France is", "stop": ["\n\n"], "n_predict": 20},
    "grammar": {"prompt": "Say yes or no:", "grammar": 'root ::= ("yes" | "no") "!"', "n_predict": 8},
    "json_schema": {"prompt": "A person:", "n_predict": 12, "return_tokens": True,
                    "json_schema": {"type": "object", "properties": {"name": {"type": "string"}},
                                    "required": ["name"]}},
    "samplers, ignore_eos, logit_bias": {"prompt": "Hi", "ignore_eos": True, "logit_bias": [[" there", 5]],
                                         "samplers": ["top_k", "temperature"], "return_tokens": True},
    "n_predict 0": {"prompt": "Hi", "n_predict": 0},
}


#: the cases whose greedy path has clear margins: the pure backend's rounding keeps them too
ROBUST = {"text", "ids and text", "ids", "grammar", "n_predict 0"}


@pytest.mark.parametrize("case", list(CASES))
def test_completion_answers_as_llama_server(theirs: Http, ours: Server, case: str) -> None:
    """Same request to both: the same keys (top level and generation_settings), stop_type, counts, and at
    temperature 0 the same content, tokens and completion_probabilities."""
    body = {**GREEDY, **CASES[case]}
    (st, t), (so, o) = _both(theirs, ours, "/completion", body)
    assert st == so == 200, (t, o)
    assert set(o) == set(t), set(o) ^ set(t)
    assert set(o["generation_settings"]) == set(t["generation_settings"]), \
        set(o["generation_settings"]) ^ set(t["generation_settings"])
    assert set(o["timings"]) == set(t["timings"])
    for key in ("index", "stop", "tokens_evaluated", "truncated", "prompt"):
        assert o[key] == t[key], key
    for key in ("n_predict", "n_probs", "ignore_eos", "samplers", "logit_bias", "stop", "top_k",
                *(("grammar",) if "json_schema" not in body else ())):  # theirs shows a schema as its grammar
        assert o["generation_settings"][key] == t["generation_settings"][key], key
    if EXACT or case in ROBUST:
        for key in ("content", "tokens", "stop_type", "stopping_word", "tokens_predicted", "tokens_cached",
                    "has_new_line"):
            assert o[key] == t[key], (key, o[key], t[key])
    if "completion_probabilities" in t:
        assert len(o["completion_probabilities"]) == len(t["completion_probabilities"])
        pairs = list(zip(o["completion_probabilities"], t["completion_probabilities"], strict=True))
        for a, b in pairs if EXACT else pairs[:1]:  # the pure backend's later scores drift past rounding
            assert {k: a[k] for k in ("id", "token", "bytes")} == {k: b[k] for k in ("id", "token", "bytes")}
            assert a["logprob"] == pytest.approx(b["logprob"], abs=TOL)
            assert [x["id"] for x in a["top_logprobs"]] == [x["id"] for x in b["top_logprobs"]]
            assert [x["logprob"] for x in a["top_logprobs"]] == pytest.approx(
                [x["logprob"] for x in b["top_logprobs"]], abs=TOL)


def test_completions_alias_and_cache_counts(theirs: Http, ours: Server) -> None:
    """/completions is /completion; the same prompt again finds all but its last token cached, as there."""
    body = {"prompt": "Once upon a time, in a small village,", "n_predict": 2, "temperature": 0}
    for h in (theirs, ours):
        h.request("POST", "/completions", body)
    (_, t), (_, o) = _both(theirs, ours, "/completions", body)
    assert o["content"] == t["content"] and o["timings"]["cache_n"] == t["timings"]["cache_n"] > 0


def test_completion_stream_events_are_llama_servers(theirs: Http, ours: Server) -> None:
    """stream: one event per piece with its ids (and timings, probabilities when asked), then the final object;
    no [DONE]; the same keys in every event, the same text."""
    body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0, "stream": True, "n_probs": 1,
            "timings_per_token": True}
    te, ttext = events(theirs, "/completion", body)
    oe, otext = events(ours, "/completion", body)
    assert "[DONE]" not in ttext and "[DONE]" not in otext
    assert len(oe) == len(te)
    for a, b in zip(oe, te, strict=True):
        assert set(a) == set(b), set(a) ^ set(b)
        assert a["content"] == b["content"] and a["tokens"] == b["tokens"] and a["stop"] == b["stop"]
    plain = {"prompt": "The capital of France is", "n_predict": 2, "temperature": 0, "stream": True}
    te, _ = events(theirs, "/completion", plain)
    oe, _ = events(ours, "/completion", plain)
    assert [set(e) for e in oe] == [set(e) for e in te]


def test_t_max_predict_ms_stops_after_a_newline(ours: Server) -> None:
    """t_max_predict_ms: once generation took longer, it stops at the next newline (stop_type limit)."""
    status, r = ours.request("POST", "/completion", {"prompt": "Write a long list of fruits, one per line:\n",
                                                      "n_predict": 200, "temperature": 0, "ignore_eos": True,
                                                      "t_max_predict_ms": 1})
    assert status == 200 and r["stop_type"] == "limit" and r["tokens_predicted"] < 200 and "\n" in r["content"]


MALFORMED = {"no prompt": {}, "prompt a number": {"prompt": 5}, "n_predict a string": {"prompt": "x", "n_predict": "a"},
             "not json": b"notjson", "not an object": b"[1, 2]"}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_completion_errors_are_llama_servers_object(theirs: Http, ours: Server, case: str) -> None:
    """A malformed body: 400 with llama.cpp's error object {"error": {"code", "message", "type"}} on both."""
    (st, t), (so, o) = _both(theirs, ours, "/completion", MALFORMED[case])
    assert so == 400 and set(o) == {"error"} and set(o["error"]) == {"code", "message", "type"}, o
    assert o["error"]["code"] == 400 and o["error"]["type"] == "invalid_request_error"
    if st == 400:
        assert set(t["error"]) == set(o["error"]) and t["error"]["type"] == o["error"]["type"]


@pytest.mark.parametrize("body, named", [
    ({"prompt": "x", "samplers": ["temperature", "top_k"]}, "samplers"),
    ({"prompt": "x", "samplers": ["bogus"]}, "bogus"),
    ({"prompt": "x", "mirostat": 2}, "mirostat"),
    ({"prompt": "x", "grammar": "root ::= ("}, "grammar"),
    ({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}, "json_schema"),
    ({"prompt": ["a", "b"]}, "one prompt"),
    ({"prompt": [10**6]}, "token ids"),
    ({"prompt": "x", "logit_bias": [[1]]}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [[1, "high"]]}, "logit_bias"),
    ({"prompt": "x", "n_probs": -1}, "n_probs"),
    ({"prompt": "x", "unknown_field": 1}, "unknown_field"),
])
def test_completion_refuses_what_it_cannot_do_by_name(ours: Server, body: dict, named: str) -> None:
    """What minillama cannot honour (another sampler order, mirostat, a bad grammar, several prompts...) is a 400 in
    llama.cpp's shape naming it, never a 500 nor a silent change."""
    status, r = ours.request("POST", "/completion", body)
    assert status == 400 and set(r["error"]) == {"code", "message", "type"}, r
    assert named in r["error"]["message"]


def test_prompt_too_long_is_a_400(ours: Server) -> None:
    status, r = ours.request("POST", "/completion", {"prompt": [504] * 9000, "n_predict": 1})
    assert status == 400 and r["error"]["type"] == "exceed_context_size_error", r


# ---------------------------------------------------------------------------------------------------------------------
# routes without /v1, /apply-template, /props, /embedding, embeddings' token ids and base64
# ---------------------------------------------------------------------------------------------------------------------

def test_routes_without_v1_and_the_openai_client_on_them(ours: Server) -> None:
    """/chat/completions, /completions... /models and /embeddings answer as their /v1 routes (llama-server has
    both); the OpenAI client with a base_url lacking /v1 works."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=ours.url, api_key="none", max_retries=0, timeout=120)
    assert client.models.list().data[0].id == real_gguf().name
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           temperature=0)
    assert reply.choices[0].message.content
    assert len(client.embeddings.create(model="m", input="Hi").data[0].embedding) == 576
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0, "tools": None}
    assert ours.request("POST", "/chat/completions", chat)[1]["choices"][0]["message"]["content"] == \
        ours.request("POST", "/v1/chat/completions", chat)[1]["choices"][0]["message"]["content"]


def test_apply_template_is_llama_servers(theirs: Http, ours: Server) -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}]}
    (st, t), (so, o) = _both(theirs, ours, "/apply-template", body)
    assert st == so == 200 and o == t
    status, r = ours.request("POST", "/apply-template", {"messages": "Hi"})
    assert status == 400 and set(r["error"]) == {"code", "message", "type"}


def test_props_keys_and_post(theirs: Http, ours: Server) -> None:
    """GET /props: llama-server's keys clients read (total_slots, chat_template, bos/eos, the default settings);
    POST /props is refused as llama-server refuses it without --props."""
    _, t = theirs.request("GET", "/props")
    status, o = ours.request("GET", "/props")
    assert status == 200
    for key in ("total_slots", "chat_template", "bos_token", "eos_token", "model_alias", "modalities",
                "endpoint_slots", "endpoint_props", "endpoint_metrics", "build_info", "default_generation_settings"):
        assert key in o and type(o[key]) is type(t[key]), key
    for key in ("chat_template", "bos_token", "eos_token", "total_slots", "modalities"):
        assert o[key] == t[key], key
    assert set(t["default_generation_settings"]["params"]) <= set(o["default_generation_settings"]["params"])
    (st, _), (so, r) = _both(theirs, ours, "/props", {"n_ctx": 1})
    assert st == so == 501 and set(r["error"]) == {"code", "message", "type"}


def test_embedding_route_and_token_id_inputs(ours: Server) -> None:
    """/embedding: llama.cpp's shape [{"index", "embedding": [[...]]}] (pooled: one vector); /v1/embeddings takes
    token ids ([ids] and [[ids], ...]) as OpenAI's API does, the same vectors as the text they spell."""
    import numpy as np

    from minillama.tokenizer import Tokenizer

    ids = Tokenizer.from_file(real_gguf()).encode("Hello there", add_special=True, parse_special=True)
    status, r = ours.request("POST", "/embedding", {"content": "Hello there"})
    assert status == 200 and [set(x) for x in r] == [{"index", "embedding"}] and len(r[0]["embedding"]) == 1
    by_text = ours.request("POST", "/v1/embeddings", {"input": "Hello there"})[1]["data"][0]["embedding"]
    by_ids = ours.request("POST", "/v1/embeddings", {"input": ids})[1]["data"][0]["embedding"]
    many = ours.request("POST", "/v1/embeddings", {"input": [ids, ids[:1]]})[1]
    assert by_ids == by_text == many["data"][0]["embedding"] and many["data"][1]["index"] == 1
    assert np.allclose(r[0]["embedding"][0], by_text)
    status, bad = ours.request("POST", "/v1/embeddings", {"input": [10**6]})
    assert status == 400, bad


def test_embeddings_base64_is_openais_float32(ours: Server) -> None:
    """encoding_format "base64": the vector's float32 little-endian bytes in base64 (OpenAI's); another value is a
    400 naming the field."""
    import base64

    import numpy as np

    floats = ours.request("POST", "/v1/embeddings", {"input": "Hi"})[1]["data"][0]["embedding"]
    status, r = ours.request("POST", "/v1/embeddings", {"input": "Hi", "encoding_format": "base64"})
    assert status == 200
    vector = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    assert vector.tolist() == np.asarray(floats, dtype=np.float32).tolist()
    status, r = ours.request("POST", "/v1/embeddings", {"input": "Hi", "encoding_format": "bogus"})
    assert status == 400 and r["error"]["param"] == "encoding_format"
