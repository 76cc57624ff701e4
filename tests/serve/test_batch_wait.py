"""StepBatcher.expected: sessions that step in lockstep (a server's busy slots) stay in one batch.

Without a wait, the first session back from sampling runs a pass alone or with whoever is there, and four
sessions settle into alternating smaller batches; told how many sessions are generating, a step waits (at most
half a pass) for the others, so after the first pass every pass holds all four."""

from __future__ import annotations

import random
import threading
import time

import numpy as np

from minillama.model.batch import StepBatcher
from minillama.model.cache import KVCache


def _run(expected: int | None) -> list[int]:
    sizes: list[int] = []

    def run_batch(tokens, batch) -> np.ndarray:
        sizes.append(len(tokens))
        time.sleep(0.02)  # a pass
        return np.zeros((len(tokens), 4), np.float32)

    batcher = StepBatcher(run_batch)
    if expected is not None:
        batcher.expected = lambda: expected

    ready = threading.Barrier(4)

    def session(seed: int) -> None:
        rng = random.Random(seed)
        cache = KVCache(1, 1, 2, 2)
        ready.wait(30)  # all four threads running before the first step
        for i in range(12):
            batcher.step(seed, 1, i, cache)
            time.sleep(rng.uniform(0.0005, 0.004))  # sampling between two steps

    threads = [threading.Thread(target=session, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(sizes) == 48
    return sizes


def test_busy_sessions_stay_in_one_batch() -> None:
    sizes = _run(4)
    # the first pass starts before the others arrive (no pass timed yet), so the last holds the rest; on a busy
    # machine one more pass may miss a session that was descheduled for longer than the wait
    assert sum(n != 4 for n in sizes[1:-1]) <= 1 and len(sizes) <= 15, sizes


def test_without_expected_no_step_waits() -> None:
    sizes = _run(None)
    assert len(sizes) > 12, sizes  # batches split: more passes than with the wait


def test_the_pass_leader_runs_every_steps_pick() -> None:
    """A step asked with pick (a sampler) gets pick(its logits), computed by the thread that ran the pass, for every
    step of the pass before any other wakes (their samplers back to back, not four threads passing the GIL around);
    a pick that raises fails its own step only."""
    picked_in: list[tuple[int, int]] = []  # (pass, thread) of each pick
    passes: list[int] = []
    start = threading.Barrier(4)

    def run_batch(tokens, batch) -> np.ndarray:
        passes.append(len(tokens))
        time.sleep(0.05)
        return np.array([[float(t), 0.0] for t in tokens], np.float32)

    batcher = StepBatcher(run_batch)
    batcher.expected = lambda: 4
    results: dict[int, object] = {}

    def session(seed: int) -> None:
        def pick(row: np.ndarray) -> int:
            picked_in.append((len(passes), threading.get_ident()))
            if seed == 3:
                raise ValueError("NaN scores")
            return int(row[0]) * 10

        start.wait(30)
        try:
            results[seed] = batcher.step(seed, seed, 0, KVCache(1, 1, 2, 2), pick)
        except ValueError as e:
            results[seed] = e

    threads = [threading.Thread(target=session, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results.get(s) for s in range(3)] == [0, 10, 20]
    assert isinstance(results[3], ValueError)
    by_pass: dict[int, set[int]] = {}
    for n, ident in picked_in:
        by_pass.setdefault(n, set()).add(ident)
    assert len(picked_in) == 4 and all(len(ids) == 1 for ids in by_pass.values()), picked_in
    # and without pick, the logits as before
    assert np.array_equal(StepBatcher(run_batch).step(0, 5, 0, KVCache(1, 1, 2, 2)), np.array([5.0, 0.0], np.float32))


def test_a_failure_in_the_pass_thread_reaches_every_waiting_step() -> None:
    """What fails in the batcher's thread outside a pass (expected() raising, a stop callback raising) is raised in
    the askers' threads; none waits forever, and the next step starts a new pass thread."""
    batcher = StepBatcher(lambda tokens, batch: np.zeros((len(tokens), 2), np.float32))
    calls = []

    def expected() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("busy slots unknown")
        return 1

    batcher.expected = expected
    try:
        batcher.step(0, 1, 0, KVCache(1, 1, 2, 2))
    except RuntimeError as e:
        assert "busy slots" in str(e)
    else:
        raise AssertionError("expected the pass thread's error")
    assert np.array_equal(batcher.step(0, 1, 0, KVCache(1, 1, 2, 2)), np.zeros(2, np.float32))

    def stop(token: int) -> bool:
        raise ValueError("no eog table")

    try:
        batcher.run(0, 1, 0, KVCache(1, 1, 2, 2), lambda row: 3, ahead=5, stop=stop)
    except ValueError as e:
        assert "eog" in str(e)
    else:
        raise AssertionError("expected the stop callback's error")
