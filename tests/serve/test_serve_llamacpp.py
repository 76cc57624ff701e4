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
from pathlib import Path
from typing import Any

import pytest
from support.paths import real_gguf
from support.serve import Server, http_request, write_tiny_chat_model

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


def llama_server(model: Path | str, n_ctx: int, **settings: Any) -> tuple[Any, Http]:
    """llama.cpp's llama-server (xllamacpp, in this process) on model with n_ctx and 1 thread, on a free port, once it
    answers /health; settings: more CommonParams fields. (the server object, which must live while it serves)"""
    xlc = pytest.importorskip("xllamacpp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = xlc.CommonParams()
    p.model.path = str(model)
    p.n_ctx = n_ctx
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 1
    p.warmup = False
    p.port = port
    p.hostnames = ["127.0.0.1"]
    for name, value in settings.items():
        setattr(p, name, value)
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
    return server, h


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    """llama.cpp's llama-server (xllamacpp, in this process) on the test model, with --metrics and
    --slot-save-path."""
    server, h = llama_server(real_gguf(), 2048, endpoint_metrics=True,
                             slot_save_path=str(tmp_path_factory.mktemp("their_slots")) + "/")
    yield h
    del server


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(real_gguf(), "-c", "2048", "--metrics", "--slot-save-path", str(tmp_path_factory.mktemp("our_slots")))
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


# ---------------------------------------------------------------------------------------------------------------------
# /metrics, /slots, slot actions, llama-server's flags, system_fingerprint
# ---------------------------------------------------------------------------------------------------------------------

def _metrics(text: str) -> tuple[list[str], dict[str, float]]:
    """/metrics' HELP and TYPE lines, and each series' value."""
    meta = [line for line in text.splitlines() if line.startswith("#")]
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    return meta, values


def test_metrics_are_llama_servers(theirs: Http, ours: Server) -> None:
    """--metrics: GET /metrics is Prometheus text with llama-server's series (names, help, types, order); a
    completion adds its tokens and model calls to the counters as there."""
    body = {"prompt": "Metrics count the tokens of this prompt", "n_predict": 3, "temperature": 0}
    before = {}
    for name, h in (("theirs", theirs), ("ours", ours)):
        status, text = h.request("GET", "/metrics")
        assert status == 200 and isinstance(text, str), text
        before[name] = _metrics(text)
        h.request("POST", "/completion", body)
    (tm, tb), (om, ob) = before["theirs"], before["ours"]
    assert om == tm
    t_after, o_after = _metrics(theirs.request("GET", "/metrics")[1])[1], _metrics(ours.request("GET", "/metrics")[1])[1]
    for key in ("llamacpp:tokens_predicted_total", "llamacpp:n_decode_total"):
        assert o_after[key] - ob[key] == t_after[key] - tb[key] == 3, key
    prompt = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")
    assert sum(o_after[k] - ob[k] for k in prompt) == sum(t_after[k] - tb[k] for k in prompt)
    assert o_after["llamacpp:requests_processing"] == 0 and o_after["llamacpp:prompt_seconds_total"] > 0


def test_slots_entries_are_llama_servers(theirs: Http, ours: Server) -> None:
    """GET /slots after a completion: each slot's keys (params and next_token too) as llama-server's, and the same
    id, n_ctx (-c 2048), is_processing, cached positions and request settings."""
    body = {"prompt": "The capital of France is", "n_predict": 3, "temperature": 0, "top_k": 7}
    for h in (theirs, ours):
        h.request("POST", "/completion", body)
    (st, t), (so, o) = theirs.request("GET", "/slots"), ours.request("GET", "/slots")
    assert st == so == 200 and len(o) == len(t) == 1
    a, b = o[0], t[0]
    assert list(a) == list(b) and list(a["params"]) == list(b["params"]), (set(a) ^ set(b))
    assert [set(x) for x in a["next_token"]] == [set(x) for x in b["next_token"]]
    for key in ("id", "n_ctx", "speculative", "is_processing", "n_prompt_tokens"):
        assert a[key] == b[key], key
    for key in ("temperature", "top_k", "n_predict", "max_tokens", "samplers", "n_probs"):
        assert a["params"][key] == b["params"][key], key


def _actions(h: Http | Server, prompt: str) -> dict[str, tuple[int, Any]]:
    """A completion, then the slot actions on slot 0 and their errors: name -> (status, answer)."""
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "n_probs": 3}
    h.request("POST", "/completion", body)
    out = {"first": h.request("POST", "/completion", body),  # served from the cache: all but the last token
           "save": h.request("POST", "/slots/0?action=save", {"filename": "slot0.bin"}),
           "erase": h.request("POST", "/slots/0?action=erase"),
           "restore": h.request("POST", "/slots/0?action=restore", {"filename": "slot0.bin"})}
    out["again"] = h.request("POST", "/completion", body)
    for name, filename in (("dotdot", "../slot0.bin"), ("subdir", "x/slot0.bin")):
        out[name] = h.request("POST", "/slots/0?action=save", {"filename": filename})
    out["no filename"] = h.request("POST", "/slots/0?action=save", {})
    out["bad id"] = h.request("POST", "/slots/x?action=save", {"filename": "slot0.bin"})
    out["bad action"] = h.request("POST", "/slots/0?action=bogus", {"filename": "slot0.bin"})
    out["missing file"] = h.request("POST", "/slots/0?action=restore", {"filename": "nothing.bin"})
    return out


