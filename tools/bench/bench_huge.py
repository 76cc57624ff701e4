"""Huge single inputs: time and peak RSS growth of ONE encode call per model type, beside llama.cpp.
A benchmark script, not a test:

    python tools/bench/bench_huge.py [--mb 50] [--run 10000000] [--vocab NAME]...

Two inputs: the first --mb MB of ../shared/corpus/diverse.txt repeated as needed (one str), and
--run copies of the letter 'a' (one pre-token, one word: the worst case of the merge heaps). Each
measurement runs in a fresh subprocess: RSS growth is the peak resident set (VmHWM, reset before the
call) minus the resident set just before it, so it counts the text's working copies, the word lists
and the returned ids; bytes per input byte = growth / input size. With llama.cpp, a third line
gives minillama's time and memory as multiples of llama.cpp's. The defaults are the sizes the figures in docs/performance.md use (a full run takes
about 5 minutes on two cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SHARED = Path(os.environ.get("MINILLAMA_SHARED", Path(__file__).resolve().parents[3] / "shared"))
VOCABS = ["ggml-vocab-llama-spm", "ggml-vocab-llama-bpe", "ggml-vocab-bert-bge", "ggml-vocab-unigram8k"]

_CHILD = r"""
import sys, time
who, vocab, kind, size, corpus, tools = sys.argv[1:7]
size = int(size)
if kind == "text":
    base = open(corpus, encoding="utf-8").read()
    text = (base * (size // len(base.encode()) + 1))[:size]
else:
    text = "a" * size
if who == "minillama":
    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file(vocab)
    enc = lambda s: tok.encode(s, add_special=False)
else:
    sys.path.insert(0, tools)
    from llamacpp_oracle import Oracle
    o = Oracle(vocab)
    enc = lambda s: o.tokenize(s, False, False)
enc("warm up")
def rss():
    f = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return int(f["VmRSS"].split()[0]) * 1024, int(f["VmHWM"].split()[0]) * 1024
open("/proc/self/clear_refs", "w").write("5")
before = rss()[0]
t = time.perf_counter()
try:
    n = len(enc(text))
    err = ""
except MemoryError:
    n, err = -1, "MemoryError"
dt = time.perf_counter() - t
peak = rss()[1]
print(n, dt, peak - before, len(text.encode()), err)
"""


def measure(who: str, vocab: str, kind: str, size: int, timeout: float) -> tuple[str, float, float] | str:
    """(row, seconds, bytes of growth per input byte) of one encode in a fresh process, or why it failed."""
    args = [sys.executable, "-c", _CHILD, who, str(SHARED / "vocab" / f"{vocab}.gguf"), kind, str(size),
            str(SHARED / "corpus" / "diverse.txt"), str(SHARED / "tools")]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout:.0f} s"
    if out.returncode:
        return f"failed: {out.stderr.strip().splitlines()[-1][:80] if out.stderr.strip() else out.returncode}"
    n, dt, growth, nbytes, *err = out.stdout.split()
    row = (f"{float(dt):8.2f} s {int(growth) / 2**20:9.1f} MiB {int(growth) / int(nbytes):6.1f} B/B "
           f"{int(n):>10,d} ids {' '.join(err)}")
    return row, float(dt), int(growth) / int(nbytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="MB of diverse text in one str (default 50)")
    ap.add_argument("--run", type=int, default=10_000_000, help="length of the run of 'a' (default 10,000,000)")
    ap.add_argument("--vocab", action="append", help="only these vocabs (file stems; repeatable)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement (default 600)")
    ap.add_argument("--no-llamacpp", action="store_true")
    args = ap.parse_args()
    print(f"{'vocab':24s} {'input':18s} {'tokenizer':10s} {'time':>10s} {'RSS growth':>13s} {'per byte':>9s}")
    for vocab in args.vocab or VOCABS:
        for kind, size, label in (("text", int(args.mb * 1e6), f"{args.mb:g} MB diverse"),
                                  ("run", args.run, f"'a' x {args.run:,}")):
            got = []
            for who in ("minillama",) + (() if args.no_llamacpp else ("llama.cpp",)):
                m = measure(who, vocab, kind, size, args.timeout)
                got.append(m)
                print(f"{vocab:24s} {label:18s} {who:10s} {m if isinstance(m, str) else m[0]}", flush=True)
            if len(got) == 2 and not isinstance(got[0], str) and not isinstance(got[1], str):
                print(f"{vocab:24s} {label:18s} {'ratio':10s} {got[0][1] / got[1][1]:8.2f} x time, "
                      f"{got[0][2] / max(got[1][2], 1e-9):.2f} x bytes per byte (minillama / llama.cpp)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
