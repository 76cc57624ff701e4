"""Rows per second of Embedding.lookup for batches of random token ids (a plain script, not a test).

    python tools/bench/bench_embedding.py [--model PATH] [--ids 1000] [--repeat 20] [--types Q4_K ...|all]

Measures a real model (--model, default $MINILLAMA_TEST_GGUF, e.g. SmolLM2-135M-Instruct.Q4_1.gguf
whose token_embd is Q8_0) and synthetic tables written to a temporary directory (default: one Q4_K
table of 32000 x 4096, the size of a 7B llama's). Every repeat looks up a fresh batch of distinct
random ids; the first batch of each file also pays the page faults of a cold map. For scale, the same
rows are dequantized with gguf.quants.dequantize as well.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minillama.embedding import SUPPORTED_TYPES, TENSOR_NAME, Embedding  # noqa: E402
from minillama.gguffile.reader import read_gguf  # noqa: E402

# Byte offsets of each type's float16 scales (kept finite in synthetic blocks); Q8_K/MXFP4 handled below.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "TQ1_0": [52], "TQ2_0": [64]}


def write_synthetic(path: Path, type_name: str, n_vocab: int, n_embd: int, seed: int = 0) -> Path:
    """A GGUF holding only a token_embd.weight of valid random blocks of the given type."""
    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    n_blocks = n_vocab * n_embd // block_size
    if type_name in ("F32", "F16", "BF16"):
        raw = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
        raw = gguf.quants.quantize(raw, qtype).view(np.uint8).reshape(n_vocab, -1)
    else:
        raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
        for at in F16_FIELDS.get(type_name, []):
            raw[:, at:at + 2] = (rng.standard_normal(n_blocks) * 0.01).astype("<f2").view(np.uint8).reshape(-1, 2)
        if type_name == "Q8_K":
            raw[:, 0:4] = (rng.standard_normal(n_blocks) * 0.01).astype("<f4").view(np.uint8).reshape(-1, 4)
        if type_name == "MXFP4":
            raw[:, 0] = rng.integers(110, 130, n_blocks, dtype=np.uint8)
        raw = raw.reshape(n_vocab, -1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor(TENSOR_NAME, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_rows(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The same lookup done with gguf.quants.dequantize on rows sliced from a numpy.memmap."""
    gf = read_gguf(path)
    info = next(t for t in gf.tensors if t.name == TENSOR_NAME)
    qtype = GGMLQuantizationType(info.ggml_type)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    row_bytes = info.shape[0] // block_size * type_size
    table = np.memmap(path, np.uint8, "r", gf.data_offset + info.offset, (info.shape[1], row_bytes))
    return lambda ids: gguf.quants.dequantize(np.asarray(table[ids]), qtype)


def timed(fn: Callable[[np.ndarray], np.ndarray], batches: list[np.ndarray]) -> list[float]:
    """Seconds per call of fn on each batch."""
    out = []
    for ids in batches:
        t0 = time.perf_counter()
        fn(ids)
        out.append(time.perf_counter() - t0)
    return out


def bench(path: Path, label: str, n_ids: int, repeat: int, baseline: bool) -> None:
    """Print rows/s of Embedding.lookup (and gguf.quants.dequantize) on one file."""
    t0 = time.perf_counter()
    e = Embedding.from_file(path)
    t_open = time.perf_counter() - t0
    rng = np.random.default_rng(1234)
    batches = [rng.choice(e.n_vocab, size=min(n_ids, e.n_vocab), replace=False) for _ in range(repeat + 1)]
    times = timed(e.lookup, batches)
    first, rest = times[0], times[1:]
    rate = n_ids / statistics.median(rest)
    print(f"{label}: {e.n_vocab} x {e.n_embd} {e.ggml_type}, open {t_open * 1e3:.1f} ms")
    print(f"  Embedding.lookup({n_ids} ids): median {rate:,.0f} rows/s ({statistics.median(rest) * 1e3:.2f} ms), "
          f"best {n_ids / min(rest):,.0f} rows/s, first (cold map) {first * 1e3:.2f} ms")
    if baseline and e.ggml_type == "Q8_K":
        print("  gguf.quants.dequantize: cannot dequantize Q8_K")
    elif baseline:
        ref = timed(gguf_rows(path), batches[1:])
        ref_rate = n_ids / statistics.median(ref)
        print(f"  gguf.quants.dequantize of the same rows: median {ref_rate:,.0f} rows/s "
              f"(lookup is {rate / ref_rate:.1f}x)")
    e.close()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and benchmark the real model (when found) and the synthetic tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("MINILLAMA_TEST_GGUF"),
                    help="a GGUF model (default: $MINILLAMA_TEST_GGUF)")
    ap.add_argument("--ids", type=int, default=1000, help="ids per lookup (default 1000)")
    ap.add_argument("--repeat", type=int, default=20, help="timed lookups per file (default 20)")
    ap.add_argument("--types", nargs="+", default=["Q4_K"], help="synthetic table types, or 'all'")
    ap.add_argument("--n-vocab", type=int, default=32000)
    ap.add_argument("--n-embd", type=int, default=4096)
    ap.add_argument("--no-baseline", action="store_true", help="skip the gguf.quants.dequantize comparison")
    args = ap.parse_args(argv)
    types = list(SUPPORTED_TYPES) if args.types == ["all"] else args.types

    if args.model and Path(args.model).is_file():
        bench(Path(args.model), Path(args.model).name, args.ids, args.repeat, not args.no_baseline)
    else:
        print(f"real model: skipped (--model / MINILLAMA_TEST_GGUF {args.model!r} is not a file)")
    with tempfile.TemporaryDirectory() as tmp:
        for type_name in types:
            path = write_synthetic(Path(tmp) / f"{type_name}.gguf", type_name, args.n_vocab, args.n_embd)
            bench(path, f"synthetic {type_name}", args.ids, args.repeat, not args.no_baseline)
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
