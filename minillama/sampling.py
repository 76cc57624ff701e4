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

from .backend import backend_choice, native_core
from .errors import ArgumentError
from .request import RANDOM_SEED, SamplingParams

__all__ = ["Sampler", "SamplingParams", "RANDOM_SEED", "TokenLogprob"]


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

    Built from a SamplingParams (Sampler.from_params), which checks every setting once, or from the same
    keywords (min_p 0 by default here, where SamplingParams has llama.cpp's 0.05).
    seed None or -1 (llama.cpp's "random seed"): a fresh random seed, kept in .seed so the run can be repeated.
    n_probs > 0 records, after each draw, the chosen id's log-probability and the n_probs best (last_logprob).
    A sampler draws for one thread at a time (its random state and score array are its own).
    """

    def __init__(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 seed: int | None = None, *, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: Mapping[int, float] | None = None, n_probs: int = 0) -> None:
        self._use(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, min_p=min_p,
                                 repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                 presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                 logit_bias=logit_bias or {}, n_probs=n_probs))

    @classmethod
    def from_params(cls, params: SamplingParams) -> Sampler:
        """The sampler for params (checked when params was built), with its own random state."""
        sampler = cls.__new__(cls)
        sampler._use(params)
        return sampler

    def _use(self, p: SamplingParams) -> None:
        #: The settings, as given (seed None or -1 for a random one); .seed below is the one in use.
        self.params = p
        self.temperature = p.temperature
        self.top_k = p.top_k
        self.top_p = p.top_p
        self.min_p = p.min_p
        self.repeat_penalty = p.repeat_penalty
        self.repeat_last_n = p.repeat_last_n
        self.presence_penalty = p.presence_penalty
        self.frequency_penalty = p.frequency_penalty
        self.logit_bias = dict(p.logit_bias)
        self.n_probs = p.n_probs
        #: The seed in use: the one given, or a fresh random one (recorded so a run can be repeated).
        self.seed = p.seed if p.seed is not None and p.seed != RANDOM_SEED else secrets.randbits(63)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._buf: np.ndarray | None = None  # _scores' float64 array, reused
        self._allowed: np.ndarray | None = None  # token healing, grammar: bool per id, or None for no constraint
        self._fallback = 0
        # ids the penalties look at: the last repeat_last_n accepted (-1: all of them, the whole context)
        self._recent: deque[int] = deque(maxlen=None if self.repeat_last_n < 0 else self.repeat_last_n)
        #: After each draw with n_probs > 0: the chosen id's log-probability and the best n_probs (else None).
        self.last_logprob: TokenLogprob | None = None
        self._core = native_core(backend_choice())  # its top_k: the pass over a whole vocab (None: numpy's)
        self._bias_n, self._bias_at = -1, (_NO_IDS, _NO_SCORES)  # _bias_within's

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

    def adjust(self, x: np.ndarray, cand: np.ndarray, in_place: bool = False) -> np.ndarray:
        """The scores after logit_bias and the penalties (llama_sampler_logit_bias, llama_sampler_penalties);
        in_place: x itself may change (else a copy does).

        Penalties, for a candidate seen c > 0 times in the window: its score s becomes s * repeat_penalty when
        s <= 0, else s / repeat_penalty; then s - c * frequency_penalty - presence_penalty.
        """
        if self.logit_bias:
            x = x if in_place else x.copy()
            in_place = True
            ids = np.fromiter(self.logit_bias, np.int64, len(self.logit_bias))
            vals = np.fromiter(self.logit_bias.values(), np.float64, len(self.logit_bias))
            if cand is _IDS.get(cand.size) or np.array_equal(cand, np.arange(cand.size)):  # the whole vocab
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
                x = x if in_place else x.copy()
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
        if self._core is not None and ids is None and self._allowed is None and not self.n_probs:
            x = np.asarray(logits)
            k = 1 if self.greedy else self.top_k
            if x.dtype == np.float32 and 0 < 4 * k < x.size:  # the model's scores: one pass in C
                return self._choose_native(x.ravel(), k)
        x = self._scores(logits)
        cand = _identity(x.size) if ids is None else np.asarray(ids).ravel()
        if cand.shape != x.shape:
            raise ArgumentError(f"{x.size} scores for {cand.size} candidate ids")
        lo = x.min() if x.size else 0.0
        if np.isnan(lo):  # min propagates a NaN (not x @ x: BLAS threads woke to spin beside the model's)
            raise ArgumentError("the model's scores contain NaN")
        raw = x
        x = self.adjust(x, cand, in_place=not self.n_probs)
        # no score is -inf (the usual case: the model's are finite, and the biases and penalties too): _choose need
        # not look for them
        finite = bool(x.size) and lo > -np.inf and self._finite_adjust
        choice = self._choose(x, cand, finite)
        if self.n_probs:
            self.last_logprob = _logprob(raw, cand, choice, self.n_probs)
        return choice

    @property
    def _finite_adjust(self) -> bool:
        """Whether adjust() keeps finite scores finite (every bias and penalty a finite number)."""
        return all(math.isfinite(v) for v in (self.repeat_penalty, self.frequency_penalty, self.presence_penalty,
                                              *(self.logit_bias or {}).values()))

    def _scores(self, logits: ArrayLike) -> np.ndarray:
        """logits as float64 in an array of this sampler's own (reused from draw to draw: a fresh 49k-score array
        each token cost page faults), which the chain may change."""
        src = np.asarray(logits).ravel()
        buf = self._buf
        if buf is None or buf.size != src.size:
            buf = self._buf = np.empty(src.size, np.float64)
        np.copyto(buf, src, casting="unsafe" if src.dtype.kind in "fiub" else "same_kind")
        return buf

    def _choose(self, x: np.ndarray, cand: np.ndarray, finite: bool = False) -> int:
        """The chain after bias and penalties: the allowed set, top_k, top_p, min_p, temperature, the draw.
        finite: the caller knows no score is -inf (the scan for them is skipped: 14 us of a 49k vocab's 200)."""
        allowed = self._allowed
        if not finite or allowed is not None:
            keep = x > -np.inf
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
        return self._draw(cand[order], x[order])

    def _choose_native(self, x: np.ndarray, k: int) -> int:
        """The chain over a whole vocab's float32 scores x with top_k (1: greedy) k < x.size / 4: bias, penalties
        and top_k in one pass of the native core's top_k (the biased and penalized ids' scores made here, by
        adjust, so the same float64 values), then _draw; the same choice as _choose, which the pure backend runs
        (a 49k vocab: 0.4 ms a token after a pass had taken the caches, now a tenth of that)."""
        if self.penalizes:
            adj = self._adjusted_ids(x.size)
            adj_val = self.adjust(x[adj].astype(np.float64), adj, in_place=True) if adj.size else _NO_SCORES
        else:  # logit_bias alone: adjust's float64 sums, its ids made once
            adj, bias = self._bias_within(x.size)
            adj_val = x[adj].astype(np.float64) + bias if adj.size else _NO_SCORES
        idx, val = np.empty(k, np.int64), np.empty(k, np.float64)
        kept = self._core.top_k(np.ascontiguousarray(x), adj, np.ascontiguousarray(adj_val, np.float64), idx, val)
        if kept < 0:
            raise ArgumentError("the model's scores contain NaN")
        if kept == 0:
            raise ArgumentError("no candidate token has a non-zero probability")
        return int(idx[0]) if self.greedy else self._draw(idx[:kept], val[:kept])

    def _bias_within(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """logit_bias's ids below n, ascending, and their biases (float64), made once per n."""
        if self._bias_n != n:
            ids = sorted(i for i in self.logit_bias if i < n)
            self._bias_at = (np.array(ids, np.int64), np.array([self.logit_bias[i] for i in ids], np.float64))
            self._bias_n = n
        return self._bias_at

    def _adjusted_ids(self, n: int) -> np.ndarray:
        """The ids below n whose scores adjust() changes (logit_bias's, and the penalized window's), ascending."""
        ids = [i for i in self.logit_bias if i < n]
        if self.penalizes:
            ids += [i for i in self._recent if 0 <= i < n]
        return np.unique(np.array(ids, np.int64)) if ids else _NO_IDS

    def _draw(self, ids: np.ndarray, xs: np.ndarray) -> int:
        """The chain after top_k: top_p, min_p, temperature and the draw over candidates ids with scores xs, best
        first. A few dozen candidates: Python floats and libm's exp (math.exp), summed in order, cost a fifth of
        numpy's calls on such short arrays; both backends draw through here."""
        x = xs.tolist()
        n = len(x)
        best = x[0]
        if self.top_p < 1.0:  # llama_sampler_top_p: the fewest best candidates whose probabilities reach top_p
            p = [math.exp(v - best) for v in x]
            total = 0.0
            for v in p:
                total += v
            cum = 0.0
            for i, v in enumerate(p):
                cum += v / total
                if cum >= self.top_p:
                    n = i + 1
                    break
        if self.min_p > 0.0:  # llama_sampler_min_p: keep scores >= the best + log(min_p), at least one
            floor = best + math.log(self.min_p)
            n = max(sum(1 for v in x[:n] if v >= floor), 1)
        cum, w = 0.0, []
        for v in x[:n]:
            cum += math.exp((v - best) / self.temperature)
            w.append(cum)
        target = self._rng.random() * cum
        i = next((j for j, c in enumerate(w) if c > target), n - 1)
        return int(ids[i])
    def __repr__(self) -> str:
        return (f"Sampler(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, "
                f"min_p={self.min_p}, seed={self.seed})")


_NO_IDS = np.empty(0, np.int64)
_NO_SCORES = np.empty(0, np.float64)

#: 0..n-1 for each vocab size seen (read-only): the candidates when the scores are a whole vocab's.
_IDS: dict[int, np.ndarray] = {}


def _identity(n: int) -> np.ndarray:
    """0..n-1, made once per size."""
    ids = _IDS.get(n)
    if ids is None:
        ids = np.arange(n)
        ids.setflags(write=False)
        _IDS[n] = ids
    return ids


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


#: Every how many scores _best_first samples one to find a floor under the k best without a partition of them all.
SAMPLE_STRIDE = 16


def _best_first(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of x's k highest scores (all of them when k <= 0), best first, equals in index order: the first k
    of a stable argsort of -x. For k well below x.size only the k are sorted (a 49152-token vocab's full sort
    took longer than a batched model step); the k-th highest value is found by partition, and of the values
    equal to it the first in index order are kept, as the full sort keeps them. In a large vocab the partition
    runs only over the scores at or above a floor, the k-th best of every SAMPLE_STRIDE-th score (a subset's k-th
    best is at most the whole's): a few hundred of them rather than every score (a fifth of the time)."""
    if k <= 0 or 4 * k >= x.size:
        return np.argsort(-x, kind="stable")[:k if k > 0 else None]
    if x.size >= SAMPLE_STRIDE * 4 * k:  # the k best are among those at or above a strided sample's k-th best
        sample = x[::SAMPLE_STRIDE]
        floor = np.partition(sample, sample.size - k)[sample.size - k]  # at most x's k-th best: a subset's is
        near = np.flatnonzero(x >= floor)  # at least k ids, in index order, every one of x's k best among them
        xn = x[near]
        kth = np.partition(xn, xn.size - k)[xn.size - k]  # x's k-th best
        above = near[xn > kth]
        keep = np.concatenate([above, near[xn == kth][:k - above.size]])
    else:
        kth = np.partition(x, x.size - k)[x.size - k]
        above = np.flatnonzero(x > kth)
        keep = np.concatenate([above, np.flatnonzero(x == kth)[:k - above.size]])
    return keep[np.argsort(-x[keep], kind="stable")]


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