def test_slot_save_erase_restore_as_llama_server(theirs: Http, ours: Server) -> None:
    """--slot-save-path: save, erase and restore answer with llama-server's keys and counts; the restored slot
    serves the prompt again from its cache with the same next-token probabilities as the cache before the save; a file name with directory
    parts, a missing filename, a bad slot id or action, a missing file: 400s in llama.cpp's error object."""
    prompt = "Slots keep what the model has read so far"
    t, o = _actions(theirs, prompt), _actions(ours, prompt)
    for name in ("save", "erase", "restore"):
        assert o[name][0] == t[name][0] == 200, (name, o[name], t[name])
        assert set(o[name][1]) == set(t[name][1]), name
        assert set(o[name][1].get("timings", {})) == set(t[name][1].get("timings", {})), name
    assert o["save"][1]["n_saved"] == t["save"][1]["n_saved"] == o["erase"][1]["n_erased"] \
        == o["restore"][1]["n_restored"] == t["restore"][1]["n_restored"]
    assert o["save"][1]["filename"] == "slot0.bin" and o["restore"][1]["n_read"] == o["save"][1]["n_written"]
    first, again = o["first"][1], o["again"][1]
    assert again["timings"]["cache_n"] == first["timings"]["cache_n"] == t["again"][1]["timings"]["cache_n"] \
        == first["tokens_evaluated"] - 1
    assert again["completion_probabilities"] == first["completion_probabilities"]  # bit for bit
    for name in ("dotdot", "subdir", "no filename", "bad id", "bad action", "missing file"):
        assert o[name][0] == t[name][0] == 400, (name, o[name], t[name])
        assert set(o[name][1]["error"]) == set(t[name][1]["error"]) and o[name][1]["error"]["type"] == \
            t[name][1]["error"]["type"], name


