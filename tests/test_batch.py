"""minillama.model.batch: decode steps of several sessions run as one pass give each session the logits its own
steps give (the definition: blocks() one token at a time), and they do run together."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from test_model import write_tiny

from minillama.model import Model
from minillama.model.batch import DecodeBatcher


def test_batched_steps_equal_each_sessions_own(tmp_path: Path) -> None:
    model = Model.from_file(write_tiny(tmp_path / "tiny.gguf"), threads=1)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    steps = 8

    def run(session, prompt: list[int], out: list[np.ndarray]) -> None:
        ids = list(prompt)
        for _ in range(steps):
            row = session.logits_next(ids)
            out.append(row)
            ids.append(int(np.argmax(row)))

    want = []
    for prompt in prompts:
        rows: list[np.ndarray] = []
        run(model.session(), prompt, rows)
        want.append(rows)
    batcher = DecodeBatcher(model, busy=lambda: len(prompts), window=0.5)
    got: list[list[np.ndarray]] = [[] for _ in prompts]
    threads = [threading.Thread(target=run, args=(batcher.session(), p, out)) for p, out in zip(prompts, got)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for w, g in zip(want, got):
        assert len(g) == steps
        np.testing.assert_allclose(np.stack(g), np.stack(w), rtol=1e-5, atol=1e-5)
    assert max(batcher.batches) > 1, batcher.batches  # steps did run together
    assert sum(n * c for n, c in batcher.batches.items()) == len(prompts) * (steps - 1)  # first: the prompt pass

