"""Throughput, load time and memory of a tokenizer on a text: what `minillama bench` prints.

Encode is timed as a user tokenizing a data set meets it: the text is split into paragraphs (at
blank lines) and encoded once, paragraph by paragraph, by a Tokenizer loaded just before (first
pass: every word cache empty, each new word computed), then again `repeat` times (steady state: the
best of those passes, caches warm). A text read once costs the first-pass figure; a stream of similar
text tends to the steady-state one. Memory is tracemalloc's count of Python and numpy allocations
while loading (peak) and after it (what the loaded tokenizer keeps), in a separate untimed load.
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .tokenizer import Tokenizer


@dataclass
class BenchResult:
    """One model on one text."""

    model: str
    backend: str  # Tokenizer.backend: 'native' (the C core) or 'pure'
    text: str
    text_bytes: int
    n_tokens: int
    load_s: float
    encode_first_s: float   # one pass, paragraph by paragraph, on a freshly loaded tokenizer
    encode_steady_s: float  # the best of `repeat` further passes (warm caches)
    decode_s: float
    peak_mib: float      # tracemalloc peak while loading
    retained_mib: float  # still allocated after loading: the tokenizer's tables

    @property
    def encode_first_mb_s(self) -> float:
        return self.text_bytes / 1e6 / self.encode_first_s

    @property
    def encode_mb_s(self) -> float:
        """Steady-state MB/s."""
        return self.text_bytes / 1e6 / self.encode_steady_s

    @property
    def encode_tok_s(self) -> float:
        return self.n_tokens / self.encode_steady_s

    @property
    def decode_mb_s(self) -> float:
        return self.text_bytes / 1e6 / self.decode_s

    @property
    def decode_tok_s(self) -> float:
        return self.n_tokens / self.decode_s

    def as_dict(self) -> dict[str, float | int | str]:
        d = asdict(self)
        d.update(encode_first_mb_s=self.encode_first_mb_s, encode_mb_s=self.encode_mb_s, encode_tok_s=self.encode_tok_s, decode_mb_s=self.decode_mb_s,
                 decode_tok_s=self.decode_tok_s)
        return d


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def cut_at_double_newlines(text: str) -> list[str]:
    """text cut at each "\n\n" (the separators kept out, no other blank line), as perf_ratio.py's diverse
    scenarios cut it; not fileio.paragraphs, which also cuts at lines of spaces."""
    return [p for p in text.split("\n\n") if p]


def bench(model_path: str, text: str, text_name: str = "text", repeat: int = 5) -> BenchResult:
    """Measure one model on one text (encoded paragraph by paragraph with add_special=False)."""
    docs = cut_at_double_newlines(text)
    t = time.perf_counter()
    tok = Tokenizer.from_file(model_path)
    load_s = time.perf_counter() - t

    def one_pass() -> None:
        for d in docs:
            tok.encode(d, add_special=False)

    t = time.perf_counter()
    one_pass()
    first = time.perf_counter() - t
    steady = _best(one_pass, repeat)
    ids = tok.encode(text, add_special=False)  # the token count and decode input: the text as one piece
    tok.decode_bytes(ids[:1])  # build the piece table outside the timing
    decode = _best(lambda: tok.decode_bytes(ids), repeat)
    peak, kept = load_memory(model_path)
    encoded = sum(len(d.encode("utf-8", "surrogatepass")) for d in docs)  # the blank lines are not encoded
    return BenchResult(os.path.basename(model_path), tok.backend, text_name, encoded,
                       len(ids), load_s, first, steady, decode, peak, kept)


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


# (header, how a result shows in that column); numbers right-aligned with thousands separators.
COLUMNS: tuple[tuple[str, Callable[[BenchResult], str]], ...] = (
    ("model", lambda r: r.model),
    ("backend", lambda r: r.backend),
    ("text", lambda r: r.text),
    ("tokens", lambda r: f"{r.n_tokens:,}"),
    ("load ms", lambda r: f"{r.load_s * 1e3:,.1f}"),
    ("first MB/s", lambda r: f"{r.encode_first_mb_s:,.2f}"),
    ("steady MB/s", lambda r: f"{r.encode_mb_s:,.2f}"),
    ("enc tok/s", lambda r: f"{r.encode_tok_s:,.0f}"),
    ("dec MB/s", lambda r: f"{r.decode_mb_s:,.1f}"),
    ("dec tok/s", lambda r: f"{r.decode_tok_s:,.0f}"),
    ("load peak MiB", lambda r: f"{r.peak_mib:,.1f}"),
    ("kept MiB", lambda r: f"{r.retained_mib:,.1f}"),
)


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as an aligned table: a header line, then one line per result, columns two spaces apart,
    names never cut."""
    rows = [[name for name, _ in COLUMNS]] + [[cell(r) for _, cell in COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    return "\n".join(lines)
