"""The sampler's pass over a whole vocab in C (_core.top_k, sample.c) against its pure twin (sampling.py's numpy
chain): the same candidates in the same order, the same draws from the same seed, the same errors; on this CPU's
kernels and, in a child, the scalar ones; and the binding's refusals of arrays it cannot take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minillama.backend import native_core
from minillama.errors import ArgumentError
from minillama.sampling import Sampler

_core = native_core("auto")
pytestmark = pytest.mark.skipif(_core is None, reason="the native core is not built")
REPO = Path(__file__).resolve().parents[2]


def stable_top(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first k (id, score) of a stable sort of scores, highest first, -inf and NaN left out: what the pure
    chain's filter and _best_first keep."""
    ids = np.flatnonzero(scores > -np.inf)
    order = ids[np.argsort(-scores[ids], kind="stable")][:k]
    return order, scores[order]


def cases(seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """(x float32, adjusted ids, their scores, k): ties (few distinct values), -inf, +inf, -0.0 beside 0.0, adjusted
    ids that move a score up, down, to -inf, and lengths that are no multiple of the 32-score step."""
    rng = np.random.default_rng(seed)
    out = []
    for n, k in ((49152, 40), (1000, 1), (37, 9), (4099, 64), (200, 49), (64, 3)):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        if seed % 3 == 0:
            x = np.round(x).astype(np.float32)  # many ties
        if seed % 4 == 1:
            x[rng.integers(0, n, n // 5)] = -np.inf
        if seed % 5 == 2:
            x[rng.integers(0, n, 3)] = np.inf
            x[rng.integers(0, n, 5)] = -0.0
        adj = np.unique(rng.integers(0, n, rng.integers(0, 6) if seed % 7 else 2 * k + 3))  # more than k, too
        with np.errstate(invalid="ignore"):  # +inf banned: NaN, never kept
            val = x[adj].astype(np.float64) + rng.choice([-100.0, 2.5, 0.0, -np.inf, 1e-9], adj.size)
        out.append((x, adj.astype(np.int64), val, k))
    return out


def native_top(x: np.ndarray, adj: np.ndarray, val: np.ndarray, k: int) -> tuple[int, np.ndarray, np.ndarray]:
    idx, got = np.full(k, -7, np.int64), np.full(k, np.nan)
    kept = _core.top_k(x, adj, val, idx, got)
    return kept, idx[:max(kept, 0)], got[:max(kept, 0)]


def mismatches() -> list[str]:
    """Where _core.top_k differs from the stable sort, over cases(0..39) (also run in the scalar child)."""
    bad = []
    for seed in range(40):
        for x, adj, val, k in cases(seed):
            scores = x.astype(np.float64)
            scores[adj] = val
            want_ids, want = stable_top(scores, k)
            kept, ids, got = native_top(x, adj, val, k)
            if kept != want_ids.size or not np.array_equal(ids, want_ids) or not np.array_equal(got, want):
                bad.append(f"seed {seed} n {x.size} k {k}: {ids[:5]} != {want_ids[:5]}")
    return bad


def test_native_top_k_is_the_first_k_of_the_stable_sort() -> None:
    assert mismatches() == []


def test_the_scalar_top_k_gives_the_same() -> None:
    """The fallback every CPU has: MINILLAMA_KERNELS=scalar in a child (the choice is made once per process)."""
    code = ("import sys, json; sys.path[:0] = [sys.argv[1] + '/tests/model']; import test_sampling_native as t; "
            "from minillama._native import _core; print(json.dumps([_core.kernels(), t.mismatches()]))")
    env = dict(os.environ, MINILLAMA_KERNELS="scalar")
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env, check=True,
                         timeout=600)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["scalar", []]


def test_a_nan_score_is_found_wherever_it_is() -> None:
    for at in (0, 31, 32, 40000, 49151):
        x = np.zeros(49152, np.float32)
        x[at] = np.nan
        assert native_top(x, np.array([at], np.int64), np.array([1.0]), 40)[0] == -1  # even under an adjusted id


def pure(sampler: Sampler) -> Sampler:
    sampler._core = None  # the numpy chain, as MINILLAMA_BACKEND=pure builds it
    return sampler


def native(sampler: Sampler) -> Sampler:
    sampler._core = _core  # the C pass, as the native backend builds it (whatever MINILLAMA_BACKEND says here)
    return sampler


@pytest.mark.parametrize("settings", [
    {"temperature": 0.8, "min_p": 0.05, "logit_bias": {2: -100.0, 7: 5.0, 49151: float("-inf")}},
    {"temperature": 1.0, "top_k": 5, "top_p": 0.5, "repeat_penalty": 1.3, "frequency_penalty": 0.2,
     "presence_penalty": 0.1},
    {"temperature": 0.0, "logit_bias": {3: 40.0}},
    {"temperature": 2.0, "top_k": 1000, "top_p": 1.0},
], ids=["bias", "penalties", "greedy-bias", "wide"])
def test_samplers_draw_the_same_on_both_backends(settings: dict) -> None:
    """A seeded sampler picks the same ids from a model's float32 scores with the native pass and the numpy chain,
    draw after draw (penalties over the ids accepted so far), ties and banned ids included."""
    rng = np.random.default_rng(1)
    in_c, numpy_chain = native(Sampler(seed=9, **settings)), pure(Sampler(seed=9, **settings))
    for step in range(300):
        x = (rng.standard_normal(49152) * 3).astype(np.float32)
        if step % 3 == 0:
            x = np.round(x * 2).astype(np.float32)
        a, b = in_c.sample_logits(x), numpy_chain.sample_logits(x)
        assert a == b, step
        in_c.accept([a])
        numpy_chain.accept([b])


def test_both_backends_refuse_the_same_scores() -> None:
    x = np.zeros(49152, np.float32)
    x[100] = np.nan
    for s in (native(Sampler(seed=1)), pure(Sampler(seed=1))):
        with pytest.raises(ArgumentError, match="NaN"):
            s.sample_logits(x)
    x = np.full(49152, -np.inf, np.float32)
    for s in (native(Sampler(seed=1, logit_bias={5: 1.0})), pure(Sampler(seed=1, logit_bias={5: 1.0}))):
        with pytest.raises(ArgumentError, match="no candidate"):
            s.sample_logits(x)


@pytest.mark.parametrize("args, message", [
    ((np.zeros(8, np.float64), np.zeros(0, np.int64), np.zeros(0), np.zeros(2, np.int64), np.zeros(2)), "4 bytes"),
    ((np.zeros(8, np.float32), np.array([3, 3], np.int64), np.zeros(2), np.zeros(2, np.int64), np.zeros(2)),
     "ascending"),
    ((np.zeros(8, np.float32), np.array([8], np.int64), np.zeros(1), np.zeros(2, np.int64), np.zeros(2)), "0..7"),
    ((np.zeros(8, np.float32), np.array([-1], np.int64), np.zeros(1), np.zeros(2, np.int64), np.zeros(2)), "0..7"),
    ((np.zeros(8, np.float32), np.array([1], np.int64), np.zeros(2), np.zeros(2, np.int64), np.zeros(2)),
     "as many"),
    ((np.zeros(8, np.float32), np.zeros(0, np.int64), np.zeros(0), np.zeros(2, np.int64), np.zeros(3)), "as many"),
    ((np.zeros(8, np.float32), np.zeros(0, np.int64), np.zeros(0), np.zeros(2, np.int32), np.zeros(2)), "8-byte"),
])
def test_top_k_refuses_arrays_it_cannot_take(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _core.top_k(*args)
    frozen = np.zeros(2, np.int64)
    frozen.setflags(write=False)
    with pytest.raises((ValueError, BufferError, TypeError)):
        _core.top_k(np.zeros(8, np.float32), np.zeros(0, np.int64), np.zeros(0), frozen, np.zeros(2))
