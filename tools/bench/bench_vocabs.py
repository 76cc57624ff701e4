"""Encode/decode throughput, load time and memory for every shared vocab, and llama3's memory next to
Hugging Face tokenizers'. A benchmark script, not a test: python tools/bench/bench_vocabs.py [--json OUT]

Texts: ../shared/corpus/botchan.txt (English) and wagahaiwa_nekodearu.txt (Japanese).
Memory of a loaded tokenizer is also measured as peak RSS growth in a fresh subprocess, the only
measure that sees Rust allocations, so minillama and Hugging Face tokenizers compare fairly.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from minillama.bench import bench, format_table

SHARED = Path(os.environ.get("MINILLAMA_SHARED", Path(__file__).resolve().parents[3] / "shared"))

_RSS_CHILD = r"""
import sys
kind, path, text_path = sys.argv[1:4]
if kind == "minillama":
    from minillama.tokenizer import Tokenizer as T
    enc = lambda t, s: t.encode(s, add_special=False)
else:
    from tokenizers import Tokenizer as T
    enc = lambda t, s: t.encode(s, add_special_tokens=False).ids
text = open(text_path, encoding="utf-8").read()

def rss():
    # (current, peak) resident set in KiB; writing 5 to clear_refs resets the peak (Linux)
    f = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return int(f["VmRSS"].split()[0]), int(f["VmHWM"].split()[0])

open("/proc/self/clear_refs", "w").write("5")
before = rss()[0]
tok = T.from_file(path)
loaded, load_peak = rss()
enc(tok, text)
encoded, enc_peak = rss()
print(before, loaded, load_peak, encoded, enc_peak)
"""


def rss_growth(kind: str, path: Path, text: Path) -> dict[str, float]:
    """RSS growth (MiB) over the process after its imports: loaded, peak while loading, after one encode."""
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, kind, str(path), str(text)], check=True,
                         capture_output=True, text=True).stdout.split()
    before, loaded, load_peak, encoded, enc_peak = (int(x) / 1024 for x in out)
    return {"loaded_mib": loaded - before, "load_peak_mib": load_peak - before,
            "after_encode_mib": encoded - before, "encode_peak_mib": enc_peak - before}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--vocab", action="append", help="only these vocab file names (repeatable)")
    args = ap.parse_args()
    if not (SHARED / "vocab").is_dir():
        print(f"no shared data at {SHARED} (set MINILLAMA_SHARED)", file=sys.stderr)
        return 2
    texts = {"botchan": SHARED / "corpus/botchan.txt", "wagahai": SHARED / "corpus/wagahaiwa_nekodearu.txt"}
    texts = {k: v.read_text(encoding="utf-8") for k, v in texts.items()}
    rows = []
    results = []
    for path in sorted((SHARED / "vocab").glob("*.gguf")) + [SHARED / "vocab/llama2c-tokenizer.bin"]:
        if args.vocab and path.name not in args.vocab:
            continue
        for name, text in texts.items():
            r = bench(str(path), text, name)
            rows.append(r.as_dict())
            results.append(r)
            print(f"{r.model} {r.text}: done", file=sys.stderr, flush=True)
    print(format_table(results))
    mem = {}
    hf = SHARED / "vocab/llama-3.2-tokenizer.json"
    try:
        import tokenizers  # noqa: F401
        peers = [("minillama", SHARED / "vocab/ggml-vocab-llama-bpe.gguf"), ("hf-tokenizers", hf)]
    except ImportError:
        peers = [("minillama", SHARED / "vocab/ggml-vocab-llama-bpe.gguf")]
    print("\nllama3 (128k tokens, 280k merges): resident memory growth in a fresh process, MiB")
    for kind, path in peers:
        m = mem[kind] = rss_growth(kind, path, SHARED / "corpus/botchan.txt")
        print(f"  {kind:14s} loaded {m['loaded_mib']:6.1f}  (peak {m['load_peak_mib']:6.1f})   "
              f"after encoding botchan {m['after_encode_mib']:6.1f}  (peak {m['encode_peak_mib']:6.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "llama3_rss": mem}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
