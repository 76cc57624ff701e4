"""minillama.sampling: the Sampler, which turns a model's candidate ids and scores into one id.

It sits below both the forward pass (minillama.model calls it from next_token) and the generation loop
(minillama.generate builds it from the user's settings), so neither imports the other for it.

Sampling follows llama.cpp's sampler chain in common_sampler's default order: logit_bias, the allowed set
(token healing, a JSON grammar: Constraint), penalties (repeat, frequency, presence over the last
repeat_last_n ids, prompt included), top-k, top-p, min-p (each on the model's own distribution), then
temperature, then one draw from a seeded numpy PCG64 generator. temperature <= 0 (or top_k == 1) is greedy:
the highest score after bias and penalties, the first candidate among equals. Log-probabilities
(logprobs=N) are the log-softmax of the model's raw scores, before bias, penalties and temperature, as
llama.cpp's server (n_probs) and OpenAI report them.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from .errors import ArgumentError

__all__ = ["Sampler", "RANDOM_SEED", "TokenLogprob"]


#: The seed that asks for a random one, as llama.cpp's --seed -1 (LLAMA_DEFAULT_SEED) does; like None.
RANDOM_SEED = -1


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log-probability and the top alternatives', from the log-softmax of the model's raw
    scores (before logit_bias, penalties, constraints and temperature), as llama.cpp's server and OpenAI
    report them."""

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob), most likely first


