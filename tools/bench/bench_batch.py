"""Batched decode (minillama/model/batch.py): what one pass of B single-token steps costs, and what concurrent
sessions on threads get from one Llama.

    python tools/bench/bench_batch.py MODEL.gguf [--batches 1 2 4 8] [--clients 1 2 4] [--tokens 24] [--threads 1]

1. CPU time of one pass of B steps (time.process_time, best of 5: less sensitive to other load than wall clock),
   and the tokens per CPU second that makes.
2. Aggregate generated tokens/s (wall clock) of N threads each streaming a completion from one Llama, with the
   steps batched (Session(batched=True), the default) and each session on its own (batched=False).
"""

from __future__ import annotations

import argparse
import threading
import time

from minillama.api import Llama
from minillama.generate import generate
from minillama.model.batch import Batch


def pass_cost(llm: Llama, batches: list[int]) -> None:
    model = llm.model
    prompt = llm.tokenize("Once upon a time, in a land far away, there lived a llama who")
    for b in batches:
        sessions = [model.session(batched=False) for _ in range(b)]
        for s in sessions:
            s.logits_next(prompt)
        best = float("inf")
        for rep in range(5):
            t = time.process_time()
            model._run_steps([5] * b, Batch.steps([len(prompt) + rep] * b, [s._cache for s in sessions]))
            best = min(best, time.process_time() - t)
        print(f"B={b}: {best * 1000:7.1f} ms CPU per pass, {best * 1000 / b:6.1f} ms per token, "
              f"{b / best:6.1f} tokens per CPU second", flush=True)


def clients(llm: Llama, counts: list[int], tokens: int) -> None:
    prompt = llm.tokenize("Once upon a time, in a land far away,")

    def run(batched: bool, n: int) -> float:
        made: list[int] = []

        def one(seed: int) -> None:
            gen = generate(llm.model.session(batched=batched), llm.tokenizer, prompt, tokens, seed=seed,
                           stop_at_eog=False)
            list(gen)
            made.append(gen.stats.generated_tokens)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(made) / (time.perf_counter() - start)

    for batched in (True, False):
        rates = {n: run(batched, n) for n in counts}
        print(("batched " if batched else "separate") + "  " +
              "  ".join(f"{n} clients {r:6.1f} tokens/s" for n, r in rates.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    llm = Llama(args.model, threads=args.threads, seed=1)
    pass_cost(llm, args.batches)
    clients(llm, args.clients, args.tokens)


if __name__ == "__main__":
    main()
