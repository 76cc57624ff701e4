"""minillama.request: one generation request, the only way the API, the server, the CLI and the chat reach the
generation loop (minillama.generate.Generation).

    from minillama.request import Request, SamplingParams
    req = Request(prompt=ids, max_tokens=64, sampling=SamplingParams(temperature=0.7, min_p=0.1, seed=1),
                  stop=("\\n\\n",))

SamplingParams holds the sampler's settings, checked once when built; a Request adds what else one run needs: the
prompt's ids, the most tokens to generate, stop strings, a constraint (a JSON grammar) or token healing. Both are
frozen: a caller builds a new one (dataclasses.replace) rather than changing one in place.

This module sits at the bottom of the package (it imports only minillama.errors), so the sampler below the forward
pass and every application above the generation loop can share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .errors import ArgumentError, ArgumentTypeError

__all__ = ["SamplingParams", "Request", "Constraint", "ReasoningBudget", "RANDOM_SEED", "MAX_WINDOW", "huge_int_text"]

#: The seed that asks for a random one, as llama.cpp's --seed -1 (LLAMA_DEFAULT_SEED) does; like None.
RANDOM_SEED = -1

#: Largest penalty window (repeat_last_n): llama.cpp's is an int32; any window past the context is all of it.
MAX_WINDOW = 2**31 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is picked, with llama-server's names and llama.cpp's defaults (common_params_sampling).

    =================  =======  ===========================  =====================================================
    field              default  llama.cpp (common / CLI)     meaning
    =================  =======  ===========================  =====================================================
    temperature        0.8      temp, --temp                 0 (or top_k 1) is greedy
    top_k              40       top_k, --top-k               keep the k most likely (0: all)
    top_p              0.95     top_p, --top-p               keep the most likely up to this probability (1: all)
    min_p              0.05     min_p, --min-p               keep those at least min_p times the best (0: all)
    repeat_penalty     1.0      penalty_repeat               divide (or multiply, when <= 0) a seen id's score (1: off)
    repeat_last_n      64       penalty_last_n               the window of ids the penalties see (0 off, -1 all)
    presence_penalty   0.0      penalty_present              subtracted once from a seen id's score
    frequency_penalty  0.0      penalty_freq                 subtracted per time an id was seen
    seed               None     seed, -s                     None or -1 (LLAMA_DEFAULT_SEED): a fresh random seed
    logit_bias         {}       logit_bias, -l               {id: added score}; -inf bans the id
    n_probs            0        n_probs                      record each pick's log-probability and the n best
    =================  =======  ===========================  =====================================================

    The sampler applies them in llama.cpp's order (minillama.sampling.Sampler). Every value is checked here, once:
    an ArgumentError names the setting, what it expects and what it found. logit_bias keys may be ids or strings
    of ids (OpenAI's JSON); ids past every vocab (2**31 - 1) are dropped, as llama.cpp skips ids past its vocab.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    n_probs: int = 0

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "temperature", _finite("temperature", self.temperature, ">= 0 (0 is greedy)", lambda v: v >= 0))
        if self.top_k < 0:
            raise ArgumentError(f"expected top_k >= 0 (0 keeps all), found {self.top_k}")
        put(self, "top_p", _finite("top_p", self.top_p, "in (0, 1] (1 keeps all)", lambda v: 0 < v <= 1))
        put(self, "min_p", _finite("min_p", self.min_p, "in [0, 1] (0 keeps all)", lambda v: 0 <= v <= 1))
        put(self, "repeat_penalty", _finite("repeat_penalty", self.repeat_penalty, "> 0 (1 is off)",
                                            lambda v: v > 0))
        if not -1 <= self.repeat_last_n <= MAX_WINDOW:
            raise ArgumentError(f"expected repeat_last_n from 0 to {MAX_WINDOW:,} (or -1 for the whole context), "
                                f"found {_show(self.repeat_last_n)}")
        put(self, "presence_penalty", _finite("presence_penalty", self.presence_penalty, "(0 is off)",
                                              lambda v: True))
        put(self, "frequency_penalty", _finite("frequency_penalty", self.frequency_penalty, "(0 is off)",
                                               lambda v: True))
        if self.n_probs < 0:
            raise ArgumentError(f"expected n_probs >= 0, found {self.n_probs}")
        if self.seed is not None and self.seed < 0 and self.seed != RANDOM_SEED:
            raise ArgumentError(f"expected a seed of 0 or more (or {RANDOM_SEED} for a random one), found {self.seed}")
        put(self, "top_k", int(self.top_k))
        put(self, "repeat_last_n", int(self.repeat_last_n))
        put(self, "n_probs", int(self.n_probs))
        put(self, "seed", None if self.seed is None else int(self.seed))
        put(self, "logit_bias", _check_bias(self.logit_bias))


class Constraint(Protocol):
    """What constrains the tokens a run may pick, e.g. a JSON grammar (minillama.constrain)."""

    def allowed(self) -> np.ndarray:
        """A bool per vocab id: which ids may come next."""
        ...

    def accept(self, token: int) -> None:
        """Advance past the id just picked."""
        ...


@dataclass(frozen=True)
class ReasoningBudget:
    """At most `tokens` ids of thinking (llama.cpp's --reasoning-budget; 0 ends thinking at once, -1 leaves it
    unbounded), then `forced` (an optional message and the end tag) is written. Tags are token id sequences:
    thinking opens at `start` and closes at any of `ends`; `prefill` holds the ids of the template's generation
    prompt, which the count sees first (a prompt ending in "<think>" starts it). minillama.reasoning_budget runs it.
    """

    tokens: int
    start: tuple[int, ...]
    ends: tuple[tuple[int, ...], ...]
    forced: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int | np.integer) or not \
                -1 <= self.tokens <= MAX_WINDOW:
            raise ArgumentError(f"expected a reasoning budget from 0 to {MAX_WINDOW:,} tokens (or -1: unbounded), "
                                f"found {_show(self.tokens)}")
        put = object.__setattr__
        put(self, "tokens", int(self.tokens))
        put(self, "start", tuple(_index(i) for i in self.start))
        put(self, "ends", tuple(tuple(_index(i) for i in e) for e in self.ends))
        put(self, "forced", tuple(_index(i) for i in self.forced))
        put(self, "prefill", tuple(_index(i) for i in self.prefill))


@dataclass(frozen=True)
class Request:
    """One generation: continue prompt (token ids) for at most max_tokens ids, sampled as `sampling` says.

    stop: strings that end the reply before them (matched on the decoded text; the stop string is not shown and
    stats.stop_reason becomes stop_reason). constraint: limits each pick to the ids it allows (a JSON grammar, used
    by one run only: it keeps state). heal: token healing, the ids taken off the end of the prompt
    (Tokenizer.encode_for_completion) that the first picks must spell out again; not with a constraint.
    stop_at_eog=False runs on through end-of-generation ids (--ignore-eos). reasoning_budget: thinking bounded in
    tokens (ReasoningBudget), in front of the constraint. context_shift: when the context is full, drop positions
    after the first n_keep (-1: the prompt's; a bos the tokenizer adds counts on top) and go on, as llama-server's
    --context-shift: n_discard of them (0: half of those after n_keep); else the generation stops there.
    """

    prompt: Sequence[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] | str = ()
    constraint: Constraint | None = None
    heal: Sequence[int] = ()
    stop_at_eog: bool = True
    stop_reason: str = "stop_string"
    reasoning_budget: ReasoningBudget | None = None
    context_shift: bool = False
    n_keep: int = 0
    n_discard: int = 0

    def __post_init__(self) -> None:
        put = object.__setattr__
        stop = self.stop
        stops = [stop] if isinstance(stop, str) else list(stop or []) if isinstance(stop, Sequence) else None
        if stops is None or not all(isinstance(s, str) for s in stops):
            raise ArgumentTypeError(f"expected stop as a str or a list of str, found {stop!r:.100}")
        put(self, "stop", tuple(s for s in stops if s))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int | np.integer):
            raise ArgumentTypeError(f"expected max_tokens as an int, found {self.max_tokens!r:.100}")
        put(self, "max_tokens", int(self.max_tokens))
        if not isinstance(self.sampling, SamplingParams):
            raise ArgumentTypeError(f"expected sampling as SamplingParams, found {type(self.sampling).__name__}")
        if self.heal and (self.constraint is not None or self.reasoning_budget is not None):
            raise ArgumentError("expected either heal=True or a constraint, found both")
        put(self, "prompt", tuple(_index(i) for i in self.prompt))
        put(self, "heal", tuple(_index(i) for i in self.heal))


def _index(i: Any) -> int:
    """A token id as an int (numpy integers too); TypeError for anything else, as operator.index."""
    import operator

    return operator.index(i)


def huge_int_text(v: object) -> str | None:
    """A huge integer (30 digits or more) for an error message, by its size: its digits could fill the message, and
    str() refuses more than 4,300 of them. None for anything else. The server's messages use it too."""
    if not isinstance(v, int) or isinstance(v, bool) or abs(v) < 10**30:
        return None
    return f"an integer of {len(str(abs(v))):,} digits" if abs(v) < 10**4000 else "an integer of 4,000+ digits"


def _show(v: object) -> str:
    """v for an error message: a huge integer by its size, anything else by its repr (cut to 60 characters)."""
    return huge_int_text(v) or f"{v!r:.60}"


def _finite(name: str, value: object, rule: str, ok: object) -> float:
    """value as a finite float that passes ok, else ArgumentError naming name, the rule and what was found
    (infinities, NaN, integers too large for a float, non-numbers)."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except OverflowError:
        v = math.inf
    except (TypeError, ValueError):
        raise ArgumentError(f"expected {name} {rule}, a number, found {type(value).__name__} "
                            f"{_show(value)}") from None
    if not (math.isfinite(v) and ok(v)):  # type: ignore[operator]
        raise ArgumentError(f"expected {name} {rule}, a finite number, found {_show(value)}")
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