def test_a_restored_slot_file_gives_the_same_next_logits(tmp_path: Path) -> None:
    """The slot file (save_cache) restored into a fresh session: the next token's logits are the saved session's,
    bit for bit, with only the new token computed; a file of another model or not a slot file is refused by name."""
    import numpy as np

    from minillama.api import Llama
    from minillama.serve.slots import SLOT_FILE_FORMAT, load_cache, save_cache

    llm = Llama(str(real_gguf()), n_ctx=256)
    ids = llm.tokenizer.encode("The capital of France is", add_special=True, parse_special=True)
    a = llm.session()
    a.logits_next(ids)
    path = str(tmp_path / "slot.bin")
    n_bytes = save_cache(a, path)
    with np.load(path) as z:
        assert str(z["format"]) == SLOT_FILE_FORMAT and z["ids"].tolist() == ids and n_bytes > 0
    b = llm.session()
    assert load_cache(b, path, llm.tokenizer.n_vocab, llm.n_ctx) == (len(ids), n_bytes)
    nxt = [*ids, 12]
    assert np.array_equal(b.logits_next(nxt), a.logits_next(nxt)) and b.evaluated == 1
    tiny = Llama(str(write_tiny_chat_model(tmp_path / "tiny.gguf")))
    other = str(tmp_path / "other.bin")
    s = tiny.session()
    s.logits_next([1, 2, 3])
    save_cache(s, other)
    with pytest.raises(ValueError, match="this model"):
        load_cache(llm.session(), other, llm.tokenizer.n_vocab, llm.n_ctx)
    (tmp_path / "junk.bin").write_bytes(b"not a slot file")
    with pytest.raises(ValueError, match="slot file"):
        load_cache(llm.session(), str(tmp_path / "junk.bin"), llm.tokenizer.n_vocab, llm.n_ctx)
    with pytest.raises(ValueError, match="at most 2 positions"):
        load_cache(llm.session(), path, llm.tokenizer.n_vocab, 2)


@pytest.mark.parametrize("name, ok", [("slot0.bin", True), ("a b.bin", True), ("ünï.bin", True), ("../x", False),
                                      ("x/y", False), ("x\\y", False), ("..", False), (".", False), ("", False),
                                      ("a:b", False), (" x", False), ("x.", False), ("x\n", False),
                                      ("x" * 256, False)])
def test_slot_file_names_as_llama_cpp_validates_them(name: str, ok: bool) -> None:
    """Only a plain file name inside --slot-save-path (llama.cpp's fs_validate_filename rules)."""
    from minillama.serve.slots import valid_filename

    assert valid_filename(name) is ok


IGNORED = ["-ngl", "99", "-fa", "on", "--jinja", "-b", "512", "-ub", "256", "-ctk", "q8_0", "-ctv", "q8_0",
           "--no-mmap"]


@pytest.fixture(scope="module")
def plain() -> Iterator[Server]:
    """Our server without --metrics nor --slot-save-path, with --no-slots, server-wide defaults, an alias and the
    flags copied from llama-server commands that mean nothing here."""
    s = Server(real_gguf(), "--no-slots", "--alias", "smol", "--temp", "0", "--seed", "7", "-n", "4", "-t", "1",
               "--embeddings", "--pooling", "mean", *IGNORED)
    yield s
    s.stop()


def test_llama_server_flags_copied_from_its_commands(theirs: Http, plain: Server) -> None:
    """-ngl, -fa, --jinja, -b, -ub, -ctk, -ctv, --no-mmap are accepted, each logged once as
    ignored; --alias names the model; --temp, --seed and -n are every request's defaults (the greedy 4 tokens
    llama-server gives when asked for them), shown in /props."""
    log = "".join(plain.log)
    for flag in ("-ngl/--gpu-layers 99", "-fa/--flash-attn on", "--jinja/--no-jinja", "-b/--batch-size 512",
                 "-ub/--ubatch-size 256", "-ctk/--cache-type-k q8_0", "-ctv/--cache-type-v q8_0", "--mmap/--no-mmap"):
        assert log.count(f"ignoring {flag}:") == 1, flag
    assert log.count("warning: ignoring") == 8
    assert plain.request("GET", "/v1/models")[1]["data"][0]["id"] == "smol"
    status, o = plain.request("POST", "/completion", {"prompt": "The capital of France is"})
    t = theirs.request("POST", "/completion", {"prompt": "The capital of France is", "temperature": 0,
                                               "n_predict": 4})[1]
    assert status == 200 and o["tokens_predicted"] == 4 and o["content"] == t["content"] and o["model"] == "smol"
    params = plain.request("GET", "/props")[1]["default_generation_settings"]["params"]
    assert params["temperature"] == 0 and params["seed"] == 7 and params["n_predict"] == 4
    chat = plain.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})[1]
    assert chat["usage"]["completion_tokens"] <= 4 and chat["model"] == "smol"


