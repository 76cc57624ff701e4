"""Which slot's KV cache a request runs on, and the host-RAM cache of prefixes evicted from the slots.

llama-server's rules (tools/server/server-context.cpp, get_available_slot; server-task.cpp, server_prompt_cache):
- A request goes to the idle cache whose ids share the longest prefix with its prompt, measured as the fraction
  of the prompt they cover (similarity), when that fraction is above SLOT_PROMPT_SIMILARITY; else to the least
  recently used idle cache.
- When the chosen cache is about to lose most of what it holds (chosen by LRU, or keeping less than KEEP of its
  ids), its whole sequence is first saved to the RAM cache, and the RAM cache's entry that would serve the prompt
  better (it covers more of the prompt and more of itself would be kept, at least MIN_KEEP of it) is restored in
  its place and leaves the RAM cache.
- The RAM cache is bounded in bytes (--cache-ram MiB; 0: off): a saved sequence already held whole by an entry is
  not saved again, entries held whole by a new one are dropped, and the oldest entries go first when it is full.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["PromptCache", "Caches", "common_prefix", "SLOT_PROMPT_SIMILARITY", "DEFAULT_CACHE_RAM_MIB"]

#: llama-server's --slot-prompt-similarity default: the least share of a prompt an idle slot must hold to be
#: chosen for it over the least recently used one.
SLOT_PROMPT_SIMILARITY = 0.1
#: Below this share of its ids kept, a slot's sequence is saved to the RAM cache before it is overwritten.
KEEP = 0.5
#: A RAM cache entry is restored only when at least this share of it would be kept ("don't trash large prompts").
MIN_KEEP = 0.25
#: llama-server's --cache-ram default, in MiB.
DEFAULT_CACHE_RAM_MIB = 8192


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids a and b share from the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """Saved sequences (Prefix: ids, key and value rows) of slots, at most limit bytes together, oldest out first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: list[Any] = []  # oldest first

    @property
    def nbytes(self) -> int:
        """Bytes the entries hold."""
        return sum(e.nbytes for e in self.entries)

    def save(self, session: Any) -> bool:
        """Keep a copy of session's cached sequence; False when there was nothing new to keep or it is over the
        limit on its own."""
        ids = session.cached_ids
        if not ids or any(common_prefix(e.ids, ids) == len(ids) for e in self.entries):
            return False
        prefix = session.export_prefix()
        if prefix.nbytes > self.limit:
            return False
        self.entries = [e for e in self.entries if common_prefix(e.ids, ids) < e.n]  # held whole by the new one
        self.entries.append(prefix)
        while self.nbytes > self.limit:
            self.entries.pop(0)
        return True

    def load(self, session: Any, ids: Sequence[int]) -> bool:
        """Restore into session the entry that serves ids better than what session holds (llama-server's rule);
        the entry leaves the cache. False when none does."""
        held = session.cached_ids
        lcp = common_prefix(held, ids)
        keep_best = lcp / len(held) if held else -1.0  # an empty session: any entry wins
        sim_best = lcp / len(ids)
        best = None
        for e in self.entries:
            lcp = common_prefix(e.ids, ids)
            keep, sim = lcp / e.n, lcp / len(ids)
            if keep < MIN_KEEP:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, e
        if best is None:
            return False
        session.import_prefix(best)
        self.entries.remove(best)
        return True


class Caches:
    """The slots' sessions (each a KV cache) and who runs on which: claim(ids) picks one for a request's prompt."""

    def __init__(self, sessions: list[Any], cache_bytes: int = 0) -> None:
        self.sessions = sessions
        self.ram = PromptCache(cache_bytes) if cache_bytes > 0 else None
        self._busy: set[int] = set()
        self._last_used = [-1] * len(sessions)
        self._clock = 0
        self._lock = threading.Lock()

    def claim(self, ids: Sequence[int]) -> Any:
        """The idle session a prompt of ids runs on (marked busy until release), restored from the RAM cache
        when an entry there serves it better."""
        with self._lock:
            idle = [i for i in range(len(self.sessions)) if i not in self._busy]
            best, sim_best = None, 0.0
            for i in idle:
                held = self.sessions[i].cached_ids
                if not held:
                    continue
                sim = common_prefix(held, ids) / len(ids)
                if sim > sim_best and sim > SLOT_PROMPT_SIMILARITY:
                    best, sim_best = i, sim
            if best is not None:
                update = sim_best * len(ids) / len(self.sessions[best].cached_ids) < KEEP
            else:  # the least recently used (the last of equals, as llama-server)
                last = None
                for i in idle:
                    if last is None or self._last_used[i] <= last:
                        best, last = i, self._last_used[i]
                update = True
            assert best is not None, "a request claims a cache only while it holds a slot"
            session = self.sessions[best]
            if update and self.ram is not None:
                self.ram.save(session)
                self.ram.load(session, ids)
            self._busy.add(best)
            return session

    def take(self, i: int) -> Any:
        """Session i, marked busy until release, or None while a request runs on it (a slot action's turn)."""
        with self._lock:
            if i in self._busy:
                return None
            self._busy.add(i)
            return self.sessions[i]

    def release(self, session: Any) -> None:
        """session is idle again (its cache kept for the next prompt that shares a prefix with it)."""
        with self._lock:
            i = next(i for i, s in enumerate(self.sessions) if s is session)
            self._busy.discard(i)
            self._clock += 1
            self._last_used[i] = self._clock
