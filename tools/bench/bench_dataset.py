"""Benchmark `minillama dataset`: end-to-end MB/s for 1 and 2 workers, against HF tokenizers, and peak memory.

    python tools/bench/bench_dataset.py [--mb 50] [--big-mb 200] [--vocab llama-bpe]

The corpus is ../shared/corpus/diverse.txt repeated to --mb megabytes (paragraph documents). Figures:

* end-to-end MB/s of `minillama dataset --workers N` (a fresh process: load, read, encode, write shards and
  index) for N = 1 and 2, and their ratio (goal >= 1.7x on 2 cores);
* Hugging Face tokenizers' `encode_batch` (Rust, all cores) on the same vocab (llama-3.2-tokenizer.json
  for llama-bpe) and the same paragraphs, timed around encode_batch alone (no reading, no writing);
  ours / theirs (goal >= 2x);
* CPU seconds of each (all processes; load on a shared machine stretches wall time, not CPU time);
* peak RSS of the whole run (the main process and every worker, summed; sampled from /proc every
  0.1 s) at --mb and at --big-mb (goal: flat within 20%).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MINILLAMA_SHARED", REPO.parent / "shared"))
HF_JSON = {"llama-bpe": "llama-3.2-tokenizer.json"}


def make_corpus(path: Path, mb: int) -> int:
    """diverse.txt repeated (paragraphs intact) until the file holds at least mb megabytes."""
    text = (SHARED / "corpus" / "diverse.txt").read_bytes().rstrip(b"\n") + b"\n\n"
    n = -(-mb * 1_000_000 // len(text))
    with open(path, "wb") as f:
        for _ in range(n):
            f.write(text)
    return n * len(text)


def _tree_rss(pid: int) -> int:
    """Resident bytes of pid and all its descendants (0 for processes that are gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return total


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run_dataset(model: Path, corpus: Path, out: Path, workers: int) -> tuple[float, int, float]:
    """Wall seconds, peak summed RSS and CPU seconds (all processes) of one `minillama dataset` run."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "minillama", "dataset", "--model", str(model), "--out", str(out),
           "--workers", str(workers), "--no-progress", str(corpus)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peak = 0
    cpu0 = _cpu(resource.RUSAGE_CHILDREN)  # workers are reaped by the run, the run by us: all counted
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.1)

    t = threading.Thread(target=sample)
    t.start()
    out_s, err = proc.communicate()
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    if proc.returncode:
        raise SystemExit(f"minillama dataset failed: {err.decode()}")
    print("   ", out_s.decode().strip())
    return elapsed, peak, _cpu(resource.RUSAGE_CHILDREN) - cpu0


def hf_encode_batch(vocab: str, corpus: Path) -> tuple[float, float] | None:
    """Wall and CPU seconds of HF tokenizers' encode_batch over the corpus's paragraphs (None: not installed)."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        return None
    from minillama.dataset.sources import Source

    hf = HFTokenizer.from_file(str(SHARED / "vocab" / HF_JSON[vocab]))
    docs = list(Source([str(corpus)]).documents())
    cpu0 = _cpu(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for i in range(0, len(docs), 10_000):
        hf.encode_batch(docs[i:i + 10_000])
    return time.perf_counter() - start, _cpu(resource.RUSAGE_SELF) - cpu0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=50, help="corpus size for the speed figures (default 50)")
    ap.add_argument("--big-mb", type=int, default=200, help="larger corpus for the memory figure (0: skip)")
    ap.add_argument("--vocab", default="llama-bpe", choices=sorted(HF_JSON))
    args = ap.parse_args()
    model = SHARED / "vocab" / f"ggml-vocab-{args.vocab}.gguf"
    tmp = Path(tempfile.mkdtemp(prefix="bench-dataset-"))
    try:
        corpus = tmp / "corpus.txt"
        size = make_corpus(corpus, args.mb)
        mb = size / 1e6
        print(f"corpus: diverse.txt repeated to {mb:.1f} MB, vocab {args.vocab}, {os.cpu_count()} cores")
        t1, rss1, c1 = run_dataset(model, corpus, tmp / "out1", 1)
        print(f"  --workers 1: {t1:6.1f} s  {mb / t1:6.2f} MB/s  peak RSS {rss1 / 2**20:6.0f} MiB  CPU {c1:6.1f} s")
        t2, rss2, c2 = run_dataset(model, corpus, tmp / "out2", 2)
        print(f"  --workers 2: {t2:6.1f} s  {mb / t2:6.2f} MB/s  peak RSS {rss2 / 2**20:6.0f} MiB  CPU {c2:6.1f} s")
        same = all((tmp / "out1" / n).read_bytes() == (tmp / "out2" / n).read_bytes()
                   for n in os.listdir(tmp / "out1"))
        print(f"  workers 2 / workers 1: {t1 / t2:.2f}x wall (goal >= 1.7x); outputs identical: {same}")
        print(f"  2 x CPU(workers 1) / CPU(workers 2): {2 * c1 / c2:.2f}x (the wall ratio on two otherwise idle cores)")
        hf = hf_encode_batch(args.vocab, corpus)
        if hf is not None:
            th, ch = hf
            print(f"  HF tokenizers encode_batch (encode only): {th:6.1f} s  {mb / th:6.2f} MB/s  CPU {ch:6.1f} s")
            print(f"  ours --workers 2 (end to end) / HF encode_batch: {th / t2:.2f}x wall (goal >= 2x), "
                  f"{ch / c2:.2f}x CPU")
        if args.big_mb:
            shutil.rmtree(tmp / "out1", ignore_errors=True)
            big = tmp / "big.txt"
            big_mb = make_corpus(big, args.big_mb) / 1e6
            corpus.unlink()
            tb, rssb, _ = run_dataset(model, big, tmp / "outb", 2)
            print(f"  --workers 2 on {big_mb:.0f} MB: {tb:6.1f} s  {big_mb / tb:6.2f} MB/s  peak RSS "
                  f"{rssb / 2**20:6.0f} MiB; {mb:.0f} MB -> {big_mb:.0f} MB: {rssb / rss2:.2f}x (goal within 1.2x)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