def test_endpoints_off_answer_as_llama_server(plain: Server) -> None:
    """Without --metrics, with --no-slots, without --slot-save-path: 501 with llama-server's messages."""
    for method, path, body, flag in (("GET", "/metrics", None, "--metrics"), ("GET", "/slots", None, "--slots"),
                                     ("POST", "/slots/0?action=save", {"filename": "a.bin"}, "--slot-save-path")):
        status, r = plain.request(method, path, body)
        assert status == 501 and r["error"]["type"] == "not_supported_error", (path, r)
        assert r["error"]["message"].endswith(f"Start it with `{flag}`"), r
    props = plain.request("GET", "/props")[1]
    assert props["endpoint_slots"] is False and props["endpoint_metrics"] is False


def test_system_fingerprint_in_completions_as_llama_server(theirs: Http, ours: Server) -> None:
    """system_fingerprint in OpenAI's completions and chat answers, and in every streamed chunk, as llama-server's."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "Hi", "max_tokens": 2})):
        (_, t), (_, o) = theirs.request("POST", path, body), ours.request("POST", path, body)
        assert isinstance(t["system_fingerprint"], str) and o["system_fingerprint"].startswith("minillama-")
        te, _ = events(theirs, path, {**body, "stream": True})
        oe, _ = events(ours, path, {**body, "stream": True})
        assert all("system_fingerprint" in e for e in te) and all("system_fingerprint" in e for e in oe)


# ---------------------------------------------------------------------------------------------------------------------
# POST /infill
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fim_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Http, Server]]:
    """llama-server and minillama serve on a tiny model whose file names fill-in-the-middle tokens."""
    path = write_tiny_chat_model(tmp_path_factory.mktemp("fim") / "fim.gguf", n_ctx=4096,
                                 fim={"pre": 990, "suf": 991, "mid": 992, "rep": 993, "sep": 994})
    server, h = llama_server(path, 4096)
    ours = Server(path, "-c", "4096")
    yield h, ours
    ours.stop()
    del server


INFILL = {
    "prefix and suffix": {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n    return c\n"},
    "extra chunks, a prompt": {"input_prefix": "x = ", "input_suffix": "\nprint(x)", "prompt": "1 +",
                               "input_extra": [{"filename": "a.py", "text": "y = 2\n"}, {"text": "z = 3\n"}]},
    "ids mixed in": {"input_prefix": ["a", 17, "b"], "input_suffix": [20, 21]},
}


@pytest.mark.parametrize("case", list(INFILL))
def test_infill_builds_llama_servers_fim_prompt(fim_pair: tuple[Http, Server], case: str) -> None:
    """llama-server's repo-level FIM prompt ([FIM_REP]myproject, [FIM_SEP]file and each extra chunk, [FIM_PRE]
    prefix and prompt, [FIM_SUF] suffix, [FIM_MID]): the same prompt text and token count, and at temperature 0
    the same completion."""
    theirs, ours = fim_pair
    body = {**INFILL[case], "n_predict": 4, "temperature": 0}
    (st, t), (so, o) = theirs.request("POST", "/infill", body), ours.request("POST", "/infill", body)
    assert st == so == 200, (t, o)
    assert o["prompt"] == t["prompt"] and o["tokens_evaluated"] == t["tokens_evaluated"]
    assert o["content"] == t["content"]


def test_infill_without_fim_tokens_is_llama_servers_501(theirs: Http, ours: Server) -> None:
    """SmolLM2's vocab names no FIM prefix, suffix or middle token: llama-server's 501, word for word."""
    body = {"input_prefix": "def f(", "input_suffix": ")"}
    (st, t), (so, o) = _both(theirs, ours, "/infill", body)
    assert st == so == 501 and o == t


def test_infill_needs_its_parts(fim_pair: tuple[Http, Server]) -> None:
    _, ours = fim_pair
    for body, named in [({"input_suffix": "x"}, "input_prefix"), ({"input_prefix": "x"}, "input_suffix"),
                        ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a"}]}, "text"),
                        ({"input_prefix": {"a": 1}, "input_suffix": "y"}, "input_prefix")]:
        status, answer = ours.request("POST", "/infill", body)
        assert status == 400 and named in answer["error"]["message"], answer


def test_the_docs_llama_server_script_runs_unchanged(theirs: Http, ours: Server,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """docs/serve.md's script written for llama-server (/completion with n_predict, n_probs and cache_prompt,
    /apply-template, /tokenize with pieces, /props, slot save and restore) runs against both servers unchanged and
    prints the same (the same text at temperature 0 on the native backend: its bits are llama.cpp's)."""
    from support import REPO

    text = (REPO / "docs" / "serve.md").read_text(encoding="utf-8")
    script = text.split("### A script written for llama-server", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    printed = []
    for host, port in ((theirs.host, theirs.port), (ours.host, ours.port)):
        exec(compile(script.replace("http://127.0.0.1:8080", f"http://{host}:{port}"), "docs/serve.md", "exec"), {})
        printed.append(capsys.readouterr().out)
    assert printed[0].endswith("capital.bin True\n"), printed[0]
    # the pure backend's greedy path may part from llama.cpp's after a few tokens: compare from the template on
    same = printed[1] == printed[0] if EXACT else printed[1].split("<|im_start|>", 1)[1] == printed[0].split(
        "<|im_start|>", 1)[1]
    assert same, printed


# ---------------------------------------------------------------------------------------------------------------------
# POST /rerank (/reranking, /v1/rerank, /v1/reranking) on a synthetic Qwen3 reranker
# ---------------------------------------------------------------------------------------------------------------------

#: relevance scores: llama.cpp's within float32 rounding on the native backend (the same kernels); the pure backend
#: multiplies float32 activations by dequantized weights where ggml first rounds each activation row to Q8_0:
#: within 0.02 on these models
SCORE_TOL = 1e-4 if EXACT else 2e-2
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital and largest city of France.", "Berlin is the capital of Germany.",
             "The cat sat on the mat.", "France's capital, Paris, lies on the Seine.", "x"]
RERANKERS = ["qwen3-reranker", "qwen3-reranker-plain"]


@pytest.fixture(scope="module", params=RERANKERS)
def rerank_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Http, Server]]:
    """llama-server with --reranking and `minillama serve --reranking` (or --pooling rank) on a synthetic Qwen3
    reranker (rank pooling, the yes/no head cls.output.weight; with a rerank prompt, or joined by bos/eos)."""
    from support.synthetic import generator

    xlc = pytest.importorskip("xllamacpp")
    path = tmp_path_factory.mktemp("rerank") / f"{request.param}.gguf"
    generator().write_model(request.param, path)
    rank = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    server, theirs = llama_server(path, 512, embedding=True, pooling_type=rank)
    # --pooling rank is --reranking here (embeddings are always on)
    ours = Server(path, "-c", "512", *(["--reranking"] if request.param == "qwen3-reranker" else ["--pooling", "rank"]))
    yield theirs, ours
    ours.stop()
    del server


