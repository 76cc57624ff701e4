"""Aggregate generation speed of `minillama serve` with 1, 2 and 4 concurrent clients (a plain script, not a test).

    python tools/bench/bench_serve.py [--model PATH] [--clients 1 2 4] [--max-tokens 48] [--rounds 2]

Starts `minillama serve --parallel <most clients>` on a free loopback port with the model (default
$MINILLAMA_TEST_GGUF, e.g. SmolLM2-135M-Instruct.Q4_1.gguf), warms it up, then for each client count runs
`rounds` rounds in which every client sends one streamed completion of --max-tokens tokens (end of text banned
with logit_bias, so every reply has that length) at the same moment. Reported per count: the tokens all clients
received divided by the wall time of the round (best round), and the ratio to one client. The goal:
4 clients >= 2x one client. The machine's load average is printed too: on a shared machine it is the ceiling.
So is the server's CPU time per token received (user + system, from /proc, median over the rounds): other
processes slow the wall clock much more than they change it, and one client's CPU per token over four clients'
is the ratio the server would reach on idle cores where both keep the cores busy.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def start(model: str, parallel: int) -> tuple[subprocess.Popen, str, int]:
    """The server process and the host and port it listens on."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "minillama", "serve", "--model", model, "--port", "0",
                             "--parallel", str(parallel)], stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        m = re.search(r"listening on http://(\S+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise SystemExit(f"the server did not start: {proc.wait()}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(host: str, port: int, body: bytes, out: list[int]) -> None:
    """One streamed completion; appends the number of tokens received (one chunk each, logprobs-free text)."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    n = 0
    usage = None
    for line in r:
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            n += 1
    conn.close()
    out.append(usage["completion_tokens"] if usage else n)


def round_(host: str, port: int, clients: int, max_tokens: int, eos: int, seed: int) -> tuple[int, float]:
    """(tokens received by all clients, wall seconds) of one round of `clients` simultaneous requests."""
    got: list[int] = []
    threads = []
    for c in range(clients):
        body = json.dumps({"prompt": f"Story {c}: once upon a time", "max_tokens": max_tokens, "stream": True,
                           "temperature": 0.8, "seed": seed + c, "logit_bias": {str(eos): -100},
                           "stream_options": {"include_usage": True}}).encode()
        threads.append(threading.Thread(target=one, args=(host, port, body, got)))
    start_time = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(got), time.perf_counter() - start_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("MINILLAMA_TEST_GGUF"))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not args.model:
        raise SystemExit("give --model or set MINILLAMA_TEST_GGUF")
    from minillama.tokenizer import Tokenizer

    eos = Tokenizer.from_file(args.model).eos_id
    proc, host, port = start(args.model, max(args.clients))
    try:
        round_(host, port, 1, 8, eos, 0)  # warm-up: thread choice, caches
        base = None
        print(f"{'clients':>7} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'vs 1':>6} {'CPU ms/token':>13}  (best "
              f"of {args.rounds}, {args.max_tokens} tokens per reply, load average {os.getloadavg()[0]:.1f})")
        for clients in args.clients:
            rounds, cpu = [], []
            for r in range(args.rounds):
                before = cpu_seconds(proc.pid)
                rounds.append(round_(host, port, clients, args.max_tokens, eos, 100 * r))
                cpu.append((cpu_seconds(proc.pid) - before) / max(rounds[-1][0], 1))
            best = max(rounds, key=lambda tn: tn[0] / tn[1])
            rate = best[0] / best[1]
            base = base or rate
            print(f"{clients:>7} {best[0]:>7} {best[1]:>8.2f} {rate:>9.1f} {rate / base:>5.2f}x "
                  f"{1000 * sorted(cpu)[len(cpu) // 2]:>13.1f}")

    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