class Sampler:
    """Turns candidate ids and their scores into one id, as llama.cpp's sampler chain does; seeded, repeatable.

    The chain, in llama.cpp's order (common_sampler's default): logit_bias (added to the scores), the allowed
    set (token healing, a JSON grammar), penalties (repeat, frequency, presence over the last repeat_last_n
    accepted ids, prompt included as llama-server does), top_k, top_p, min_p, temperature, then one draw
    from a seeded numpy PCG64 generator. temperature <= 0 (or top_k == 1) is greedy: the highest score
    after bias and penalties, the first candidate among equals.

    seed None or -1 (llama.cpp's "random seed"): a fresh random seed, kept in .seed so the run can be repeated.
    n_probs > 0 records, after each draw, the chosen id's log-probability and the n_probs best (last_logprob).
    """

    def __init__(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 seed: int | None = None, *, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: Mapping[int, float] | None = None, n_probs: int = 0) -> None:
        temperature = _finite("temperature", temperature, ">= 0 (0 is greedy)", lambda v: v >= 0)
        if top_k < 0:
            raise ArgumentError(f"expected top_k >= 0 (0 keeps all), found {top_k}")
        top_p = _finite("top_p", top_p, "in (0, 1] (1 keeps all)", lambda v: 0 < v <= 1)
        min_p = _finite("min_p", min_p, "in [0, 1] (0 keeps all)", lambda v: 0 <= v <= 1)
        repeat_penalty = _finite("repeat_penalty", repeat_penalty, "> 0 (1 is off)", lambda v: v > 0)
        if not -1 <= repeat_last_n <= MAX_WINDOW:
            raise ArgumentError(f"expected repeat_last_n from 0 to {MAX_WINDOW:,} (or -1 for the whole context), "
                                f"found {_show(repeat_last_n)}")
        presence_penalty = _finite("presence_penalty", presence_penalty, "(0 is off)", lambda v: True)
        frequency_penalty = _finite("frequency_penalty", frequency_penalty, "(0 is off)", lambda v: True)
        if n_probs < 0:
            raise ArgumentError(f"expected n_probs >= 0, found {n_probs}")
        if seed is not None and seed < 0 and seed != RANDOM_SEED:
            raise ArgumentError(f"expected a seed of 0 or more (or {RANDOM_SEED} for a random one), found {seed}")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self.repeat_penalty = float(repeat_penalty)
        self.repeat_last_n = int(repeat_last_n)
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.logit_bias = _check_bias(logit_bias)
        self.n_probs = int(n_probs)
        #: The seed in use: the one given, or a fresh random one (recorded so a run can be repeated).
        self.seed = int(seed) if seed is not None and seed != RANDOM_SEED else secrets.randbits(63)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._allowed: np.ndarray | None = None  # token healing, grammar: bool per id, or None for no constraint
        self._fallback = 0
        # ids the penalties look at: the last repeat_last_n accepted (-1: all of them, the whole context)
        self._recent: deque[int] = deque(maxlen=None if self.repeat_last_n < 0 else self.repeat_last_n)
        #: After each draw with n_probs > 0: the chosen id's log-probability and the best n_probs (else None).
        self.last_logprob: TokenLogprob | None = None

    def constrain(self, allowed: np.ndarray | None, fallback: int = 0) -> None:
        """Sample only ids i with allowed[i] (None lifts the constraint); when the model offers none of
        them, return fallback (token healing's way back to the prompt's own token)."""
        self._allowed = None if allowed is None else np.asarray(allowed, dtype=bool)
        self._fallback = int(fallback)

    def accept(self, ids: Iterable[int]) -> None:
        """Record ids as part of the sequence (llama_sampler_accept), for the penalties' window."""
        if self._recent.maxlen != 0:
            self._recent.extend(int(i) for i in ids)

    @property
    def greedy(self) -> bool:
        """True when sampling always takes the most likely candidate."""
        return self.temperature <= 0 or self.top_k == 1

    @property
    def penalizes(self) -> bool:
        """True when any penalty is on (llama.cpp skips the penalties sampler otherwise)."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                                            or self.presence_penalty != 0.0)

    def sample_probs(self, probs: ArrayLike, ids: ArrayLike | None = None) -> int:
        """Pick one id given candidate probabilities (zeros are never picked); ids default to 0..n-1."""
        p = np.asarray(probs, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return self.sample_logits(np.log(p), ids)

    def adjust(self, x: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """The scores after logit_bias and the penalties (llama_sampler_logit_bias, llama_sampler_penalties).

        Penalties, for a candidate seen c > 0 times in the window: its score s becomes s * repeat_penalty when
        s <= 0, else s / repeat_penalty; then s - c * frequency_penalty - presence_penalty.
        """
        if self.logit_bias:
            x = x.copy()
            ids = np.fromiter(self.logit_bias, np.int64, len(self.logit_bias))
            vals = np.fromiter(self.logit_bias.values(), np.float64, len(self.logit_bias))
            if np.array_equal(cand, np.arange(cand.size)):  # 0..n-1, the model's whole vocab: index directly
                inside = ids < cand.size
                x[ids[inside]] += vals[inside]
            else:
                for i, b in zip(ids, vals, strict=True):
                    x[cand == i] += b
        if self.penalizes and self._recent:
            seen, counts = np.unique(np.fromiter(self._recent, np.int64, len(self._recent)), return_counts=True)
            pos = np.searchsorted(seen, cand)
            pos[pos == seen.size] = 0
            hit = seen[pos] == cand
            if hit.any():
                x = x.copy()
                c = counts[pos[hit]].astype(np.float64)
                s = x[hit]
                s = np.where(s <= 0, s * self.repeat_penalty, s / self.repeat_penalty)
                x[hit] = s - c * self.frequency_penalty - self.presence_penalty
        return x

    def sample_logits(self, logits: ArrayLike, ids: ArrayLike | None = None) -> int:
        """Pick one id given candidate logits (-inf never picked); ids default to 0..n-1."""
        if ids is None and self.greedy and not (self.logit_bias or self.penalizes or self.n_probs) \
                and self._allowed is None:
            x = np.asarray(logits).ravel()
            if x.size and x.dtype.kind in "fiu":
                return _argmax(x)
        x = np.asarray(logits, dtype=np.float64).ravel()
        cand = np.arange(x.size) if ids is None else np.asarray(ids).ravel()
        if cand.shape != x.shape:
            raise ArgumentError(f"{x.size} scores for {cand.size} candidate ids")
        if np.isnan(x).any():
            raise ArgumentError("the model's scores contain NaN")
        raw = x
        x = self.adjust(x, cand)
        choice = self._choose(x, cand)
        if self.n_probs:
            self.last_logprob = _logprob(raw, cand, choice, self.n_probs)
        return choice

    def _choose(self, x: np.ndarray, cand: np.ndarray) -> int:
        """The chain after bias and penalties: the allowed set, top_k, top_p, min_p, temperature, the draw."""
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
        order = _best_first(x, self.top_k)
        xs = x[order]
        if self.top_p < 1.0:
            p = np.exp(xs - xs[0])
            cum = np.cumsum(p / p.sum())
            n = min(int(np.searchsorted(cum, self.top_p)) + 1, xs.size)
            order, xs = order[:n], xs[:n]
        if self.min_p > 0.0:  # llama_sampler_min_p: keep scores >= the best + log(min_p), at least one
            n = max(int(np.count_nonzero(xs >= xs[0] + np.log(self.min_p))), 1)
            order, xs = order[:n], xs[:n]
        w = np.exp((xs - xs[0]) / self.temperature)
        cum = np.cumsum(w)
        i = int(np.searchsorted(cum, self._rng.random() * cum[-1], side="right"))
        return int(cand[order[min(i, order.size - 1)]])

    def __repr__(self) -> str:
        return (f"Sampler(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, "
                f"min_p={self.min_p}, seed={self.seed})")


def _argmax(x: np.ndarray) -> int:
    """The greedy choice over a whole vocab's (non-empty, numeric) scores with nothing to adjust: the first highest
    score, as the full chain picks it (whose float64 copy, mask and filter cost ~3 ms a token at 262k ids), with
    its errors."""
    i = int(np.argmax(x))  # a NaN, if any, is where argmax stops
    if np.isnan(x[i]):
        raise ArgumentError("the model's scores contain NaN")
    if x[i] == -np.inf:
        raise ArgumentError("no candidate token has a non-zero probability")
    return i


def _best_first(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of x's k highest scores (all of them when k <= 0), best first, equals in index order: the first k
    of a stable argsort of -x. For k well below x.size only the k are sorted (a 49152-token vocab's full sort
    took longer than a batched model step); the k-th highest value is found by partition, and of the values
    equal to it the first in index order are kept, as the full sort keeps them."""
    if k <= 0 or 4 * k >= x.size:
        return np.argsort(-x, kind="stable")[:k if k > 0 else None]
    kth = np.partition(x, x.size - k)[x.size - k]
    above = np.flatnonzero(x > kth)
    keep = np.concatenate([above, np.flatnonzero(x == kth)[:k - above.size]])
    return keep[np.argsort(-x[keep], kind="stable")]


