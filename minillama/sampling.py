"""minillama.sampling: the Sampler, which turns a model's candidate ids and scores into one id.

It sits below both the forward pass (minillama.model calls it from next_token) and the generation loop
(minillama.generate builds it from the user's settings), so neither imports the other for it.

Sampling follows llama.cpp's default order: top-k, then top-p on the model's own distribution, then
temperature, then one draw from a seeded numpy PCG64 generator. temperature <= 0 (or top_k == 1) is
greedy: the highest score, the first candidate among equals.
"""

from __future__ import annotations

import secrets

import numpy as np
from numpy.typing import ArrayLike

from .errors import ArgumentError

__all__ = ["Sampler", "RANDOM_SEED"]


#: The seed that asks for a random one, as llama.cpp's --seed -1 (LLAMA_DEFAULT_SEED) does; like None.
RANDOM_SEED = -1


class Sampler:
    """Turns candidate ids and their scores into one id: greedy, temperature, top-k, top-p; seeded, repeatable.

    seed None or -1 (llama.cpp's "random seed"): a fresh random seed, kept in .seed so the run can be repeated.
    """

    def __init__(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 seed: int | None = None) -> None:
        if not temperature >= 0:
            raise ArgumentError(f"expected temperature >= 0 (0 is greedy), found {temperature}")
        if top_k < 0:
            raise ArgumentError(f"expected top_k >= 0 (0 keeps all), found {top_k}")
        if not 0 < top_p <= 1:
            raise ArgumentError(f"expected top_p in (0, 1] (1 keeps all), found {top_p}")
        if seed is not None and seed < 0 and seed != RANDOM_SEED:
            raise ArgumentError(f"expected a seed of 0 or more (or {RANDOM_SEED} for a random one), found {seed}")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        #: The seed in use: the one given, or a fresh random one (recorded so a run can be repeated).
        self.seed = int(seed) if seed is not None and seed != RANDOM_SEED else secrets.randbits(63)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._allowed: np.ndarray | None = None  # token healing: bool per id, or None for no constraint
        self._fallback = 0

    def constrain(self, allowed: np.ndarray | None, fallback: int = 0) -> None:
        """Sample only ids i with allowed[i] (None lifts the constraint); when the model offers none of
        them, return fallback (token healing's way back to the prompt's own token)."""
        self._allowed = None if allowed is None else np.asarray(allowed, dtype=bool)
        self._fallback = int(fallback)

    @property
    def greedy(self) -> bool:
        """True when sampling always takes the most likely candidate."""
        return self.temperature <= 0 or self.top_k == 1

    def sample_probs(self, probs: ArrayLike, ids: ArrayLike | None = None) -> int:
        """Pick one id given candidate probabilities (zeros are never picked); ids default to 0..n-1."""
        p = np.asarray(probs, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return self.sample_logits(np.log(p), ids)

    def sample_logits(self, logits: ArrayLike, ids: ArrayLike | None = None) -> int:
        """Pick one id given candidate logits (-inf never picked); ids default to 0..n-1."""
        x = np.asarray(logits, dtype=np.float64).ravel()
        cand = np.arange(x.size) if ids is None else np.asarray(ids).ravel()
        if cand.shape != x.shape:
            raise ArgumentError(f"{x.size} scores for {cand.size} candidate ids")
        if np.isnan(x).any():
            raise ArgumentError("the model's scores contain NaN")
        keep = x > -np.inf
        allowed = self._allowed
        if allowed is not None:
            inside = (cand >= 0) & (cand < allowed.size)
            ok = np.zeros(cand.shape, bool)
            ok[inside] = allowed[cand[inside]]
            if not (ok & keep).any():
                return self._fallback
            keep &= ok
        if not keep.all():
            x, cand = x[keep], cand[keep]
        if x.size == 0:
            raise ArgumentError("no candidate token has a non-zero probability")
        if self.greedy:
            return int(cand[int(np.argmax(x))])
        order = np.argsort(-x, kind="stable")  # best first, equals in candidate order
        if self.top_k > 0:
            order = order[:self.top_k]
        xs = x[order]
        if self.top_p < 1.0:
            p = np.exp(xs - xs[0])
            cum = np.cumsum(p / p.sum())
            n = min(int(np.searchsorted(cum, self.top_p)) + 1, xs.size)
            order, xs = order[:n], xs[:n]
        w = np.exp((xs - xs[0]) / self.temperature)
        cum = np.cumsum(w)
        i = int(np.searchsorted(cum, self._rng.random() * cum[-1], side="right"))
        return int(cand[order[min(i, order.size - 1)]])

    def __repr__(self) -> str:
        return f"Sampler(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, seed={self.seed})"
