"""Single-token steps of several sequences run together in one pass (as StepBatcher runs them) and each alone, so a
test can compare the two: batching must not change what a sequence computes."""

from __future__ import annotations

import numpy as np

from minillama.model import Model
from minillama.model.batch import Batch


def steps_together_and_alone(model: Model, prompts: list[list[int]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt run into a cache of its own, then `steps` greedy single-token steps of all of them: in one pass
    per step (Model._run_steps) and each sequence alone (a cache per sequence, the same tokens); the two logits
    arrays [steps, n_seq, n_vocab]."""
    together, alone = [model._new_cache() for _ in prompts], [model._new_cache() for _ in prompts]
    for p, a, b in zip(prompts, together, alone, strict=True):
        model._forward(p, 0, a, last_only=True)
        model._forward(p, 0, b, last_only=True)
    tokens = [(5 * i + 1) % model.n_vocab for i in range(len(prompts))]
    got, want = [], []
    for k in range(steps):
        starts = [len(p) + k for p in prompts]
        got.append(model._run_steps(tokens, Batch.steps(starts, together)))
        want.append(np.stack([model._forward([t], s, c, last_only=True)[-1]
                              for t, s, c in zip(tokens, starts, alone, strict=True)]))
        tokens = [int(t) for t in got[-1].argmax(-1)]
    return np.stack(got), np.stack(want)
