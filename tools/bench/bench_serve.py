"""`minillama serve` beside llama.cpp's llama-server (xllamacpp) on the same model and load (a plain script, not a test).

    python tools/bench/bench_serve.py [--model PATH] [--engines minillama llama.cpp] [--clients 1 4]
                                      [--max-tokens 48] [--rounds 5] [--turns 6] [--threads 2]

Each engine runs in its own process on a free loopback port: `minillama serve`, and llama.cpp's server run
in-process by xllamacpp (CommonParams.port / .hostnames, --threads threads, 2048 tokens of context per slot). Both
servers are up at once but only one is loaded at a time: the rounds alternate between the engines (ABBA: each
round's order the reverse of the last's), with a pause before each, so that a machine whose speed drifts over
seconds (a shared host: the same engine's rate moves by up to 1.45x within an hour) moves both engines' figures
alike instead of the ratio. Two loads:
- Clients: `--parallel <most clients>`; for each client count, `rounds` rounds per engine in which every client
  sends one streamed completion of --max-tokens tokens (end of text banned with logit_bias, so every reply has that
  length) at the same moment. Reported: the tokens all clients received over the round's wall time (the median
  round), and the server's CPU time per token received (user + system from /proc, the median round; 0 for an
  engine that runs in a process /proc cannot see).
- Conversation: `--parallel 2`; one client's chat of --turns turns with each engine, turn by turn in alternation,
  each turn re-sending the whole conversation (a system text of about 600 tokens, then the earlier questions and
  scripted answers, then the new question): time to the first token of each turn's streamed reply (the first
  chunk with text).
Then the side-by-side table and minillama's ratio (its rate over llama.cpp's; llama.cpp's time over its own), with
the goals: >= 1.3x with one client, >= 1.5x with four, >= 1.5x on the conversation's turns after the first (their
mean and their median). The machine's load average is printed too: on a shared machine it is the ceiling.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINES = ("minillama", "llama.cpp")
GOALS = {"1 client": 1.3, "4 clients": 1.5, "conversation": 1.5}

#: llama.cpp's server in a process of its own (argv: model, parallel, threads, port); it says where it listens.
LLAMACPP_SERVER = """
import socket, sys, time
import xllamacpp as xlc
model, parallel, threads, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
p = xlc.CommonParams()
p.model.path = model
p.n_parallel = parallel
p.n_ctx = 2048 * parallel
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
p.warmup = False
p.port = port
p.hostnames = ["127.0.0.1"]
server = xlc.Server(p)
for _ in range(600):  # Server() may return before its HTTP thread has bound the port
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
print(f"listening on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
while True:
    time.sleep(3600)
"""

SYSTEM = ("You are the support assistant of a small bicycle shop. " + " ".join(
    f"Rule {i}: answer questions about part {i} of the catalogue politely, name its price in euros, say whether it is "
    "in stock, and suggest one accessory that fits it." for i in range(1, 17)))
QUESTIONS = ["Do you sell bells?", "How much is a chain?", "Is the red saddle in stock?", "What fits a road bike?",
             "Can I pay by card?", "When do you open on Saturday?", "Do you repair brakes?", "Thanks, bye!"]
ANSWER = "Yes, we do. It costs 12 euros and it is in stock; a matching lamp would fit it well."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, parallel: int, engine: str = "minillama", threads: int = 2,
          *options: str) -> tuple[subprocess.Popen, str, int]:
    """The engine's server process (minillama's with more command-line options) and the host and port it listens
    on."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if engine == "minillama":
        cmd = [sys.executable, "-m", "minillama", "serve", "--model", model, "--port", "0", "--parallel",
               str(parallel), *options]
    else:
        cmd = [sys.executable, "-c", LLAMACPP_SERVER, model, str(parallel), str(threads), str(free_port())]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    TAILS[proc.pid] = tail = collections.deque(maxlen=20)
    for line in proc.stderr:
        tail.append(line)
        m = re.search(r"listening on http://(\S+):(\d+)", line)
        if m:
            threading.Thread(target=tail.extend, args=(proc.stderr,), daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise SystemExit(f"{engine}'s server did not start (exit code {proc.wait()}):\n{''.join(tail)}")


#: pid -> the last lines a server wrote to stderr (shown when a load fails)
TAILS: dict[int, collections.deque[str]] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(host: str, port: int, path: str, body: dict) -> tuple[float | None, int]:
    """One streamed request: (seconds to the first chunk with text, tokens generated by the usage chunk or the
    chunks with text)."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    start_time = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    first, n, usage = None, 0, None
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices") or ():
            if c.get("text") or (c.get("delta") or {}).get("content"):
                n += 1
                if first is None:
                    first = time.perf_counter() - start_time
    conn.close()
    return first, usage["completion_tokens"] if usage else n


def round_(host: str, port: int, clients: int, max_tokens: int, eos: int, seed: int) -> tuple[int, float]:
    """(tokens received by all clients, wall seconds) of one round of `clients` simultaneous requests."""
    got: list[int] = []
    bodies = [{"prompt": f"Story {c}: once upon a time", "max_tokens": max_tokens, "stream": True,
               "temperature": 0.8, "seed": seed + c, "logit_bias": {str(eos): -100},
               "stream_options": {"include_usage": True}} for c in range(clients)]
    failed: list[BaseException] = []

    def client(body: dict) -> None:
        try:
            got.append(post(host, port, "/v1/completions", body)[1])
        except (OSError, http.client.HTTPException) as exc:
            failed.append(exc)

    threads = [threading.Thread(target=client, args=(b,)) for b in bodies]
    start_time = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:  # raised here, where servers_up names the servers' states
        raise failed[0]
    return sum(got), time.perf_counter() - start_time


#: Seconds each server is left idle before a measured round, so that the other engine's threads have parked (a
#: ggml thread pool spins for a while after its last graph) and minillama's thread choice sees idle cores.
SETTLE = 0.3


def alternating(engines: list[str], r: int) -> list[str]:
    """The engines in round r's order: as given in even rounds, reversed in odd ones (ABBA)."""
    return list(engines) if r % 2 == 0 else list(reversed(engines))


@contextlib.contextmanager
def servers_up(args: argparse.Namespace, parallel: int,
               warm: Callable[[str, int], object]) -> Iterator[dict[str, tuple[subprocess.Popen, str, int]]]:
    """Every engine's server (engine -> (process, host, port)), each warmed up by warm(host, port) after a pause
    (the server started last may still be busy starting: its threads are not load); all stopped on the way out."""
    servers: dict[str, tuple[subprocess.Popen, str, int]] = {}
    try:
        for engine in args.engines:
            servers[engine] = start(args.model, parallel, engine, args.threads)
        for _, host, port in servers.values():
            time.sleep(SETTLE)
            warm(host, port)
        yield servers
    except (OSError, http.client.HTTPException) as exc:
        for engine, (proc, _, _) in servers.items():
            state = "running" if proc.poll() is None else f"exited with code {proc.returncode}"
            print(f"{engine}'s server ({state}), its last lines:\n{''.join(TAILS.get(proc.pid, ()))}", file=sys.stderr)
        raise SystemExit(f"a request failed: {exc!r}") from exc
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait()


def clients_load(args: argparse.Namespace, eos: int) -> dict[str, dict[int, tuple[float, float]]]:
    """engine -> client count -> (tokens/s of the median round, server CPU ms per token of the median round), the
    engines' rounds in alternation."""
    # warm-up: thread choice, caches
    with servers_up(args, max(args.clients), lambda host, port: round_(host, port, 1, 8, eos, 0)) as servers:
        rates: dict[str, dict[int, list[float]]] = {e: {c: [] for c in args.clients} for e in servers}
        cpu: dict[str, dict[int, list[float]]] = {e: {c: [] for c in args.clients} for e in servers}
        for clients in args.clients:
            for r in range(args.rounds):
                for engine in alternating(args.engines, r):
                    proc, host, port = servers[engine]
                    time.sleep(SETTLE)
                    before = cpu_seconds(proc.pid)
                    n, seconds = round_(host, port, clients, args.max_tokens, eos, 100 * r)
                    rates[engine][clients].append(n / seconds)
                    cpu[engine][clients].append(1000 * (cpu_seconds(proc.pid) - before) / max(n, 1))
        return {e: {c: (statistics.median(rates[e][c]), statistics.median(cpu[e][c])) for c in args.clients}
                for e in servers}


def conversation(args: argparse.Namespace) -> dict[str, list[float]]:
    """engine -> seconds to the first token of each turn of one client's conversation, re-sent whole, on 2 slots;
    the engines take the turns in alternation."""
    def warm(host: str, port: int) -> None:  # another prompt
        post(host, port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                                  "stream": True})

    with servers_up(args, 2, warm) as servers:
        messages = [{"role": "system", "content": SYSTEM}]
        ttft: dict[str, list[float]] = {e: [] for e in servers}
        for t, question in enumerate(QUESTIONS[:args.turns]):
            messages.append({"role": "user", "content": question})
            for engine in alternating(args.engines, t):
                _, host, port = servers[engine]
                time.sleep(SETTLE)
                first, _ = post(host, port, "/v1/chat/completions", {"messages": messages, "max_tokens": 8,
                                                                     "temperature": 0, "stream": True})
                ttft[engine].append(first if first is not None else float("nan"))
            messages.append({"role": "assistant", "content": ANSWER})
        return ttft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("MINILLAMA_TEST_GGUF"))
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=6, choices=range(1, len(QUESTIONS) + 1), metavar="N")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (minillama's 'auto' uses at most "
                    "the cores, 2 here)")
    args = ap.parse_args()
    if not args.model:
        raise SystemExit("give --model or set MINILLAMA_TEST_GGUF")
    from minillama.tokenizer import Tokenizer

    tok = Tokenizer.from_file(args.model)
    system_tokens = len(tok.encode(SYSTEM))
    loads = clients_load(args, tok.eos_id)
    turns = conversation(args)
    print(f"{args.model}: {args.max_tokens} tokens per reply, median of {args.rounds} rounds, engines alternating; "
          f"conversation of {args.turns} turns on 2 slots, a {system_tokens}-token system text; load average "
          f"{os.getloadavg()[0]:.1f}")
    names = list(args.engines)
    both = names == list(ENGINES)
    head = "".join(f"{n:>14}" for n in names) + (f"{'ratio':>9}{'goal':>7}" if both else "")
    print(f"{'load':<26}{head}")
    for clients in args.clients:
        rates = [loads[n][clients][0] for n in names]
        row = "".join(f"{r:>10.1f} t/s" for r in rates)
        label = f"{clients} client{'s' if clients > 1 else ''}"
        if both:
            goal = GOALS.get(label)
            row += f"{rates[0] / rates[1]:>8.2f}x" + (f"{goal:>6.1f}x" if goal else "")
        print(f"{label + ' (tokens/s)':<26}{row}")
        cpu = "".join(f"{loads[n][clients][1]:>11.1f} ms" for n in names)
        print(f"{'  CPU per token':<26}{cpu}")
    for t in range(args.turns):
        row = "".join(f"{1000 * turns[n][t]:>11.0f} ms" for n in names)
        if both:
            row += f"{turns[names[1]][t] / turns[names[0]][t]:>8.2f}x"
        print(f"{f'turn {t + 1} first token':<26}{row}")
    if args.turns > 1:  # the median too: on a shared machine one turn can wait seconds for a core
        for what, pick in (("mean", statistics.mean), ("median", statistics.median)):
            later = {n: pick(turns[n][1:]) for n in names}
            row = "".join(f"{1000 * later[n]:>11.0f} ms" for n in names)
            if both:
                row += f"{later[names[1]] / later[names[0]]:>8.2f}x{GOALS['conversation']:>6.1f}x"
            print(f"{f'turns 2-{args.turns} {what}':<26}{row}")


if __name__ == "__main__":
    main()
