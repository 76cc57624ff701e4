"""Memory bounds of the adversarial trial, measured as the growth of the peak resident set in a fresh process:
a 100 KB Unigram file loads (and encodes an invalid byte) in under 200 MB; 15,000 distinct 10,000-character
words keep the word cache under its documented bound (README: at most 64 MiB estimated per tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fixtures import BASE_TOKENS, t5_gguf
from support.limits import run_limited
from support.paths import require_shared

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")

MB = 1 << 20

PEAK = """
def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""


def test_100kb_unigram_file_loads_under_200mb(tmp_path: Path) -> None:
    path = tmp_path / "long.gguf"
    t5_gguf(path, BASE_TOKENS + [("x" * 100_000, -4.0, 1)])
    assert path.stat().st_size < 110_000
    p = run_limited(PEAK + f"""
import numpy, gguf, regex  # the imports every load needs, outside the measurement
from minillama.tokenizer import Tokenizer
reset_peak()
base = rss_kib("VmRSS")
tok = Tokenizer.from_file({str(path)!r})
tok.encode("ab" + "x" * 100_001 + "ab\\udcff", add_special=False)
print((rss_kib("VmHWM") - base) * 1024)
""", mem_mb=2048, timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    growth = int(p.stdout.decode().split()[-1])
    assert growth < 200 * MB, f"peak RSS grew by {growth / MB:.0f} MB"


@pytest.mark.slow  # the suite's slowest: 150 M characters encoded (209 of 441 s in the review's run)
def test_long_distinct_words_keep_the_cache_bounded() -> None:
    vocab = require_shared("vocab", "ggml-vocab-llama-spm.gguf")
    p = run_limited(PEAK + f"""
import random
from minillama.tokenizer import Tokenizer
tok = Tokenizer.from_file({str(vocab)!r})
tok.encode("warm up " * 1000)
rnd = random.Random(0)
ab = str.maketrans("01", "ab")
base = rss_kib("VmRSS")
reset_peak()
for i in range(15_000):  # 150 M characters, each word new: the old cache grew ~70 KB per word (4.5 GB)
    tok.encode(format(rnd.getrandbits(10_000), "010000b").translate(ab), add_special=False)
print((rss_kib("VmHWM") - base) * 1024)
""", mem_mb=4096, timeout=1200)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    growth = int(p.stdout.decode().split()[-1])
    # 64 MiB of cache (estimated) plus what one encode of a 10,000-character word allocates while it runs
    assert growth < (64 + 48) * MB, f"peak RSS grew by {growth / MB:.0f} MB"
