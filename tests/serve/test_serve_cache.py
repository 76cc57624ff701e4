"""The server's prompt cache across requests: slot choice by the longest cached prefix (llama-server's slot
similarity), the host-RAM cache of evicted prefixes (--cache-ram), usage.prompt_tokens_details.cached_tokens and
llama-server's timings, and the request log (-v).

Expected values: the 5-turn criterion (every turn after the first finds the previous turn's prompt cached) is the
issue's, on llama-server's counting (cached_tokens: the prompt's tokens the slot held, timings.cache_n the same,
timings.prompt_n the rest), which llama-server itself answers with in test_timings_and_usage_fields_are_llama_servers;
a restored prefix is exact when the logits equal those of the session that computed it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import REPO
from support.paths import real_gguf
from support.serve import Server, write_tiny_chat_model

from minillama.model import Model
from minillama.serve.prompt_cache import Caches, PromptCache

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install -e \".[serve]\"")
openai = pytest.importorskip("openai", reason="the test extra is not installed: pip install -e \".[test]\"")
pytest.importorskip("gguf")

TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
           "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return write_tiny_chat_model(tmp_path_factory.mktemp("pcache") / "tiny-chat.gguf")


@pytest.fixture(scope="module")
def tiny(tiny_path) -> Model:
    return Model.from_file(tiny_path)


def _prompt(seed: int, n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 900, n)]


# ---------------------------------------------------------------------------------------------------------------------
# the real model: a conversation on two slots
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_server() -> Iterator[Server]:
    s = Server(real_gguf(), "--parallel", "2", "-v")
    yield s
    s.stop()


def _chat(server: Server, system: str) -> list[tuple[int, int]]:
    """A 5-turn greedy chat's (prompt_tokens, cached_tokens) of each turn."""
    client = server.client()
    messages = [{"role": "system", "content": system}]
    counts = []
    for question in ["Name a fruit.", "Name another.", "And a vegetable?", "A colour?", "Thanks!"]:
        messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
        counts.append((r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return counts


def test_five_turn_chat_on_two_slots_is_served_from_the_cache(smollm2_server: Server) -> None:
    """Every turn after the first finds the whole previous prompt cached (the slot that holds it is chosen), as
    much as with one slot, and the counts agree: timings.cache_n is cached_tokens, timings.prompt_n the rest."""
    client = smollm2_server.client()
    messages = [{"role": "system", "content": "You are a helpful assistant who answers briefly."}]
    previous = 0
    for turn, question in enumerate(["Name a fruit.", "Name another.", "And a vegetable?", "A colour?", "Thanks!"]):
        messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
        cached = r.usage.prompt_tokens_details.cached_tokens
        timings = r.model_extra["timings"]
        assert set(timings) == TIMINGS
        assert timings["cache_n"] == cached and timings["prompt_n"] == r.usage.prompt_tokens - cached
        assert timings["predicted_n"] == r.usage.completion_tokens
        if turn:
            assert cached >= previous, (turn, cached, previous)
        else:
            assert cached == 0
        previous = r.usage.prompt_tokens
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    # the streamed reply's usage chunk says the same, with the timings
    chunks = list(client.chat.completions.create(model="m", messages=messages[:-1], max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1  # all but the last, as llama-server
    assert set(chunks[-1].model_extra["timings"]) == TIMINGS
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert set(finish.model_extra["timings"]) == TIMINGS
    deadline = time.monotonic() + 10  # a stream's line is written once it has ended, the client may be first
    while len(lines := [x for x in smollm2_server.log if "POST /v1/chat/completions 200" in x]) < 6 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) == 6 and "cached_tokens=0 " in lines[0] and f"prompt_tokens={previous} " in lines[4], lines
    one_slot = Server(real_gguf(), "--parallel", "1")
    try:
        alone = _chat(one_slot, "You answer in few words.")
    finally:
        one_slot.stop()
    two = _chat(smollm2_server, "You answer in few words.")
    # a new conversation on two slots (one holding the first, the other idle) computes no more of each prompt than
    # on one slot
    assert [p for p, _ in two] == [p for p, _ in alone]
    assert all(c2 >= c1 for (_, c2), (_, c1) in zip(two, alone, strict=True)), (two, alone)


def test_timings_and_usage_fields_are_llama_servers(smollm2_server: Server) -> None:
    """llama-server (xllamacpp) on the same model answers a repeated prompt with the same usage and timings fields,
    and the same cached count."""
    xlc = pytest.importorskip("xllamacpp")
    p = xlc.CommonParams()
    p.model.path = str(real_gguf())
    p.n_ctx = 2048
    p.cpuparams.n_threads = 2
    p.warmup = False
    ref = xlc.Server(p)
    body = {"messages": [{"role": "user", "content": "Say something about the sea."}], "max_tokens": 2,
            "temperature": 0}
    theirs = [ref.handle_chat_completions(body) for _ in range(2)]
    del ref
    ours = [smollm2_server.request("POST", "/v1/chat/completions", body)[1] for _ in range(2)]
    for a, b in zip(theirs, ours, strict=True):
        assert set(a["timings"]) == set(b["timings"]) == TIMINGS
        assert set(a["usage"]) == set(b["usage"]) and a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert ours[1]["usage"]["prompt_tokens_details"] == theirs[1]["usage"]["prompt_tokens_details"]
    assert ours[1]["timings"]["cache_n"] == theirs[1]["timings"]["cache_n"]


# ---------------------------------------------------------------------------------------------------------------------
# the RAM cache: eviction, restore, --cache-ram 0
# ---------------------------------------------------------------------------------------------------------------------

def _completions(server: Server, prompts: list[list[int]]) -> list[int]:
    """cached_tokens of one completion of each prompt (ids), in turn."""
    out = []
    for ids in prompts:
        status, r = server.request("POST", "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
        assert status == 200, r
        out.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
    return out


@pytest.mark.parametrize("cache_ram", ["8", "0"])
def test_an_evicted_prefix_is_restored_from_ram(tiny_path: Path, cache_ram: str) -> None:
    """One slot: prompt A, then an unrelated B (A goes to the RAM cache), then A extended: restored from RAM, all of
    A is cached; with --cache-ram 0 nothing is kept."""
    a, b = _prompt(1, 300), _prompt(2, 200)
    server = Server(tiny_path, "--parallel", "1", "--cache-ram", cache_ram)
    try:
        got = _completions(server, [a, b, a + _prompt(3, 20)])
    finally:
        server.stop()
    assert got[:2] == [0, 0]
    assert got[2] == (len(a) if cache_ram != "0" else 0)


def test_the_least_recently_used_idle_slot_is_overwritten(tiny_path: Path) -> None:
    """Two slots holding A and B: an unrelated C takes the one used longest ago (A's), B is still cached after it,
    and A comes back from the RAM cache."""
    a, b, c = _prompt(4, 200), _prompt(5, 200), _prompt(6, 200)
    server = Server(tiny_path, "--parallel", "2")
    try:
        got = _completions(server, [a, b, c, b + [7], a + [7]])
    finally:
        server.stop()
    assert got == [0, 0, 0, len(b), len(a)]


def test_the_ram_cache_holds_its_bound_in_bytes(tiny: Model) -> None:
    """Entries past the limit push out the oldest; one larger than the limit on its own is not kept; a sequence
    held whole by an entry is not saved twice, and an entry the new one holds whole is dropped."""
    s = tiny.session()
    s.logits_next(_prompt(10, 100))
    per_100 = s.export_prefix().nbytes
    cache = PromptCache(int(2.5 * per_100))
    for seed in range(11, 16):
        s.reset()
        s.logits_next(_prompt(seed, 100))
        assert cache.save(s)
        assert cache.nbytes <= cache.limit
    assert [e.ids for e in cache.entries] == [_prompt(14, 100), _prompt(15, 100)]
    assert not cache.save(s)  # held whole already
    s.logits_next(_prompt(15, 100) + [5, 6, 7])
    assert cache.save(s) and [e.n for e in cache.entries] == [100, 103]  # the 100 it holds whole went
    s.reset()
    s.logits_next(_prompt(16, 300))
    assert not cache.save(s) and cache.nbytes <= cache.limit  # larger than the limit alone


def test_caches_choose_by_prefix_similarity(tiny: Model) -> None:
    """llama-server's rule: the idle cache covering the largest share of the prompt (above 0.1) wins; below that,
    the least recently used one."""
    caches = Caches([tiny.session(), tiny.session()])
    one, two = caches.sessions
    a, b = _prompt(20, 50), _prompt(21, 50)
    for session, ids in ((one, a), (two, b)):
        session.logits_next(ids)
    caches.release(two)
    caches.release(one)  # one used last
    assert caches.claim(b + [1, 2]) is two
    assert caches.claim(a[:3] + _prompt(22, 40)) is one  # the only idle one, though it shares little
    caches.release(two)
    caches.release(one)  # one used last again
    assert caches.claim(a[:4] + _prompt(23, 100)) is two  # 4 of 104 is below 0.1: the least recently used


# ---------------------------------------------------------------------------------------------------------------------
# exactness of a restored prefix
# ---------------------------------------------------------------------------------------------------------------------

def test_a_restored_prefix_gives_the_same_logits(tiny: Model) -> None:
    """A prefix exported from one session and imported into another gives the logits the first session gives from
    its own cache, bit for bit, and those of a fresh session fed the same way (the prefix, then the rest); a single
    pass over the whole prompt (another attention path from 64 rows on, as in llama.cpp) gives the same argmax."""
    p, q = _prompt(30, 150), _prompt(31, 10)
    warm, other = tiny.session(), tiny.session()
    warm.logits_next(p)
    other.logits_next(_prompt(32, 80))  # something else first: the import replaces it
    other.import_prefix(warm.export_prefix())
    assert other.cached_ids == p
    got = other.logits_next(p + q)
    assert other.evaluated == len(q)
    want = warm.logits_next(p + q)
    np.testing.assert_array_equal(got, want)
    fresh = tiny.session()
    fresh.logits_next(p)
    np.testing.assert_array_equal(got, fresh.logits_next(p + q))
    one_pass = tiny.session().logits_next(p + q)
    np.testing.assert_allclose(got, one_pass, rtol=1e-2, atol=1e-2)
    assert int(np.argmax(got)) == int(np.argmax(one_pass))


# ---------------------------------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "lots", "1.5", ""])
def test_cache_ram_must_be_whole_mib(tiny_path: Path, value: str) -> None:
    p = subprocess.run([sys.executable, "-m", "minillama", "serve", "--model", str(tiny_path), "--port", "0",
                        "--cache-ram", value], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 2 and p.stderr.startswith("minillama: error: expected --cache-ram as a whole number of "
                                                     "MiB"), p.stderr
    assert p.stderr.count("\n") == 1, p.stderr


def test_verbose_logs_each_request(tiny_path: Path) -> None:
    server = Server(tiny_path, "-v")
    try:
        server.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        server.request("GET", "/nowhere")
        server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 2, "stream": True})
    finally:
        server.stop()  # its log is complete once it has stopped
    time.sleep(0.2)
    log = "".join(server.log)
    assert "POST /v1/completions 200 prompt_tokens=" in log and "GET /nowhere 404 " in log
    assert "POST /v1/chat/completions 200 prompt_tokens=" in log


def test_a_prefix_of_another_shape_is_refused(tiny: Model) -> None:
    from minillama.errors import ArgumentError

    s = tiny.session()
    s.logits_next(_prompt(40, 10))
    prefix = s.export_prefix()
    prefix.k = [k[:, :1] for k in prefix.k]  # one kv head of two
    with pytest.raises(ArgumentError, match=r"expected a prefix of 1 layers of keys \(2, 8\).*found 1 layers of "
                                            r"keys \(1, 8\)"):
        tiny.session().import_prefix(prefix)


def test_a_streamed_runs_cache_is_idle_once_its_end_is_read() -> None:
    """A client that sends its next turn as soon as a streamed reply ended finds that reply's KV cache idle: it is
    given back before the stream's end reaches the client (not later, when the event loop frees the slot), so the
    next turn resumes from it rather than recomputing its whole conversation on another slot's cache."""
    import asyncio

    from minillama.serve.slots import SlotPool

    class Session:
        def __init__(self) -> None:
            self.cached_ids: list[int] = []
            self.evaluated = 0

        def next_token(self, ids: list[int], sampler: object) -> int:
            self.cached_ids, self.evaluated = list(ids), len(ids)
            return 7

    pool = SlotPool(Session, 2)

    def run(s: object) -> Iterator[str]:
        s.next_token([1, 2, 3], None)  # type: ignore[attr-defined]
        yield "a"
        yield "b"

    async def turns() -> list[tuple[list[str], list[bool]]]:
        out = []
        for _ in range(20):
            items = [item async for item in pool.stream("completion", run)]
            out.append((items, [pool.caches.take(k) is not None for k in range(2)]))  # before the loop goes on
            for session in pool.caches.sessions:
                pool.caches.release(session)
            while pool.busy:  # the slot itself is freed when the loop runs the worker's end
                await asyncio.sleep(0.01)
        return out

    for items, idle in asyncio.run(asyncio.wait_for(turns(), 60)):
        assert items == ["a", "b"] and idle == [True, True], idle
