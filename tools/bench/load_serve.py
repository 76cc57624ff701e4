"""A load test of `minillama serve` with malformed requests mixed in (a plain script, not a test).

    python tools/bench/load_serve.py [--model PATH] [--requests 1000] [--clients 8] [--parallel 2] [--cache-ram 32]
        [--chat-template-file tests/data/toolcall_templates/qwen3_thinking.jinja]

Starts `minillama serve --parallel N` on a free loopback port with the model (default $MINILLAMA_TEST_GGUF), then
--clients threads send --requests requests between them: 90% good (completions, chat, embeddings, tokenize, a few
streamed, and agents' requests: tools, tool results, reasoning budgets and formats, /v1/messages, /v1/responses),
10% malformed, drawn in turn from MALFORMED (kinds once answered with 5xx, plus the usual
ones). Prints, per kind, the statuses it got, and fails (exit 1) unless every malformed request got a 4xx with
OpenAI's error object, every good one a 200, no slot is busy after the run, and the server's RSS at the end is within
64 MB (plus its --cache-ram, which prefixes evicted from the slots may fill) of the RSS after the first 100 requests. Then two clients start streamed replies and never read them; a third
request must still be answered.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import start  # noqa: E402

GOOD: list[tuple[str, dict]] = [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 8}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                              "max_tokens": 4}),
    ("/v1/completions", {"prompt": "A list:", "max_tokens": 8, "stream": True}),
    ("/v1/embeddings", {"input": ["hello", "world"]}),
    ("/tokenize", {"content": "Hello, llamas!", "with_pieces": True}),
    ("/detokenize", {"tokens": [1, 2, 3]}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "logit_bias": {str(2**70): 1}}),  # skipped, as llama.cpp
]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
#: Tool and reasoning requests (a thinking template with tool calls, --chat-template-file, makes them bite).
AGENT: list[tuple[str, dict]] = [
    ("/v1/chat/completions", {"messages": ASK, "tools": WEATHER, "tool_choice": "required", "max_tokens": 24}),
    ("/v1/chat/completions", {"messages": ASK, "tools": WEATHER, "max_tokens": 16, "stream": True}),
    ("/v1/chat/completions", {"messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": WEATHER, "max_tokens": 8}),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_budget_tokens": 2, "max_tokens": 8}),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_format": "none", "max_tokens": 8, "stream": True}),
    ("/v1/chat/completions", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 8}),
    ("/v1/messages", {"messages": ASK, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 2}}),
    ("/v1/responses", {"input": "Weather in Paris?", "tools": [{"type": "function", "name": "get_weather",
                                                                "parameters": WEATHER[0]["function"]["parameters"]}],
                       "max_output_tokens": 16}),
]

NESTED = "[" * 100_000 + "]" * 100_000

#: (name, path, raw body, extra headers): each must be answered with a 4xx and OpenAI's error object.
MALFORMED: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("not json", "/v1/completions", b"{nope", {}),
    ("nested body", "/v1/completions", NESTED.encode(), {}),
    ("nested field", "/v1/chat/completions", ('{"messages": ' + NESTED + "}").encode(), {}),
    ("temperature 10**400", "/v1/completions", b'{"prompt": "a", "temperature": 1' + b"0" * 400 + b"}", {}),
    ("temperature Infinity", "/v1/completions", b'{"prompt": "a", "temperature": Infinity}', {}),
    ("repeat_penalty 10**400", "/v1/completions", b'{"prompt": "a", "repeat_penalty": 1' + b"0" * 400 + b"}", {}),
    ("logit_bias value 10**400", "/v1/completions",
     b'{"prompt": "a", "logit_bias": {"5": 1' + b"0" * 400 + b"}}", {}),
    ("repeat_last_n 10**20", "/v1/completions", json.dumps({"prompt": "a", "repeat_last_n": 10**20}).encode(), {}),
    ("lone surrogate field", "/v1/completions", b'{"prompt": "a", "\\ud800": 1}', {}),
    ("lone surrogate type", "/v1/completions", b'{"prompt": "a", "stop": {"\\ud800": 1}}', {}),
    ("unknown field", "/v1/chat/completions", b'{"messages": [], "bogus": 1}', {}),
    ("wrong type", "/v1/completions", b'{"prompt": 5}', {}),
    ("image part", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
     .encode(), {}),
    ("too many embedding inputs", "/v1/embeddings", json.dumps({"input": ["a"] * 100_000}).encode(), {}),
    ("bad token id", "/detokenize", b'{"tokens": [-1]}', {}),
    ("cross-site text/plain", "/v1/completions", b'{"prompt": "a", "max_tokens": 1}',
     {"Content-Type": "text/plain", "Origin": "http://evil.example"}),
    ("foreign Host", "/v1/completions", b'{"prompt": "a", "max_tokens": 1}', {"Host": "evil.example"}),
    ("tool_choice unknown function", "/v1/chat/completions", json.dumps({"messages": ASK, "tools": WEATHER,
                                                                          "tool_choice": {"type": "function",
                                                                                          "function": {"name": "x"}}})
     .encode(), {}),
    ("tools not a list", "/v1/chat/completions", json.dumps({"messages": ASK, "tools": {"a": 1}}).encode(), {}),
    ("reasoning budget -5", "/v1/chat/completions",
     json.dumps({"messages": ASK, "reasoning_budget_tokens": -5}).encode(), {}),
    ("reasoning_format unknown", "/v1/chat/completions",
     json.dumps({"messages": ASK, "reasoning_format": "verbose"}).encode(), {}),
]


def send(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request; (status, body). Status 0 when the connection failed."""
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.putrequest("POST", path, skip_host="Host" in headers)
        hdrs = {"Content-Type": "application/json", **headers, "Content-Length": str(len(body))}
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, r.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def is_error_object(data: bytes) -> bool:
    """OpenAI's error object (Anthropic's on /v1/messages has the same "error" with a message and a type)."""
    try:
        err = json.loads(data)["error"]
        return isinstance(err["message"], str) and isinstance(err["type"], str)
    except (ValueError, KeyError, TypeError):
        return False


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def health(host: str, port: int) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/health")
    return json.loads(conn.getresponse().read())


