"""`minillama bench` and minillama.bench: the report's counts are those of the input, times are positive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.paths import vocab_path
from support.reference import read_conformance

from minillama.bench import bench, format_table
from minillama.tokenizer import Tokenizer, default_vocab_path


def test_bench_counts_match_the_text(tmp_path: Path) -> None:
    text = "Llamas hum. 日本語も少し。\n" * 50
    r = bench(default_vocab_path(), text, "t", repeat=2)
    assert r.text_bytes == len(text.encode())
    assert r.n_tokens > 0 and r.load_s > 0 and r.encode_steady_s > 0 and r.encode_first_s > 0 and r.decode_s > 0
    assert r.encode_mb_s == r.text_bytes / 1e6 / r.encode_steady_s
    assert r.encode_first_mb_s == r.text_bytes / 1e6 / r.encode_first_s
    header, row = format_table([r]).splitlines()
    assert header.startswith("model") and row.startswith("default-vocab.gguf")
    assert "load ms  first MB/s" in header  # headers never run together
    assert header.split()[:2] == ["model", "backend"] and row.split()[1] == r.backend
    assert r.backend == Tokenizer.from_file(default_vocab_path()).backend


def test_bench_token_count_is_llamacpps() -> None:
    """On a shared vocab the token count equals the number of ids llama.cpp gives for the same text."""
    cases = read_conformance("ggml-vocab-llama-bpe")
    text = max((c for c in cases), key=lambda c: len(c["ids"]))
    r = bench(str(vocab_path("ggml-vocab-llama-bpe")), text["text"], "case", repeat=1)
    assert r.n_tokens == len(text["ids"])


def test_bench_cli_json(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("one two three four " * 100, encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "minillama", "bench", "--repeat", "1", "--json", str(f)],
                         capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    assert d["text_bytes"] == f.stat().st_size and d["n_tokens"] > 0 and d["encode_tok_s"] > 0


def test_bench_cli_missing_file() -> None:
    p = subprocess.run([sys.executable, "-m", "minillama", "bench", "/nonexistent/file.txt"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "/nonexistent/file.txt" in p.stderr
