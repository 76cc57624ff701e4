"""Throughput, load time and memory of a tokenizer on a text: what `minillama bench` prints.

Encode is timed twice: cold (a fresh Tokenizer's first call, caches empty) and warm (best of
several calls, word caches filled). Memory is tracemalloc's count of Python and numpy allocations
while loading (peak) and after it (what the loaded tokenizer keeps), in a separate untimed load.
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .tokenizer import Tokenizer


@dataclass
class BenchResult:
    """One model on one text."""

    model: str
    text: str
    text_bytes: int
    n_tokens: int
    load_s: float
    encode_cold_s: float
    encode_warm_s: float
    decode_s: float
    peak_mib: float      # tracemalloc peak while loading
    retained_mib: float  # still allocated after loading: the tokenizer's tables

    @property
    def encode_mb_s(self) -> float:
        return self.text_bytes / 1e6 / self.encode_warm_s

    @property
    def encode_tok_s(self) -> float:
        return self.n_tokens / self.encode_warm_s

    @property
    def decode_mb_s(self) -> float:
        return self.text_bytes / 1e6 / self.decode_s

    @property
    def decode_tok_s(self) -> float:
        return self.n_tokens / self.decode_s

    def as_dict(self) -> dict[str, float | int | str]:
        d = asdict(self)
        d.update(encode_mb_s=self.encode_mb_s, encode_tok_s=self.encode_tok_s, decode_mb_s=self.decode_mb_s,
                 decode_tok_s=self.decode_tok_s)
        return d


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench(model_path: str, text: str, text_name: str = "text", repeat: int = 5) -> BenchResult:
    """Measure one model on one text (the text is encoded with add_special=False)."""
    t = time.perf_counter()
    tok = Tokenizer.from_file(model_path)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    ids = tok.encode(text, add_special=False)
    cold = time.perf_counter() - t
    warm = _best(lambda: tok.encode(text, add_special=False), repeat)
    tok.decode_bytes(ids[:1])  # build the piece table outside the timing
    decode = _best(lambda: tok.decode_bytes(ids), repeat)
    peak, kept = load_memory(model_path)
    return BenchResult(os.path.basename(model_path), text_name, len(text.encode("utf-8", "surrogatepass")),
                       len(ids), load_s, cold, warm, decode, peak, kept)


def load_memory(model_path: str) -> tuple[float, float]:
    """(peak, retained) MiB of Python and numpy allocations while loading a tokenizer (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tok = Tokenizer.from_file(model_path)
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del tok
    return (peak - base) / 2**20, (kept - base) / 2**20


HEADER = (f"{'model':30s} {'text':12s} {'tokens':>8s} {'load ms':>8s} {'cold ms':>8s} {'enc MB/s':>9s} "
          f"{'enc tok/s':>10s} {'dec MB/s':>9s} {'dec tok/s':>10s} {'load peak MiB':>13s} {'kept MiB':>9s}")


def format_row(r: BenchResult) -> str:
    """One line of the table HEADER describes."""
    return (f"{r.model[:30]:30s} {r.text[:12]:12s} {r.n_tokens:8d} {r.load_s * 1e3:8.1f} {r.encode_cold_s * 1e3:8.1f} "
            f"{r.encode_mb_s:9.2f} {r.encode_tok_s:10.0f} {r.decode_mb_s:9.1f} {r.decode_tok_s:10.0f} "
            f"{r.peak_mib:13.1f} {r.retained_mib:9.1f}")