def stalled_stream(host: str, port: int) -> socket.socket:
    """A streamed reply with large chunks (top logprobs) that the client never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, port))
    body = json.dumps({"prompt": "Once", "max_tokens": 400, "stream": True, "logprobs": 20,
                       "logit_bias": {"0": -100, "1": -100, "2": -100}}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port, len(body), body))
    return s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("MINILLAMA_TEST_GGUF"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--cache-ram", type=int, default=32, metavar="MiB", help="the server's RAM cache of prefixes")
    ap.add_argument("--chat-template-file", metavar="PATH", help="the server's chat template (e.g. one that thinks "
                    "and has tool calls: tests/data/toolcall_templates/qwen3_thinking.jinja)")
    args = ap.parse_args(argv)
    if not args.model:
        raise SystemExit("give --model or set MINILLAMA_TEST_GGUF")
    template = ["--chat-template-file", args.chat_template_file] if args.chat_template_file else []
    proc, host, port = start(args.model, args.parallel, "minillama", 2, "--cache-ram", str(args.cache_ram), *template)
    try:
        jobs: list[tuple[str, str, bytes, dict[str, str], bool]] = []
        bad, good = itertools.cycle(MALFORMED), itertools.cycle(GOOD + AGENT)
        for i in range(args.requests):
            if i % 10 == 9:
                name, path, body, hdrs = next(bad)
                jobs.append((name, path, body, hdrs, False))
            else:
                path, data = next(good)
                jobs.append((path + (" stream" if data.get("stream") else ""), path, json.dumps(data).encode(),
                             {}, True))
        results: dict[str, Counter] = defaultdict(Counter)
        failures: list[str] = []
        lock = threading.Lock()
        it = iter(enumerate(jobs))
        rss = {"start": rss_mb(proc.pid)}

        def worker() -> None:
            for i, (name, path, body, hdrs, ok) in it:
                status, data = send(host, port, path, body, hdrs)
                with lock:
                    results[("good " if ok else "malformed ") + name][status] += 1
                    if i == 100:
                        rss["after 100"] = rss_mb(proc.pid)
                    if ok and status != 200:
                        failures.append(f"good {name}: {status} {data[:200]!r}")
                    if not ok and not (400 <= status < 500 and is_error_object(data)):
                        failures.append(f"malformed {name}: {status} {data[:200]!r}")

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        rss["end"] = rss_mb(proc.pid)
        for name in sorted(results):
            print(f"{name:45} {dict(sorted(results[name].items()))}")
        print(f"{args.requests} requests, {args.clients} clients, --parallel {args.parallel}: {wall:.1f} s")
        print("RSS MB: " + ", ".join(f"{k} {v:.0f}" for k, v in rss.items()))
        deadline = time.monotonic() + 10  # a reply's slot is freed as its worker ends, just before it is sent
        while (h := health(host, port))["slots_processing"] and time.monotonic() < deadline:
            time.sleep(0.1)
        print(f"after the run: {h}")
        if h["slots_processing"]:
            failures.append(f"slots still busy after the run: {h}")
        if rss["end"] - rss.get("after 100", rss["start"]) > 64 + args.cache_ram * 1.05:
            failures.append(f"RSS grew: {rss}")

        stalled = [stalled_stream(host, port) for _ in range(args.parallel)]
        t0 = time.perf_counter()
        status, data = send(host, port, "/v1/completions", b'{"prompt": "Hi", "max_tokens": 4}', {})
        print(f"a request beside {len(stalled)} clients that stopped reading: {status} in "
              f"{time.perf_counter() - t0:.1f} s")
        if status != 200:
            failures.append(f"a request beside stalled clients: {status} {data[:200]!r}")
        for s in stalled:
            s.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if failures:
        print(f"{len(failures)} failures:")
        for f in failures[:50]:
            print("  " + f)
        raise SystemExit(1)
    print("all malformed requests got a 4xx error object, all good ones a 200; no slot held")


if __name__ == "__main__":
    main()