def _same_ranking(t: list[dict], o: list[dict], label: str) -> None:
    assert [set(r) for r in o] == [set(r) for r in t]
    assert [r[label] for r in o] == pytest.approx([r[label] for r in t], abs=SCORE_TOL)
    # the same order, except between scores closer than the tolerance
    for a, b in zip(o, t, strict=True):
        assert a["index"] == b["index"] or abs(a[label] - b[label]) <= 2 * SCORE_TOL


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
def test_rerank_scores_are_llama_servers(rerank_pair: tuple[Http, Server], path: str) -> None:
    """Jina's request {query, documents, top_n}: the same answer as llama-server's (model, object, usage, results
    best first with index and relevance_score), the scores within float32 rounding."""
    theirs, ours = rerank_pair
    body = {"query": QUERY, "documents": DOCUMENTS}
    (st, t), (so, o) = _both(theirs, ours, path, body)
    assert st == so == 200, (t, o)
    assert set(o) == set(t) == {"model", "object", "usage", "results"}
    assert o["usage"] == t["usage"] and o["object"] == t["object"] == "list"
    assert len(t["results"]) == len(DOCUMENTS)
    assert len({round(r["relevance_score"], 3) for r in t["results"]}) > 2  # the head separates the documents
    _same_ranking(t["results"], o["results"], "relevance_score")
    (_, t), (_, o) = _both(theirs, ours, path, {**body, "top_n": 2, "model": "any"})
    assert o["model"] == t["model"] == "any" and len(o["results"]) == len(t["results"]) == 2
    _same_ranking(t["results"], o["results"], "relevance_score")


