"""How many BLAS threads a forward pass uses: measured as it runs, so a busy machine never makes the default slower
than one thread.

A second core reads a single-token step's weights faster on a quiet machine (SmolLM2 16 -> 23 tokens/s here), but
OpenBLAS's threads meet at a barrier after every matrix product and spin while they wait: when another process
holds a core, each of a step's ~200 products waits for a descheduled thread, and generation collapsed from about
5 tokens/s with one thread to 1 with two. OpenBLAS reads its spin time only when numpy loads,
so a library cannot change it. Instead AutoThreads times the two choices it has, one thread and n, separately
for single-token steps and for batched passes: it starts with n when /proc/stat shows idle cores for them (else
1, and then n as soon as they are idle), tries the other choice on the ninth pass (a short run keeps its start) and then again after a number of passes that grows with how much
it lost (20 passes per times-slower, doubling while it keeps losing, at most 512), and runs the faster one in
between: the tries cost about 5% when the other choice is far slower.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from threadpoolctl import ThreadpoolController

__all__ = ["AutoThreads", "usable_cores", "idle_cores", "native_threads"]

_BLAS = ThreadpoolController()
R = TypeVar("R")

#: Passes between tries of the other choice: at least FIRST_INTERVAL, and TRIES_PER_LOSS times as many as the
#: losing choice was slower (a try 6x slower waits 120 passes: about 5% lost to tries), doubling while it keeps
#: losing, up to MAX_INTERVAL.
FIRST_INTERVAL = 4
TRIES_PER_LOSS = 20
MAX_INTERVAL = 512
#: Seconds between looks at the idle cores while more threads, never timed, wait for them (_Choice._cores_idle).
IDLE_CHECK = 0.25


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's limit), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def idle_cores() -> int:
    """Usable cores that no other process's runnable thread wants right now (/proc/stat's procs_running, less this
    process's running threads: a server's event loop handing a request to the worker is not a competitor), this
    thread's own included; all of them where the system does not say."""
    cores, running = usable_cores(), procs_running()
    if running is None:
        return cores
    return max(0, cores - max(running - own_running_threads(), 0))


def procs_running() -> int | None:
    """The machine's running or runnable threads now (/proc/stat's procs_running), None where it does not say."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("procs_running"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def own_running_threads() -> int:
    """This process's threads that are running or runnable now (state R in /proc/self/task), at least 1 (this one)."""
    n = 0
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/stat", encoding="ascii") as f:
                    n += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                continue
    except OSError:
        return 1
    return max(n, 1)


#: Threads the native kernels use (minillama.model.layers.QuantLinear): the count of the innermost limited().
_NATIVE = [1]


def native_threads() -> int:
    """How many threads a native matrix product splits its rows over now (set by limited)."""
    return _NATIVE[0]


def limited(threads: int | None, fn: Callable[[], R], native: bool = False, blas: bool = True) -> R:
    """fn() with numpy's BLAS and the native kernels limited to threads (None: as numpy set it). native: the
    matrix products run in the native kernels, so BLAS (attention's small products) gets one thread: OpenBLAS's
    threads spin after each call and would take the cores from the kernels' workers (prompt 36 -> 8-14 tok/s).
    blas=False: fn calls no BLAS at all (the C blocks), so BLAS is left alone (the limit costs about a tenth of a
    millisecond per call, a step's tenth of that)."""
    if threads is None:
        return fn()
    before, _NATIVE[0] = _NATIVE[0], threads
    try:
        if not blas:
            return fn()
        with _BLAS.limit(limits=1 if native else threads, user_api="blas"):
            return fn()
    finally:
        _NATIVE[0] = before


#: Looks at the idle cores a kind of pass takes before it starts on one thread, and the seconds between them.
START_LOOKS = 3
START_GAP = 0.002


def _cores_free(n: int) -> bool:
    """Whether n cores look idle, asked up to START_LOOKS times a moment apart: one look can catch a thread of this
    process between two states (the server's event loop handing a request over is running when /proc/stat is read
    and asleep when its own tasks are), and a 620-token prompt then ran on one thread of two (3.3 s, not 1.5 s)."""
    for look in range(START_LOOKS):
        if idle_cores() >= n:
            return True
        if look + 1 < START_LOOKS:
            time.sleep(START_GAP)
    return False


class _Choice:
    """One kind of pass: the faster of 1 and n threads so far, and when to try the other again."""

    def __init__(self, n: int) -> None:
        self.best = n if _cores_free(n) else 1
        self.other = 1 if self.best == n else n
        self.cost: dict[int, float] = {}  # seconds per token, recent
        self.calls, self.next_try, self.interval = 0, 2 * FIRST_INTERVAL, FIRST_INTERVAL
        self.trying = False
        self.checked = time.monotonic()  # when the cores were last seen busy (_cores_idle)

    def pick(self) -> int:
        # more threads never timed yet (the start found the cores busy: a snapshot, which a process just ending can
        # fill): tried as soon as the cores are idle, not only on the ninth pass, which a server's few prompts a
        # session may never reach
        self.trying = self.calls >= self.next_try or (self.other > self.best and self.other not in self.cost
                                                      and self._cores_idle())
        self.calls += 1
        return self.other if self.trying else self.best

    def _cores_idle(self) -> bool:
        """Whether the cores for more threads are idle now, asked at most every IDLE_CHECK seconds (reading /proc
        takes 0.1-3 ms, a single-token step's share when asked each pass)."""
        now = time.monotonic()
        if now < self.checked + IDLE_CHECK:
            return False
        self.checked = now
        return idle_cores() >= self.other

    def record(self, threads: int, per_token: float) -> None:
        if not self.trying:
            old = self.cost.get(threads)
            self.cost[threads] = per_token if old is None else (old + per_token) / 2
            return
        self.cost[threads] = per_token  # the other choice's old figure is stale: replace it
        best = self.cost.get(self.best, math.inf)
        if per_token < best:
            self.best, self.other = self.other, self.best
            self.interval = FIRST_INTERVAL
        else:
            loss = math.ceil(TRIES_PER_LOSS * per_token / best) if best > 0 else MAX_INTERVAL
            self.interval = min(max(2 * self.interval, loss), MAX_INTERVAL)
        self.next_try = self.calls + self.interval


class AutoThreads:
    """Runs forward passes with 1 or n BLAS threads, whichever its timings say is faster for that kind of pass."""

    def __init__(self, n: int, native: bool = False, blas: bool = True) -> None:
        self.n, self.native, self.blas = max(1, n), native, blas  # as limited() takes them
        self._choices: dict[bool, _Choice] = {}

    def run(self, tokens: int, fn: Callable[[], R], kind: Hashable | None = None) -> R:
        """fn() (a pass over `tokens` tokens) with the thread count chosen for its kind, timed. The kind is whether
        tokens > 1 unless given: passes whose costs per token differ (a batched decode pass of 1 and of 4 rows)
        are kinds apart, or the faster kind's times would be compared with the slower's."""
        if self.n == 1:
            return limited(1, fn, self.native, self.blas)
        key = tokens > 1 if kind is None else kind
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choices[key] = _Choice(self.n)
        threads = choice.pick()
        start = time.perf_counter()
        out = limited(threads, fn, self.native, self.blas)
        choice.record(threads, (time.perf_counter() - start) / max(tokens, 1))
        return out

    def current(self) -> dict[str, int]:
        """The choice now for each kind of pass seen so far ("step", "batch", or the kind given to run), e.g. for -v
        output."""
        return {(kind if not isinstance(kind, bool) else "batch" if kind else "step"): c.best
                for kind, c in self._choices.items()}