#: Largest penalty window (repeat_last_n): llama.cpp's is an int32; any window past the context is all of it.
MAX_WINDOW = 2**31 - 1


def _show(v: object) -> str:
    """v for an error message: a huge integer by its size (its digits could fill the message)."""
    if isinstance(v, int) and abs(v) >= 10**30:
        return f"an integer of {len(str(abs(v))) if abs(v) < 10**4000 else '4,000+'} digits"
    return f"{v!r:.60}"


def _finite(name: str, value: object, rule: str, ok: object) -> float:
    """value as a finite float that passes ok, else ArgumentError naming name, the rule and what was found
    (infinities, NaN, integers too large for a float, non-numbers)."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except OverflowError:
        v = math.inf
    except (TypeError, ValueError):
        raise ArgumentError(f"expected {name} as a number {rule}, found {type(value).__name__} "
                            f"{_show(value)}") from None
    if not (math.isfinite(v) and ok(v)):  # type: ignore[operator]
        raise ArgumentError(f"expected {name} as a finite number {rule}, found {_show(value)}")
    return v


def _check_bias(bias: Mapping[int, float] | None) -> dict[int, float]:
    """logit_bias as {id: finite or -inf float} (OpenAI's keys may be strings of ids). An id past 2**31 - 1 (past
    every vocab: llama.cpp's ids are int32) is skipped, as ids past the model's vocab are, as llama.cpp skips
    them."""
    out: dict[int, float] = {}
    for k, v in (bias or {}).items():
        if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) > 18:
            continue  # past every vocab (and int() refuses more than 4,300 digits)
        try:
            i = int(k)
            b = float(v)
        except OverflowError:
            b = math.inf if v > 0 else -math.inf  # type: ignore[operator]
        except (TypeError, ValueError):
            raise ArgumentError(f"expected logit_bias entries token id -> number, found {_show(k)}: "
                                f"{_show(v)}") from None
        if i < 0 or math.isnan(b) or b == math.inf:
            raise ArgumentError(f"expected logit_bias entries id >= 0 -> a finite number (-inf bans), found "
                                f"{_show(k)}: {_show(v)}")
        if i <= MAX_WINDOW:
            out[i] = b
    return out


def _logprob(x: np.ndarray, cand: np.ndarray, choice: int, n: int) -> TokenLogprob:
    """log_softmax of the raw scores x: the chosen id's value and the n best (id, value), best first."""
    finite = x > -np.inf
    m = x[finite].max() if finite.any() else 0.0
    lse = m + np.log(np.exp(x[finite] - m).sum()) if finite.any() else 0.0
    lp = x - lse
    best = np.argpartition(-lp, n - 1)[:n] if n < lp.size else np.arange(lp.size)
    top = best[np.argsort(-lp[best], kind="stable")]
    at = np.flatnonzero(cand == choice)
    chosen = float(lp[at[0]]) if at.size else -np.inf
    return TokenLogprob(int(choice), chosen, tuple((int(cand[j]), float(lp[j])) for j in top))