def test_rerank_tei_form_is_llama_servers(rerank_pair: tuple[Http, Server]) -> None:
    """TEI's request {query, texts, return_text}: a bare list of {index, score, text}, as llama-server answers."""
    theirs, ours = rerank_pair
    for body in ({"query": QUERY, "texts": DOCUMENTS, "return_text": True}, {"query": QUERY, "texts": DOCUMENTS[:2]}):
        (st, t), (so, o) = _both(theirs, ours, "/rerank", body)
        assert st == so == 200 and isinstance(t, list) and isinstance(o, list), (t, o)
        _same_ranking(t, o, "score")
        assert [r.get("text") for r in o] == [r.get("text") for r in t]


def test_rerank_errors_are_llama_servers(rerank_pair: tuple[Http, Server]) -> None:
    """No query, a query that is not a string, no documents: 400 with llama.cpp's error object on both."""
    theirs, ours = rerank_pair
    for body in ({"documents": DOCUMENTS}, {"query": 5, "documents": DOCUMENTS}, {"query": QUERY},
                 {"query": QUERY, "documents": []}):
        (st, t), (so, o) = _both(theirs, ours, "/rerank", body)
        assert st == so == 400, (body, t, o)
        assert set(o["error"]) == set(t["error"]) and o["error"]["type"] == t["error"]["type"], (t, o)


def test_rerank_without_the_flag_is_llama_servers_501(theirs: Http, ours: Server) -> None:
    """A server started without --reranking answers /rerank with llama-server's 501."""
    body = {"query": QUERY, "documents": DOCUMENTS}
    for path in ("/rerank", "/v1/reranking"):
        (st, t), (so, o) = _both(theirs, ours, path, body)
        assert st == so == 501 and o == t, (t, o)


# ---------------------------------------------------------------------------------------------------------------------
# the context's end without context shift (llama-server's default)
# ---------------------------------------------------------------------------------------------------------------------

SMALL_CTX = 256  # what -c 100 gives: llama.cpp rounds a context up to a multiple of 256


@pytest.fixture(scope="module")
def small_ctx() -> Iterator[tuple[Http, Server]]:
    """llama-server with a context of 256 and ours with -c 100, which holds 256 too (llama-server's -c 100 would as
    well, but its batch would then be 100 tokens, which changes how its prompts are cut into passes)."""
    server, theirs = llama_server(real_gguf(), SMALL_CTX)
    ours = Server(real_gguf(), "-c", "100")
    yield theirs, ours
    ours.stop()
    del server


@pytest.mark.parametrize("n_prompt", [SMALL_CTX - 6, SMALL_CTX - 1])
def test_generation_stops_at_the_context_as_llama_server(small_ctx: tuple[Http, Server], n_prompt: int) -> None:
    """Without context shift a generation stops when the context is full: the same tokens, stop_type limit and
    truncated, as llama-server."""
    theirs, ours = small_ctx
    body = {"prompt": [504] + [3575] * (n_prompt - 1), "n_predict": -1, "temperature": 0, "ignore_eos": True,
            "return_tokens": True}
    (st, t), (so, o) = _both(theirs, ours, "/completion", body)
    assert st == so == 200, (t, o)
    for key in ("tokens_predicted", "stop_type", "truncated", "tokens_evaluated"):
        assert o[key] == t[key], (key, o[key], t[key])
    assert t["truncated"] is True and t["stop_type"] == "limit"
    if EXACT:
        assert o["tokens"] == t["tokens"]


