"""Write llama.cpp's greedy continuations (with top-5 log-probs) of tools/model_prompts.txt as test data.

    python tools/make_model_expected.py MODEL.gguf OUT.json [PROMPTS.txt] [N_PREDICT]

Runs ../shared/tools/llamacpp_generate.py (llama.cpp in-process through xllamacpp, 2 threads) and keeps what
tests/model/test_model.py teacher-forces minillama on: prompt, prompt_ids, the generated ids with their top log-probs,
and whether llama.cpp's report is position-aligned. Made tests/data/smollm2_llamacpp_greedy.json from
SmolLM2-135M-Instruct.Q4_1.gguf with the defaults, and tests/data/gemma3_llamacpp_greedy.json (read by
tools/bench/bench_model.py --exactness) from gemma-3-270m-q4_k_m.gguf with tools/gemma_prompts.txt (10 prompts) and 32 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = Path(os.environ.get("MINILLAMA_SHARED", HERE.parent.parent / "shared")) / "tools" / "llamacpp_generate.py"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    model, out = argv[0], argv[1]
    prompts = argv[2] if len(argv) > 2 else str(HERE / "model_prompts.txt")
    n_predict = argv[3] if len(argv) > 3 else "48"
    run = subprocess.run([sys.executable, str(TOOL), model, n_predict, prompts], capture_output=True, check=True)
    cases = json.loads(run.stdout)
    keep = [{"prompt": c["prompt"], "prompt_ids": c["prompt_ids"], "aligned": c["aligned"],
             "gen": [{"id": g["id"], "top": [[i, round(lp, 5)] for i, lp in g["top"]]} for g in c["gen"]]}
            for c in cases]
    data = {"model": os.path.basename(model), "n_predict": int(n_predict), "cases": keep}
    Path(out).write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
