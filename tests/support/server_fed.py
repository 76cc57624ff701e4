"""A model fed as llama.cpp's server feeds a prompt, beside llama.cpp's own log-probs fed the same way.

tests/data/llamacpp_server_fed.json (tools/make_synthetic_arch.py --server-fed) holds llama.cpp's greedy
continuations of prompts of 70 to 2,048 tokens, each fed as its server feeds it: all but the last 4 prompt tokens
in one batch, then those 4, then one token per step. A batch of 64 rows or more takes llama.cpp's tiled flash
attention, a smaller one its row-by-row path: the first batch of every case is a tiled one.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from support import DATA

SERVER_FED = DATA / "llamacpp_server_fed.json"


@functools.cache
def server_fed(name: str) -> dict:
    """The stored entry of model `name` (a synthetic architecture's name, or a real GGUF's file name)."""
    return json.loads(SERVER_FED.read_text(encoding="utf-8"))["models"][name]


#: The threads of the llama.cpp runs the stored outputs come from (tools/bench/llamacpp_decode.py's default): its
#: one-token steps over 512 cached positions or more split the cache into one chunk per thread, so a model compared
#: with them is loaded with kv_split=LLAMACPP_THREADS.
LLAMACPP_THREADS = 2


def feed_as_server(model, cases: list[dict]) -> tuple[list[str], list[float]]:  # noqa: ANN001 (a Model)
    """(positions where model's argmax is not llama.cpp's, described; |log-prob difference| at every one of
    llama.cpp's top 5 of every position), model fed each case as the server feeds it."""
    wrong, diffs = [], []
    for case in cases:
        prompt = case["prompt_ids"]
        s = model.session()
        s.logits_next(prompt[:-4])
        for i, g in enumerate(case["gen"]):
            row = s.logits_next(prompt + [x["id"] for x in case["gen"][:i]]).astype(np.float64)
            lp = row - row.max() - np.log(np.exp(row - row.max()).sum())
            if int(lp.argmax()) != g["id"]:
                wrong.append(f"{case['prompt']}, position {i}: {int(lp.argmax())} != {g['id']}")
            diffs += [abs(lp[t] - v) for t, v in g["top"]]
    return wrong, diffs


def llamacpp(path: str, n_ctx: int):  # noqa: ANN201 (tools/bench/llamacpp_decode.py's LlamaCpp)
    """llama.cpp's own forward pass on the model at path (llama_decode through the xllamacpp wheel, its threads
    LLAMACPP_THREADS, its sliding-window cache as llama-server's), or skip without the shared tools or xllamacpp."""
    import sys

    import pytest

    from support.paths import NO_SHARED_REASON, SHARED

    pytest.importorskip("xllamacpp")
    if SHARED is None:
        pytest.skip(NO_SHARED_REASON)
    tools = str(DATA.parents[1] / "tools" / "bench")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    from llamacpp_decode import LlamaCpp

    return LlamaCpp(path, SHARED, n_ctx=n_ctx, threads=LLAMACPP_THREADS, swa_full=False)