def test_a_prompt_filling_the_context_is_llama_servers_error(small_ctx: tuple[Http, Server]) -> None:
    """A prompt as long as the context (or longer) leaves no room: llama-server's exceed_context_size_error."""
    theirs, ours = small_ctx
    assert ours.request("GET", "/props")[1]["default_generation_settings"]["n_ctx"] == \
        theirs.request("GET", "/props")[1]["default_generation_settings"]["n_ctx"] == SMALL_CTX
    for n in (SMALL_CTX, SMALL_CTX + 1):
        (st, t), (so, o) = _both(theirs, ours, "/completion", {"prompt": [504] * n, "n_predict": 4})
        assert st == so == 400 and o["error"]["type"] == t["error"]["type"] == "exceed_context_size_error", (n, t, o)


@pytest.fixture(scope="module")
def shifting() -> Iterator[tuple[Http, Server]]:
    """llama-server and ours with a context of 256 and --context-shift."""
    server, theirs = llama_server(real_gguf(), SMALL_CTX, ctx_shift=True)
    ours = Server(real_gguf(), "-c", "100", "--context-shift")
    yield theirs, ours
    ours.stop()
    del server


@pytest.mark.parametrize("n_keep, n_prompt, n_predict", [(0, 200, 300), (10, 240, 250), (-1, 60, 450)])
def test_context_shift_goes_on_as_llama_server(shifting: tuple[Http, Server], n_keep: int, n_prompt: int,
                                               n_predict: int) -> None:
    """--context-shift: a generation that fills the context drops half the positions after n_keep (plus the bos;
    -1: the prompt's) and goes on, once or several times (the cache's cells then hold [kept][new][old moved back],
    keys rotated by their move): the same tokens as llama-server (greedy; the first ones on the pure backend, whose
    float32 blocks drift from llama.cpp's over hundreds of tokens, but which shifts as well)."""
    theirs, ours = shifting
    prompt = "The history of the city begins in the Roman period, when a small settlement grew on the river. " * 30
    ids = theirs.request("POST", "/tokenize", {"content": prompt})[1]["tokens"][:n_prompt - 1]
    body = {"prompt": ids, "n_predict": n_predict, "n_keep": n_keep, "temperature": 0, "ignore_eos": True,
            "return_tokens": True}
    (st, t), (so, o) = _both(theirs, ours, "/completion", body)
    assert st == so == 200, (t, o)
    assert t["tokens_predicted"] == n_predict and t["truncated"] is True
    assert o["tokens_predicted"] == n_predict and o["truncated"] is True
    if EXACT:
        assert o["tokens"] == t["tokens"]
    else:
        assert o["tokens"][:SHORT] == t["tokens"][:SHORT]


def test_rerank_without_a_rank_head_scores_as_llama_server() -> None:
    """--reranking on a model with no rank head (SmolLM2): llama-server scores with the last hidden state's first
    value and so does minillama, whose log warns at start."""
    xlc = pytest.importorskip("xllamacpp")
    server, theirs = llama_server(real_gguf(), 512, embedding=True,
                                  pooling_type=xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK)
    ours = Server(real_gguf(), "-c", "512", "--reranking")
    try:
        body = {"query": QUERY, "documents": DOCUMENTS[:3]}
        (st, t), (so, o) = _both(theirs, ours, "/rerank", body)
        assert st == so == 200 and o["usage"] == t["usage"], (t, o)
        # a hidden state's value (about -1.5 here), not a probability: the pure backend, which does not round the
        # activations to Q8_0 before each of the 30 blocks' products as ggml does, is a few percent off
        tol = 1e-4 if EXACT else 0.1
        by_index = [{r["index"]: r["relevance_score"] for r in x["results"]} for x in (o, t)]
        assert [by_index[0][i] for i in range(3)] == pytest.approx([by_index[1][i] for i in range(3)], abs=tol,
                                                                   rel=tol)
        assert "has no rank head" in "".join(ours.log)
    finally:
        ours.stop()
        del server
