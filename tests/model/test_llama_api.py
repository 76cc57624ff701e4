"""minillama.api.Llama: completions, chat, streaming, stop strings, logprobs, JSON output, embeddings
and concurrent sessions, in the OpenAI shapes.

A tiny random llama with the package's demo vocab and a chat template is written here; the real SmolLM2 runs
too when MINILLAMA_TEST_GGUF names it. Expected values come from the definitions: the stop string's first
occurrence in the same seeded run, numpy's log_softmax of the model's logits, the schema (jsonschema), a
normalised mean of the final hidden states whose product with the output matrix is the logits.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gguf
import jsonschema
import numpy as np
import pytest

from minillama.api import Llama, token_text
from minillama.errors import ArgumentError, ContextLengthError, MinillamaError
from minillama.gguffile.writer import _tokenizer_value
from minillama.tokenizer import default_vocab_path
from minillama.tokenizer.formats import read_metadata

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_CTX = 32, 48, 4, 2, 256

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}


def write_tiny_chat_model(path: Path, template: str | None = TEMPLATE) -> Path:
    """A one-block llama over the demo vocab (1,000 tokens, eos 999) with a chat template (None: none); random
    weights."""
    md = read_metadata(str(default_vocab_path()))
    n_vocab = len(md["tokenizer.ggml.tokens"])
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    for key, value in md.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, *_tokenizer_value(key, value))
    if template is not None:
        w.add_chat_template(template)
    d, kv = N_EMBD, N_HEAD_KV * N_EMBD // N_HEAD
    shapes = {"token_embd.weight": (n_vocab, d), "output_norm.weight": (d,), "blk.0.attn_norm.weight": (d,),
              "blk.0.attn_q.weight": (d, d), "blk.0.attn_k.weight": (kv, d), "blk.0.attn_v.weight": (kv, d),
              "blk.0.attn_output.weight": (d, d), "blk.0.ffn_norm.weight": (d,), "blk.0.ffn_gate.weight": (N_FF, d),
              "blk.0.ffn_up.weight": (N_FF, d), "blk.0.ffn_down.weight": (d, N_FF)}
    rng = np.random.default_rng(7)
    for name, shape in shapes.items():
        scale = 1.0 if name.endswith("norm.weight") else 0.5
        arr = np.ones(shape, np.float32) if scale == 1.0 else (rng.standard_normal(shape) * scale).astype(np.float32)
        w.add_tensor(name, arr)
    for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        step()
    return path


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Llama:
    return Llama(write_tiny_chat_model(tmp_path_factory.mktemp("api") / "tiny-chat.gguf"), seed=5, threads=1)


def real_llm() -> Llama:
    path = os.environ.get("MINILLAMA_TEST_GGUF")
    if not path:
        pytest.skip("MINILLAMA_TEST_GGUF is not set (a real model, e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    return _real(path)


_REAL: dict[str, Llama] = {}


def _real(path: str) -> Llama:
    if path not in _REAL:
        _REAL[path] = Llama(path, seed=3)
    return _REAL[path]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


# ---------------------------------------------------------------------------------------------------------------------
# shapes


def test_completion_shape(llm: Llama) -> None:
    r = llm.create_completion("Tokenizers cut text", max_tokens=5, seed=1)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and isinstance(r["created"], int)
    assert r["model"] == "tiny-chat.gguf"
    (choice,) = r["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"} and choice["logprobs"] is None
    u = r["usage"]
    assert u["prompt_tokens"] == len(llm.tokenize("Tokenizers cut text", parse_special=True))
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert choice["finish_reason"] in ("stop", "length")
    assert (choice["finish_reason"] == "length") == (u["completion_tokens"] == 5)


def test_chat_shape_uses_the_files_template(llm: Llama) -> None:
    msgs = [{"role": "user", "content": "Hi!"}]
    r = llm.create_chat_completion(msgs, max_tokens=4, seed=2)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    assert r["choices"][0]["message"]["role"] == "assistant"
    rendered = "<|user|>Hi!\n<|assistant|>"  # TEMPLATE rendered by hand
    assert r["usage"]["prompt_tokens"] == len(llm.tokenize(rendered, parse_special=True))


def test_finish_reason_length_and_echo(llm: Llama) -> None:
    r = llm.create_completion("Hello", max_tokens=3, echo=True, seed=4, logit_bias={llm.tokenizer.eos_id: -np.inf})
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 3
    assert r["choices"][0]["text"].startswith("Hello")


def test_finish_reason_stop_at_eos(llm: Llama) -> None:
    """A large logit_bias on eos makes it the first token: finish_reason "stop", no text (eos is not text)."""
    r = llm.create_completion("Hello", max_tokens=8, logit_bias={str(llm.tokenizer.eos_id): 100.0}, seed=1)
    assert r["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}
    assert r["usage"]["completion_tokens"] == 1


def test_max_tokens_none_runs_to_the_context(llm: Llama) -> None:
    p = llm.tokenize("Hello", parse_special=True)
    r = llm.create_completion(p, max_tokens=None, logit_bias={llm.tokenizer.eos_id: -np.inf}, seed=1)
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["total_tokens"] == N_CTX


def test_n_ctx_caps_the_context(llm: Llama) -> None:
    small = Llama(llm.model_path, n_ctx=32, threads=1)
    r = small.create_completion("Hello", max_tokens=None, logit_bias={small.tokenizer.eos_id: -np.inf}, seed=1)
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["total_tokens"] == 32
    with pytest.raises(ContextLengthError, match="the prompt has 40 tokens but the model's context holds 32"):
        small.create_completion([5] * 40)


def test_prompt_longer_than_the_context(llm: Llama) -> None:
    with pytest.raises(ContextLengthError, match=f"{N_CTX + 4} tokens .* holds {N_CTX}"):
        llm.create_completion([5] * (N_CTX + 4))


def test_bad_arguments_are_minillama_errors(llm: Llama) -> None:
    for kwargs in ({"temperature": -1}, {"min_p": 2}, {"top_p": 0}, {"logprobs": 9}, {"stop": [3]},
                   {"logit_bias": {"x": 1}}, {"repeat_penalty": 0}, {"response_format": {"type": "xml"}},
                   {"max_tokens": "5"}):
        with pytest.raises(MinillamaError):
            llm.create_completion("Hi", **kwargs)
    with pytest.raises(MinillamaError):
        llm.create_chat_completion("Hi")
    with pytest.raises(ArgumentError, match="top_logprobs needs logprobs"):
        llm.create_chat_completion([{"role": "user", "content": "Hi"}], top_logprobs=2)


# ---------------------------------------------------------------------------------------------------------------------
# streaming and stop strings


def _stream_text(chunks, key: str = "text") -> tuple[str, str | None]:
    text, finish = "", None
    for c in chunks:
        ch = c["choices"][0]
        text += ch[key] if key == "text" else ch["delta"].get("content", "")
        finish = ch["finish_reason"] or finish
    return text, finish


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streamed_text_equals_non_streamed(llm: Llama, seed: int) -> None:
    kw = {"max_tokens": 24, "seed": seed, "temperature": 0.9}
    r = llm.create_completion("Once upon", **kw)
    assert _stream_text(llm.create_completion("Once upon", stream=True, **kw)) == \
        (r["choices"][0]["text"], r["choices"][0]["finish_reason"])
    msgs = [{"role": "user", "content": "Tell me"}]
    c = llm.create_chat_completion(msgs, **kw)
    chunks = list(llm.create_chat_completion(msgs, stream=True, **kw))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(k["object"] == "chat.completion.chunk" and k["id"] == chunks[0]["id"] for k in chunks)
    assert _stream_text(chunks, "delta") == (c["choices"][0]["message"]["content"], c["choices"][0]["finish_reason"])


def _stop_candidates(text: str) -> list[str]:
    """Three-character pieces of text from its middle (that usually span a token boundary)."""
    return [text[i:i + 3] for i in range(len(text) // 3, len(text) - 3, 2) if text[i:i + 3].strip()]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_stop_string_ends_the_text_before_it(llm: Llama, seed: int) -> None:
    """With the same seed the run is the same up to the stop string: the text is everything before its first
    occurrence, the stop string never appears, finish_reason is "stop" -- streamed and not."""
    kw = {"max_tokens": 40, "seed": seed, "temperature": 1.0, "logit_bias": {llm.tokenizer.eos_id: -np.inf}}
    full = llm.create_completion("The", **kw)["choices"][0]["text"]
    stops = _stop_candidates(full)
    assert stops, full
    for stop in stops[:3]:
        expected = full[:full.index(stop)]
        r = llm.create_completion("The", stop=[stop, "\x00never"], **kw)
        assert r["choices"][0]["text"] == expected and stop not in r["choices"][0]["text"]
        assert r["choices"][0]["finish_reason"] == "stop"
        streamed = list(llm.create_completion("The", stop=stop, stream=True, **kw))
        assert _stream_text(streamed) == (expected, "stop")
        # the streamed pieces never show part of the stop string that is later taken back
        seen = ""
        for c in streamed:
            seen += c["choices"][0]["text"]
            assert expected.startswith(seen)


def test_stop_string_split_over_tokens(llm: Llama) -> None:
    """A stop string made of the last characters of one token and the first of the next is found."""
    kw = {"max_tokens": 30, "seed": 9, "temperature": 1.0, "logit_bias": {llm.tokenizer.eos_id: -np.inf}}
    r = llm.create_completion("A", logprobs=0, **kw)
    tokens = r["choices"][0]["logprobs"]["tokens"]
    text = r["choices"][0]["text"]
    i = next(i for i in range(3, len(tokens) - 1) if len(tokens[i]) >= 2 and len(tokens[i + 1]) >= 2
             and "\ufffd" not in tokens[i] + tokens[i + 1])
    stop = tokens[i][-1] + tokens[i + 1][0]
    expected = text[:text.index(stop)]
    assert llm.create_completion("A", stop=stop, **kw)["choices"][0]["text"] == expected


# ---------------------------------------------------------------------------------------------------------------------
# logprobs


def test_completion_logprobs_are_log_softmax_of_the_logits(llm: Llama) -> None:
    prompt = llm.tokenize("Tokenizers cut", parse_special=True)
    r = llm.create_completion(prompt, max_tokens=6, logprobs=3, temperature=0.7, seed=11,
                              logit_bias={llm.tokenizer.eos_id: -np.inf}, repeat_penalty=1.3)
    lp = r["choices"][0]["logprobs"]
    gen_ids: list[int] = []
    offsets = []
    for tok_text, tok_lp, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        # where the token's text starts: the characters before it that are whole (a character split over byte
        # tokens starts where its first byte does)
        whole = codecs.getincrementaldecoder("utf-8")("replace").decode(
            llm.tokenizer.decode_bytes(gen_ids, remove_special=True), final=False)
        offsets.append(len(whole))
        ref = log_softmax(llm.model.logits(prompt + gen_ids)[-1])  # raw logits: before bias, penalty, temperature
        best = np.argsort(-ref, kind="stable")[:3]
        assert sorted(top.values(), reverse=True) == pytest.approx(ref[best].tolist(), abs=1e-4)
        assert set(top) == {token_text(llm.tokenizer.token_to_piece(int(t))) for t in best}
        token = next(int(t) for t in np.flatnonzero(np.isclose(ref, tok_lp, atol=1e-4))
                     if token_text(llm.tokenizer.token_to_piece(int(t))) == tok_text)
        gen_ids.append(token)
    assert llm.tokenizer.decode(gen_ids) == r["choices"][0]["text"]
    assert lp["text_offset"] == offsets


def test_token_text_names_partial_characters_as_bytes() -> None:
    assert token_text(b" llamas") == " llamas" and token_text("é".encode()[:1]) == "bytes:\\xc3"


def test_chat_logprobs_shape_and_values(llm: Llama) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    r = llm.create_chat_completion(msgs, max_tokens=5, logprobs=True, top_logprobs=2, seed=3,
                                   logit_bias={llm.tokenizer.eos_id: -np.inf})
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] == 5
    prompt = llm._chat_prompt(msgs, {})
    ids: list[int] = []
    for e in content:
        ref = log_softmax(llm.model.logits(prompt + ids)[-1])
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == pytest.approx(ref.max(), abs=1e-4)
        cands = [int(t) for t in np.flatnonzero(np.isclose(ref, e["logprob"], atol=1e-4))
                 if list(llm.tokenizer.token_to_piece(int(t))) == e["bytes"]]
        assert cands, e
        ids.append(cands[0])
    assert bytes(b for e in content for b in e["bytes"]).decode() == r["choices"][0]["message"]["content"]
    streamed = list(llm.create_chat_completion(msgs, max_tokens=5, logprobs=True, top_logprobs=2, seed=3,
                                               logit_bias={llm.tokenizer.eos_id: -np.inf}, stream=True))
    got = [e for c in streamed if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    # the streamed call finds the prompt in the first call's cache: on the pure backend its last-row pass sums in
    # another order than the whole prompt's (BLAS), so its log-probs may move in the last float32 bits
    assert [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in got] == \
        [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in content]
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in content], abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# constrained output


def test_json_schema_output_validates(llm: Llama) -> None:
    pytest.importorskip("llguidance", reason="the json extra (llguidance) is not installed")
    rf = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    for seed in range(6):
        r = llm.create_chat_completion([{"role": "user", "content": "JSON please"}], response_format=rf, seed=seed,
                                       temperature=1.0, max_tokens=200)
        assert r["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), SCHEMA)


def test_response_format_without_the_extra(llm: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_llguidance(name, *args, **kwargs):
        if name == "llguidance":
            raise ImportError("No module named 'llguidance'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llguidance)
    with pytest.raises(MinillamaError, match=r'optional extra "json" \(llguidance\): pip install'):
        llm.create_completion("Hi", response_format={"type": "json_object"})
    assert llm.create_completion("Hi", max_tokens=2, response_format={"type": "text"})["choices"]


def test_real_model_json(request: pytest.FixtureRequest) -> None:
    pytest.importorskip("llguidance", reason="the json extra (llguidance) is not installed")
    real = real_llm()
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Name a big city and its population as JSON."}]
    r = real.create_chat_completion(msgs, response_format={"type": "json_schema", "json_schema": {"schema": schema}},
                                    max_tokens=64, seed=1)
    assert r["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    r = real.create_chat_completion(msgs, response_format={"type": "json_object"}, max_tokens=96, temperature=0)
    assert r["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)


def test_real_model_stop_and_stream() -> None:
    real = real_llm()
    kw = {"max_tokens": 12, "temperature": 0}
    full = real.create_completion("The capital of France is", **kw)["choices"][0]["text"]
    assert full.startswith(" Paris")  # llama.cpp's greedy continuation (README: minillama generate)
    r = real.create_completion("The capital of France is", stop=["aris"], **kw)
    assert r["choices"][0]["text"] == " P" and r["choices"][0]["finish_reason"] == "stop"
    assert _stream_text(real.create_completion("The capital of France is", stream=True, **kw)) == \
        (full, "length" if real.create_completion("The capital of France is", **kw)["usage"][
            "completion_tokens"] == 12 else "stop")


# ---------------------------------------------------------------------------------------------------------------------
# embeddings, tokens


def test_embedding_is_the_normalised_mean_of_the_final_hidden_state(llm: Llama) -> None:
    texts = ["Hello, llamas!", "Tokenizers cut text into pieces."]
    r = llm.create_embedding(texts)
    assert r["object"] == "list" and [d["index"] for d in r["data"]] == [0, 1]
    for text, d in zip(texts, r["data"], strict=True):
        ids = llm.tokenize(text, parse_special=True)
        h = llm.model.hidden(ids)
        # the hidden state is what the output matrix turns into the logits
        np.testing.assert_allclose(llm.model._output(h), llm.model.logits(ids), rtol=1e-4, atol=1e-4)
        v = h.astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(d["embedding"], v / np.linalg.norm(v), rtol=1e-6, atol=1e-7)
        assert d["object"] == "embedding" and np.linalg.norm(d["embedding"]) == pytest.approx(1.0)
    assert r["usage"]["prompt_tokens"] == sum(len(llm.tokenize(t, parse_special=True)) for t in texts)
    assert llm.pooling == "mean"  # the file has no {arch}.pooling_type


# ---------------------------------------------------------------------------------------------------------------------
# reranking

RERANK_QUERY = "What is the capital of France?"
RERANK_DOCUMENTS = ["Paris is the capital and largest city of France.", "Berlin is the capital of Germany.",
                    "The cat sat on the mat.", "France's capital, Paris, lies on the Seine.", "x"]
#: llama-server's /rerank relevance scores (xllamacpp, --reranking, 1 thread) for RERANK_QUERY and each document, on
#: the seed-0 synthetic rerankers of tools/make_synthetic_arch.py (their sha256 first), and its usage.prompt_tokens
RERANK_EXPECTED: dict[str, tuple[str, list[float], int]] = {
    "qwen3-reranker": ("9bca4f9dd211ce44672711c33c7322b2bd40be36db3ffe3a9af895b2eb6bf6ca",
                       [0.06851417571306229, 0.07290568947792053, 0.05829763039946556, 0.07039298117160797,
                        0.08667021989822388], 237),
    "qwen3-reranker-plain": ("4efafa1a1106d8e39567e9b41906d20dbe345fb43a63c9feb88cff57fab251d6",
                             [0.6879385113716125, 0.7769804000854492, 0.6720725297927856, 0.749215841293335,
                              0.8360911011695862], 156),
}
#: the pure backend multiplies float32 activations by dequantized weights, where ggml (and the native backend)
#: first rounds each activation row to Q8_0: its scores stay within 0.02 of llama.cpp's here, in the same order
RERANK_TOL = 1e-4 if os.environ.get("MINILLAMA_BACKEND", "native") != "pure" else 2e-2


@pytest.mark.parametrize("name", list(RERANK_EXPECTED))
def test_rank_gives_llama_servers_relevance_scores(tmp_path: Path, name: str) -> None:
    """Llama.rank on a Qwen3 reranker (rank pooling, the yes/no head cls.output.weight; its rerank prompt, or
    bos/query/eos/document/eos): llama-server's scores, within float32 rounding on the native backend."""
    import hashlib

    from support.synthetic import generator

    path = tmp_path / f"{name}.gguf"
    generator().write_model(name, path)
    sha, expected, n_tokens = RERANK_EXPECTED[name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    llm = Llama(path, threads=1)
    assert llm.pooling == "rank"  # the file's pooling_type 4
    scores = llm.rank(RERANK_QUERY, RERANK_DOCUMENTS)
    assert scores == pytest.approx(expected, abs=RERANK_TOL)
    assert np.argsort(scores).tolist() == np.argsort(expected).tolist()
    assert sum(len(llm.rerank_ids(RERANK_QUERY, d)) for d in RERANK_DOCUMENTS) == n_tokens
    with pytest.raises(MinillamaError, match="rank"):
        llm.create_embedding("Hello")
    assert Llama(path, pooling_type=4, threads=1).pooling == "rank"
    assert Llama(path, pooling="mean", threads=1).create_embedding("Hello")["data"][0]["embedding"]


def test_rank_refuses_what_llama_cpp_refuses(llm: Llama, tmp_path: Path) -> None:
    """pooling_type 5 is no pooling; documents must be texts."""
    with pytest.raises(ArgumentError, match="pooling_type"):
        Llama(llm.model_path, pooling_type=5)
    with pytest.raises(MinillamaError, match="documents"):
        llm.rank("q", "one document")  # type: ignore[arg-type]
    with pytest.raises(MinillamaError, match="documents"):
        llm.rank("q", ["a", 5])  # type: ignore[list-item]


def test_tokenize_detokenize(llm: Llama) -> None:
    ids = llm.tokenize(b"Hello, llamas!", add_special=False)
    assert ids == llm.tokenizer.encode("Hello, llamas!", add_special=False)
    assert llm.detokenize(ids) == b"Hello, llamas!"


# ---------------------------------------------------------------------------------------------------------------------
# concurrency and cancellation


def test_threads_each_drive_their_own_session(llm: Llama) -> None:
    """8 requests on 8 threads at once give exactly what each gives alone (no state shared in the forward pass)."""
    kw = {"max_tokens": 20, "temperature": 1.0, "logit_bias": {llm.tokenizer.eos_id: -np.inf}}
    prompts = ["Once upon a time", "Hello", "Tokenizers cut text", "The end"]
    alone = {(p, s): llm.create_completion(p, seed=s, **kw)["choices"][0]["text"] for p in prompts for s in (1, 2)}
    got: dict[tuple[str, int], str] = {}
    barrier = threading.Barrier(len(alone))

    def run(p: str, s: int) -> None:
        barrier.wait()
        got[p, s] = _stream_text(llm.create_completion(p, seed=s, stream=True, **kw))[0]

    threads = [threading.Thread(target=run, args=key) for key in alone]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == alone


def test_closing_a_stream_ends_the_generation_and_the_next_call_reuses_its_cache(
        llm: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """As llama-cpp-python keeps its context when a stream is left early: no step after close, and the next call
    reprocesses only what its prompt adds to the ids the closed stream had fed."""
    calls = [0]
    make = Llama.session

    def tracked(self: Llama):
        s = make(self)
        step = s.logits_next

        def counted(ids):
            calls[0] += 1
            return step(ids)

        s.logits_next = counted
        return s

    monkeypatch.setattr(Llama, "session", tracked)
    monkeypatch.setattr(llm, "_idle", None)  # a session of its own, not the last finished call's
    it = llm.create_completion("Once", max_tokens=200, stream=True, seed=1, logit_bias={llm.tokenizer.eos_id: -np.inf})
    first = [next(it), next(it), next(it)]
    assert first[1]["choices"][0]["finish_reason"] is None
    n = calls[0]
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert calls[0] == n  # no step after close
    prompt = llm.tokenize(b"Once")
    again = llm.create_completion(prompt + [13], max_tokens=1, temperature=0)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt)


def test_a_call_reuses_the_last_finished_calls_cache(llm: Llama) -> None:
    """As llama-cpp-python keeps its context: a chat's next turn reprocesses only what it adds to the last call's
    prompt and reply; calls running at once each get a session of their own."""
    kw = {"max_tokens": 4, "temperature": 0, "seed": 1}
    msgs = [{"role": "user", "content": "Name a colour."}]
    first = llm.create_chat_completion(msgs, **kw)
    msgs += [first["choices"][0]["message"], {"role": "user", "content": "And another?"}]
    second = llm.create_chat_completion(msgs, **kw)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    a = llm.create_completion("Once", max_tokens=50, stream=True, seed=1)
    b = llm.create_completion("Once", max_tokens=50, stream=True, seed=1)
    next(a), next(b)
    assert a._gen.model is not b._gen.model  # type: ignore[attr-defined]
    a.close(), b.close()


@contextlib.contextmanager
def _counting_passes(model) -> Iterator[list[int]]:
    """model.batcher's passes while inside, as their row counts."""
    passes: list[int] = []
    run = model.batcher.run_batch

    def counted(tokens, batch):
        passes.append(len(tokens))
        return run(tokens, batch)

    model.batcher.run_batch = counted
    try:
        yield passes
    finally:
        model.batcher.run_batch = run


def test_steps_queued_ahead_choose_what_steps_asked_one_by_one_choose(llm: Llama) -> None:
    """A batched session asked with `ahead` queues each next step as the last one's pass ends (it runs while the
    caller handles the token): the same choices as steps asked for one at a time, and no pass beyond the last one
    asked for when `ahead` counts them exactly."""
    from minillama.sampling import Sampler

    model = llm.model
    prompt = llm.tokenize(b"Once upon a time")

    def run(ahead: bool) -> tuple[list[int], list[int]]:
        with _counting_passes(model) as passes:
            s, sampler, ids = model.session(batched=True), Sampler(temperature=0.9, seed=11), list(prompt)
            for k in range(12):
                ids.append(s.next_token(ids, sampler, ahead=11 - k if ahead else 0))
            s.cached_ids  # noqa: B018 - waits for a step queued ahead, if any
        return ids, passes

    one_by_one, passes_one = run(False)
    queued, passes_queued = run(True)
    assert queued == one_by_one
    assert passes_one == passes_queued == [1] * 11  # the prompt is one pass of its own, then 11 single steps


def test_a_batched_completion_queues_its_steps_ahead(llm: Llama) -> None:
    """Llama(batch_steps=True) (a server with several slots) runs each step of a plain completion ahead (Generation
    asks with `ahead`): the same text as unbatched steps, one pass per token and none after the last."""
    batched = Llama(llm.model_path, batch_steps=True, threads=1)
    batcher = batched.model.batcher
    asked: list[int] = []  # `ahead` of each step asked for; the others were queued ahead
    run, run_batch = batcher.run, batcher.run_batch
    batcher.run = lambda *a, **kw: asked.append(a[5]) or run(*a, **kw)  # type: ignore[method-assign]
    # a pass as slow as a real model's: the asker is back waiting before it ends (a tiny one's pass is quicker
    # than the asker's handling of its token, and then the next step is asked for, not queued)
    batcher.run_batch = lambda tokens, batch: (run_batch(tokens, batch), time.sleep(0.05))[0]
    with _counting_passes(batched.model) as passes:
        got = batched.create_completion("Once upon", max_tokens=9, temperature=0.8, seed=4, stream=True)
        text = "".join(c["choices"][0]["text"] for c in got)
        time.sleep(0.05)
    assert text == llm.create_completion("Once upon", max_tokens=9, temperature=0.8, seed=4)["choices"][0]["text"]
    assert passes == [1] * 8 and asked == [7]


def test_a_step_queued_ahead_is_dropped_when_the_caller_asks_for_something_else(llm: Llama) -> None:
    """At most one step runs that was not asked for; a caller that then asks for other ids (or with another
    sampler) gets what those ids give, computed after the queued step's pass; stop(id) ends the queue."""
    from minillama.sampling import Sampler

    model = llm.model
    prompt = llm.tokenize(b"Once upon a time")
    with _counting_passes(model) as passes:
        s, sampler, ids = model.session(batched=True), Sampler(temperature=0.9, seed=3), list(prompt)
        for _ in range(5):
            ids.append(s.next_token(ids, sampler, ahead=50))
        held = s.cached_ids  # the queued step's pass done
        assert sum(passes) <= 5  # 4 single steps asked for after the prompt, at most one more queued
        assert held[:len(ids) - 1] == ids[:-1] and len(held) <= len(ids)
        other = ids[:-2] + [(ids[-2] + 1) % model.n_vocab]
        got = s.logits_next(other)
        np.testing.assert_allclose(got, model.logits(other)[-1], rtol=1e-4, atol=1e-4)
        assert s.cached_ids == other
        # another sampler for the very ids a step was queued for: its own choice, not the queued one's
        ids = list(other)
        ids.append(s.next_token(ids, sampler, ahead=50))
        greedy = Sampler(temperature=0)
        assert s.next_token(ids, greedy) == int(np.argmax(model.logits(ids)[-1]))
        # stop(id) true for every id: nothing is queued after a step
        passes.clear()
        for _ in range(3):
            ids.append(s.next_token(ids, sampler, ahead=50, stop=lambda token: True))
        time.sleep(0.05)
        assert passes == [1, 1, 1]


def test_concurrent_steps_share_one_pass(llm: Llama) -> None:
    """Single-token steps of sessions on several threads at once go through the weights together (fewer passes
    than steps), and each session's logits are those of its own sequence run alone."""
    model = llm.model
    passes: list[int] = []
    run = model.batcher.run_batch

    def counted(tokens, batch):  # a pass as slow as a real model's, so the threads' steps meet
        passes.append(len(tokens))
        time.sleep(0.01)
        return run(tokens, batch)

    model.batcher.run_batch = counted
    try:
        prompts = [llm.tokenize(t) for t in ("Once upon a time", "Hello", "Tokenizers cut text", "The end")]
        steps = 12
        logits: dict[int, list[np.ndarray]] = {}
        barrier = threading.Barrier(len(prompts))

        def drive(i: int) -> None:
            s = model.session(batched=True)
            ids = list(prompts[i])
            s.logits_next(ids)
            barrier.wait()
            got = logits[i] = []
            for k in range(steps):
                ids.append(5 + k + i)
                got.append(s.logits_next(ids))

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        model.batcher.run_batch = run
    assert sum(passes) == steps * len(prompts) and len(passes) < steps * len(prompts) and max(passes) > 1
    for i, p in enumerate(prompts):
        ids = list(p) + [5 + k + i for k in range(steps)]
        alone = model.logits(ids)[len(p):]
        np.testing.assert_allclose(np.stack(logits[i]), alone, rtol=1e-4, atol=1e-4)


def test_cancel_from_another_thread_ends_the_stream(llm: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's event loop cancels a stream that a worker thread is iterating (a client gone): the worker's
    stream ends after at most the step under way, and no step starts after cancel()."""
    steps: list[float] = []
    make = Llama.session

    def slow(self: Llama):
        s = make(self)
        step = s.logits_next

        def timed(ids):
            time.sleep(0.02)
            steps.append(time.monotonic())
            return step(ids)

        s.logits_next = timed
        return s

    monkeypatch.setattr(Llama, "session", slow)
    stream = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=200, stream=True, seed=1,
                                        logit_bias={llm.tokenizer.eos_id: -np.inf})
    got: list[dict] = []
    started = threading.Event()

    def worker() -> None:
        for chunk in stream:
            got.append(chunk)
            started.set()

    t = threading.Thread(target=worker)
    t.start()
    assert started.wait(30)
    stream.cancel()
    cancelled = time.monotonic()
    t.join(timeout=30)
    assert not t.is_alive()
    assert len([s for s in steps if s > cancelled]) <= 1  # at most the step under way
    assert len(steps) < 200 and got[-1]["choices"][0]["finish_reason"] is None


def test_a_schema_that_cannot_be_enforced_is_an_argument_error(llm: Llama) -> None:
    pytest.importorskip("llguidance", reason="the json extra (llguidance) is not installed")
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}
    with pytest.raises(ArgumentError, match="expected a JSON schema that llguidance can enforce, found one it "
                                            "rejects: .*foo"):
        llm.create_chat_completion([{"role": "user", "content": "Hi"}], response_format=bad)
    with pytest.raises(ArgumentError, match=r"expected response_format .*json_schema.*, found"):
        llm.create_completion("Hi", response_format={"type": "json_schema"})


# ---------------------------------------------------------------------------------------------------------------------
# content parts, deep nesting, numbers too large for a float
# ---------------------------------------------------------------------------------------------------------------------

def test_chat_content_parts_are_joined_by_newlines(llm: Llama) -> None:
    """OpenAI's content parts: text parts joined by "\\n" as llama.cpp's server joins them (concat_typed_text);
    a part that is not text is refused by name (the model takes text only)."""
    kw = {"max_tokens": 4, "temperature": 0, "seed": 1}
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    a = llm.create_chat_completion([{"role": "user", "content": parts}], **kw)
    b = llm.create_chat_completion([{"role": "user", "content": "Hello\nthere"}], **kw)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    # the same prompt: the second call finds all but its last token in the first's cache
    assert b["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"]
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == a["usage"]["prompt_tokens"] - 1
    with pytest.raises(ArgumentError, match=r"messages\[0\]\.content\[1\].*text only.*'image_url'"):
        llm.create_chat_completion([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}], **kw)


def test_chat_content_nested_5000_deep_is_a_minillama_error(llm: Llama) -> None:
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(MinillamaError):
        llm.create_chat_completion([{"role": "user", "content": deep}], max_tokens=1)
    with pytest.raises(MinillamaError, match="64 levels"):
        llm.tokenizer.apply_chat_template([{"role": "user", "content": deep}], chat_template="{{ messages }}",
                                          tokenize=False)


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": 10**400}, "temperature"), ({"temperature": float("inf")}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"repeat_penalty": 10**400}, "repeat_penalty"),
    ({"presence_penalty": 10**400}, "presence_penalty"), ({"frequency_penalty": -(10**400)}, "frequency_penalty"),
    ({"repeat_penalty": float("inf")}, "repeat_penalty"), ({"repeat_last_n": 10**20}, "repeat_last_n"),
    ({"logit_bias": {5: 10**400}}, "logit_bias")])
def test_numbers_too_large_for_a_float_are_argument_errors(llm: Llama, kwargs: dict, name: str) -> None:
    with pytest.raises(ArgumentError, match=name):
        llm.create_completion("Hi", max_tokens=1, **kwargs)


def test_logit_bias_ids_past_every_vocab_are_skipped(llm: Llama) -> None:
    """As llama.cpp's server skips ids past the vocab (2**70 is past any int32 id), the reply is unchanged."""
    kw = {"max_tokens": 4, "temperature": 0, "seed": 1}
    plain = llm.create_completion("Hello", **kw)["choices"][0]["text"]
    for bias in ({2**70: 50.0}, {str(2**70): 50.0}, {"9" * 5000: 50.0}, {10**6: 50.0}):
        assert llm.create_completion("Hello", logit_bias=bias, **kw)["choices"][0]["text"] == plain


# ---------------------------------------------------------------------------------------------------------------------
# llama-cpp-python's names: constructor keywords, accessors, grammar, state
# ---------------------------------------------------------------------------------------------------------------------

#: llama.cpp's default chat template (common/chat.cpp, CHATML_TEMPLATE_SRC), rendered by hand for one user message.
CHATML_HI = "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"


def test_llama_cpp_python_constructor_keywords(llm: Llama) -> None:
    """The names llama-cpp-python's Llama takes: n_ctx, n_threads, n_batch, seed, embedding, and the GPU and memory
    keywords a CPU runtime has no use for, accepted as ported scripts pass them."""
    other = Llama(llm.model_path, n_ctx=64, n_threads=1, n_threads_batch=1, n_batch=32, n_ubatch=32, seed=7,
                  embedding=True, n_gpu_layers=-1, split_mode=1, main_gpu=0, tensor_split=[1.0], vocab_only=False,
                  use_mmap=False, use_mlock=True, kv_overrides=None, offload_kqv=True, flash_attn=True,
                  logits_all=False, op_offload=None, swa_full=None, no_perf=True, last_n_tokens_size=64,
                  numa=False, type_k=None, type_v=None, verbose=False, rope_freq_base=0.0, rope_freq_scale=0.0)
    assert other.n_ctx() == 64 and other.n_ctx == 64  # llama-cpp-python's method, minillama's count
    assert other.n_batch == 32
    r = other.create_completion("Hello", max_tokens=None, logit_bias={other.tokenizer.eos_id: -np.inf})
    assert r["usage"]["total_tokens"] == 64
    assert len(other.create_embedding("Hello")["data"][0]["embedding"]) == N_EMBD


@pytest.mark.parametrize("kwargs, name", [({"n_gpu_layer": 1}, "n_gpu_layer"), ({"chat_handler": object()},
                                                                               "chat_handler"),
                                          ({"lora_path": "x.gguf"}, "lora_path"), ({"threads": 1, "n_threads": 2},
                                                                                   "n_threads")])
def test_unknown_or_unsupported_constructor_keywords_are_errors(llm: Llama, kwargs: dict, name: str) -> None:
    with pytest.raises(MinillamaError, match=name):
        Llama(llm.model_path, **kwargs)


def test_unknown_call_keywords_are_errors(llm: Llama) -> None:
    """A keyword no create_* method takes is a MinillamaError naming it, never dropped (a grammar misspelt would
    otherwise give free text); template variables go in chat_template_kwargs."""
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(MinillamaError, match="'gramar'"):
        llm.create_completion("Hi", gramar='root ::= "yes"')
    with pytest.raises(MinillamaError, match="'enable_thinking'.*chat_template_kwargs"):
        llm.create_chat_completion(msgs, enable_thinking=False)
    with pytest.raises(MinillamaError, match="'functions'"):
        llm.create_chat_completion(msgs, functions=[])
    with pytest.raises(MinillamaError, match="mirostat_mode"):  # a sampler minillama does not have, switched on
        llm.create_completion("Hi", mirostat_mode=2)
    # llama-cpp-python's sampling keywords at their neutral values are accepted
    r = llm.create_completion("Hi", max_tokens=2, typical_p=1.0, tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0,
                              mirostat_eta=0.1, logits_processor=None, stopping_criteria=None, suffix=None)
    assert r["choices"][0]["finish_reason"] in ("stop", "length")


def test_accessors(llm: Llama) -> None:
    md = read_metadata(str(default_vocab_path()))
    assert llm.n_vocab() == len(md["tokenizer.ggml.tokens"])
    assert llm.token_eos() == md["tokenizer.ggml.eos_token_id"] == 999
    assert llm.token_bos() == md.get("tokenizer.ggml.bos_token_id", -1)


def test_tokenize_and_detokenize_as_llama_cpp_python(tmp_path: Path) -> None:
    """llama-cpp-python's tokenize(text: bytes, add_bos=True, special=False) is llama_tokenize(add_special,
    parse_special); its detokenize(ids, special=False) joins llama_token_to_piece(special) and drops the leading
    space a first bos leaves. Expected values from llama.cpp itself (the oracle) on SmolLM2."""
    from support.oracle import get_oracle

    real = real_llm()
    o = get_oracle(real.model_path)
    text = "Hello <|im_start|>world  naïve"
    for add_bos in (True, False):
        for special in (True, False):
            assert real.tokenize(text.encode(), add_bos, special) == o.tokenize(text, add_bos, special)
            assert real.tokenize(text.encode(), add_bos=add_bos, special=special) == \
                o.tokenize(text, add_bos, special)
    assert real.tokenize(text.encode()) == o.tokenize(text, True, False)
    ids = o.tokenize(text, True, True)
    for special in (False, True):
        want = b"".join(o.piece(i, special) for i in ids)
        assert real.detokenize(ids, special=special) == want
    assert real.detokenize(ids) == b"".join(o.piece(i, False) for i in ids)
    assert (real.n_vocab(), real.token_eos(), real.token_bos()) == (o.n_vocab, o.eos_id, -1 if o.bos_id is None
                                                                     else o.bos_id)


def test_chat_format_names(llm: Llama, tmp_path: Path) -> None:
    """chat_format "chatml" renders with llama.cpp's ChatML template; a name of the file's own family uses the
    file's template; any other name is an ArgumentError naming the choices."""
    msgs = [{"role": "user", "content": "Hi!"}]
    chatml = Llama(llm.model_path, chat_format="chatml", threads=1)
    r = chatml.create_chat_completion(msgs, max_tokens=1, seed=1)
    assert r["usage"]["prompt_tokens"] == len(llm.tokenize(CHATML_HI, parse_special=True))
    with pytest.raises(ArgumentError, match="'llama-2'.*'chatml'"):
        Llama(llm.model_path, chat_format="llama-2", threads=1)
    real = real_llm()  # SmolLM2: a ChatML template of its own, which "chatml" and "qwen" name
    same = Llama(real.model_path, chat_format="chatml", threads=1)
    assert same._chat_template().source == real._chat_template().source
    with pytest.raises(ArgumentError, match="'llama-3'"):
        Llama(real.model_path, chat_format="llama-3", threads=1)


def test_a_model_without_a_chat_template_chats_in_chatml(tmp_path: Path) -> None:
    """As llama-server does (common_chat_templates_init): no tokenizer.chat_template means ChatML."""
    bare = Llama(write_tiny_chat_model(tmp_path / "bare.gguf", template=None), threads=1)
    r = bare.create_chat_completion([{"role": "user", "content": "Hi!"}], max_tokens=2, seed=1)
    assert r["usage"]["prompt_tokens"] == len(bare.tokenize(CHATML_HI, parse_special=True))
    assert bare.chat_template_fallback


def test_grammar_constrains_completions_and_chat(llm: Llama) -> None:
    """grammar= takes llama.cpp's GBNF (LlamaGrammar.from_string, or the text itself): every reply that ends by
    itself is a sentence of the grammar, whatever the seed."""
    pytest.importorskip("llguidance", reason="the json extra (llguidance) is not installed")
    from minillama.api import LlamaGrammar

    g = LlamaGrammar.from_string('root ::= "yes" | "no" | "maybe " [0-9]')
    for seed in range(4):
        r = llm.create_completion("Answer:", grammar=g, max_tokens=16, temperature=1.0, seed=seed)
        text = r["choices"][0]["text"]
        assert r["choices"][0]["finish_reason"] == "stop", text
        assert text in ("yes", "no") or (text[:6] == "maybe " and text[6:].isdigit() and len(text) == 7), text
        c = llm.create_chat_completion([{"role": "user", "content": "Yes?"}], grammar='root ::= "yes"',
                                       max_tokens=16, temperature=1.0, seed=seed)
        assert c["choices"][0]["message"]["content"] == "yes"
    streamed = "".join(ch["choices"][0]["text"] for ch in llm.create_completion(
        "Answer:", grammar=g, max_tokens=16, temperature=1.0, seed=1, stream=True))
    assert streamed == llm.create_completion("Answer:", grammar=g, max_tokens=16, temperature=1.0,
                                             seed=1)["choices"][0]["text"]
    js = LlamaGrammar.from_json_schema(json.dumps(SCHEMA))
    r = llm.create_completion("JSON:", grammar=js, max_tokens=60, temperature=0.7, seed=2)
    if r["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(r["choices"][0]["text"]), SCHEMA)
    for bad in ("root ::= foo", 'root ::= "unclosed'):
        with pytest.raises(ArgumentError, match="grammar"):
            LlamaGrammar.from_string(bad)
    with pytest.raises(ArgumentError, match="grammar.*response_format"):
        llm.create_completion("Hi", grammar=g, response_format={"type": "json_object"})
    with pytest.raises(ArgumentError, match="grammar"):
        llm.create_completion("Hi", grammar=42)


def test_save_state_and_load_state(llm: Llama) -> None:
    """save_state() keeps the last call's KV cache and ids (llama-cpp-python's LlamaState fields); after
    load_state() the next call reuses them: the same reply, its prompt read from the cache."""
    import pickle

    prompt = llm.tokenize("Once upon a time there was", parse_special=True)
    kw = {"max_tokens": 5, "temperature": 0, "seed": 1, "logit_bias": {llm.tokenizer.eos_id: -np.inf}}
    first = llm.create_completion(prompt, **kw)
    state = llm.save_state()
    assert list(state.input_ids[:len(prompt)]) == prompt and state.n_tokens == len(state.input_ids)
    assert state.n_tokens == len(prompt) + 4  # the last pick is never run through the model
    assert state.seed == llm.seed and len(state.llama_state) == state.llama_state_size > 0
    state = pickle.loads(pickle.dumps(state))  # as scripts keep it on disk
    llm.create_completion("Something else entirely", max_tokens=2, seed=1)
    cold = llm.create_completion(prompt, **kw)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    llm.load_state(state)
    warm = llm.create_completion(prompt, **kw)
    assert warm["choices"][0]["text"] == first["choices"][0]["text"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) - 1
    with pytest.raises(ArgumentError, match="LlamaState"):
        llm.load_state("not a state")


def test_reasoning_effort_is_a_template_variable(llm: Llama) -> None:
    """reasoning_effort reaches the template as a variable, as llama-server passes it to gpt-oss templates."""
    template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                "{% if reasoning_effort is defined %} effort {{ reasoning_effort }}{% endif %}")
    t = Llama(llm.model_path, chat_template=template, threads=1)
    msgs = [{"role": "user", "content": "Hi"}]
    plain = t.create_chat_completion(msgs, max_tokens=1, seed=1)["usage"]["prompt_tokens"]
    high = t.create_chat_completion(msgs, max_tokens=1, seed=1, reasoning_effort="high")["usage"]["prompt_tokens"]
    assert plain == len(llm.tokenize("Hi", parse_special=True))
    assert high == len(llm.tokenize("Hi effort high", parse_special=True))
    with pytest.raises(ArgumentError, match="reasoning_effort"):
        t.create_chat_completion(msgs, reasoning_effort="extreme")
