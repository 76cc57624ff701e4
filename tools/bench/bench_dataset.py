"""Benchmark `minillama dataset`: end-to-end MB/s for 1 and 2 workers, against HF tokenizers, and peak memory.

    python tools/bench/bench_dataset.py [--mb 50] [--big-mb 200] [--repeat 3] [--vocab llama-bpe|llama-spm]

(docs/performance.md's figure: --vocab llama-spm --mb 25 --big-mb 0.)

minillama's bytecode is compiled first (compileall, into the checkout's __pycache__), as `pip install` leaves an
installed package: with PYTHONDONTWRITEBYTECODE=1 (set on some machines) each run would otherwise compile every
module it imports from source, ~0.1 s of start-up that a user's runs do not pay (--no-compile measures that).

The corpus is ../shared/corpus/diverse.txt repeated to --mb megabytes (paragraph documents). Figures:

* end-to-end MB/s of `minillama dataset --workers N` (a fresh process: load, read, encode, write shards and
  index) for N = 1 and 2, run alternately --repeat times, each run with the load average before it and the
  CPU seconds other processes used meanwhile (on a shared machine they stretch our wall time); the
  ratio of each pair and their median (goal >= 1.7x on 2 cores);
* Hugging Face tokenizers' `encode_batch` (Rust, all cores) on the same vocab (llama-3.2-tokenizer.json
  for llama-bpe; none for llama-spm) and the same paragraphs, timed around encode_batch alone (no reading, no writing);
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
import statistics
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


def _busy() -> float:
    """CPU seconds the whole machine has been busy (all but idle and I/O wait), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def run_dataset(model: Path, corpus: Path, out: Path, workers: int) -> tuple[float, int, float, float]:
    """Wall seconds, peak summed RSS, CPU seconds (all its processes) of one `minillama dataset` run, and the
    CPU seconds other processes of this machine used meanwhile."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "minillama", "dataset", "--model", str(model), "--out", str(out),
           "--workers", str(workers), "--no-progress", str(corpus)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peak = 0
    cpu0 = _cpu(resource.RUSAGE_CHILDREN)  # workers are reaped by the run, the run by us: all counted
    busy0, self0 = _busy(), _cpu(resource.RUSAGE_SELF)
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
    cpu = _cpu(resource.RUSAGE_CHILDREN) - cpu0
    return elapsed, peak, cpu, _busy() - busy0 - cpu - (_cpu(resource.RUSAGE_SELF) - self0)


def hf_encode_batch(vocab: str, corpus: Path) -> tuple[float, float] | None:
    """Wall and CPU seconds of HF tokenizers' encode_batch over the corpus's paragraphs (None: not installed, or no
    tokenizer.json for this vocab)."""
    if vocab not in HF_JSON:
        return None
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
    ap.add_argument("--repeat", type=int, default=3, help="pairs of 1- and 2-worker runs, alternating (default 3)")
    ap.add_argument("--vocab", default="llama-bpe", choices=["llama-bpe", "llama-spm"])
    ap.add_argument("--no-compile", action="store_true", help="do not compile minillama's bytecode first")
    args = ap.parse_args()
    if not args.no_compile:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "minillama")], check=True,
                       stdout=subprocess.DEVNULL)
    model = SHARED / "vocab" / f"ggml-vocab-{args.vocab}.gguf"
    tmp = Path(tempfile.mkdtemp(prefix="bench-dataset-"))
    try:
        corpus = tmp / "corpus.txt"
        size = make_corpus(corpus, args.mb)
        mb = size / 1e6
        print(f"corpus: diverse.txt repeated to {mb:.1f} MB, vocab {args.vocab}, {os.cpu_count()} cores, bytecode "
              f"{'compiled at each start' if args.no_compile and sys.dont_write_bytecode else 'cached'}")
        runs: dict[int, list[tuple[float, int, float]]] = {1: [], 2: []}
        for r in range(args.repeat):
            for w in (1, 2):
                load = _load()
                t, rss, c, others = run_dataset(model, corpus, tmp / f"out{w}", w)
                runs[w].append((t, rss, c))
                print(f"  run {r + 1} --workers {w}: {t:6.2f} s {mb / t:6.2f} MB/s  CPU {c:6.2f} s  peak RSS "
                      f"{rss / 2**20:5.0f} MiB  (load average {load}, other processes {others:5.2f} CPU s)")
        ratios = [a[0] / b[0] for a, b in zip(runs[1], runs[2])]
        cpu_ratios = [2 * a[2] / b[2] for a, b in zip(runs[1], runs[2])]
        t1, t2 = statistics.median(r[0] for r in runs[1]), statistics.median(r[0] for r in runs[2])
        c2, rss2 = statistics.median(r[2] for r in runs[2]), max(r[1] for r in runs[2])
        same = all((tmp / "out1" / n).read_bytes() == (tmp / "out2" / n).read_bytes()
                   for n in os.listdir(tmp / "out1"))
        print(f"  medians: --workers 1 {t1:6.2f} s {mb / t1:6.2f} MB/s, --workers 2 {t2:6.2f} s {mb / t2:6.2f} MB/s "
              f"(CPU {c2:6.2f} s)")
        print(f"  workers 2 / workers 1, wall, each pair: {', '.join(f'{x:.2f}x' for x in ratios)}; median "
              f"{statistics.median(ratios):.2f}x (goal >= 1.7x); outputs identical: {same}")
        print(f"  2 x CPU(workers 1) / CPU(workers 2), each pair: {', '.join(f'{x:.2f}x' for x in cpu_ratios)} "
              "(the wall ratio on two otherwise idle cores, if CPU seconds did not stretch when both cores work)")
        hf = hf_encode_batch(args.vocab, corpus)
        if hf is not None:
            th, ch = hf
            print(f"  HF tokenizers encode_batch (encode only): {th:6.1f} s  {mb / th:6.2f} MB/s  CPU {ch:6.1f} s")
            print(f"  ours --workers 2 (end to end, median) / HF encode_batch: {th / t2:.2f}x wall (goal >= 2x), "
                  f"{ch / c2:.2f}x CPU")
        if args.big_mb:
            shutil.rmtree(tmp / "out1", ignore_errors=True)
            big = tmp / "big.txt"
            big_mb = make_corpus(big, args.big_mb) / 1e6
            corpus.unlink()
            tb, rssb, _, _ = run_dataset(model, big, tmp / "outb", 2)
            print(f"  --workers 2 on {big_mb:.0f} MB: {tb:6.1f} s  {big_mb / tb:6.2f} MB/s  peak RSS "
                  f"{rssb / 2**20:6.0f} MiB; {mb:.0f} MB -> {big_mb:.0f} MB: {rssb / rss2:.2f}x (goal within 1.2x)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
