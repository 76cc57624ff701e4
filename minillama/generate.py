"""minillama.generate: turn a language model and a tokenizer into streamed text.

    from minillama.generate import generate
    gen = generate(model, tok, "Once upon a time", 64, temperature=0.8, top_k=40, top_p=0.95, seed=1)
    for chunk in gen:
        print(chunk, end="", flush=True)
    gen.stats.tokens_per_second, gen.ids   # generation speed; perf_lines(gen.stats): llama.cpp's timing lines

The model protocol (LanguageModel) is one method, ``next_token(ids, sampler) -> int``: the model
scores the candidates for the token after ``ids`` (the whole sequence so far, prompt included) and
hands them to the Sampler (minillama.sampling), which picks one (``sample_logits`` or ``sample_probs``). Models therefore
never implement sampling themselves, and every model gets greedy/temperature/top-k/top-p decoding
and exact repeatability from a seed. A model whose ``runs_ahead`` is True (a batched Session) also takes
``next_token(ids, sampler, ahead=n, stop=is_eog)``: Generation says how many more tokens it will ask for when
nothing changes the sampler between draws, so each next step can start while this token is handled.

Sampler (minillama.sampling) follows llama.cpp's sampler chain; generate imports it from there and it stays
importable from minillama.generate. A run is one Request (minillama.request: the prompt's ids, max_tokens, its
SamplingParams, stop strings, a constraint or token healing): Generation(model, tok, request) runs it, and
generate() is that Request built from keywords. chat_prompt renders a conversation for the API and the chat.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from .chat_template import without_bos
from .errors import ArgumentError, ContextLengthError
from .request import RANDOM_SEED, Constraint, Request, SamplingParams
from .sampling import Sampler, TokenLogprob

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = ["LanguageModel", "Sampler", "SamplingParams", "Request", "TokenLogprob", "StopAt", "Constraint", "Generation",
           "GenerationStats", "generate", "chat_prompt", "prompt_ids", "perf_lines", "RANDOM_SEED"]


@runtime_checkable
class LanguageModel(Protocol):
    """Anything that can pick the next token: all generate() asks of a model."""

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        """Score the candidates for the token after ids and return sampler's choice among them."""
        ...


@dataclass
class GenerationStats:
    """Counts and timing of one generate() run, updated as it goes; prompt processing and generation apart, as
    llama.cpp's llama_perf_context_print reports them (perf_lines)."""

    prompt_tokens: int = 0
    # prompt ids the model actually ran: fewer when its cache already held the start (Model.next_token reports
    # it as `evaluated`); the prompt's length for a model that does not say
    prompt_evaluated: int = 0
    generated_tokens: int = 0  # ids the model produced, a final end-of-generation id included
    prompt_seconds: float = 0.0  # time to the first token: the prompt's pass and the first pick
    seconds: float = 0.0  # from the first request for text to the last token
    # "eog", "max_tokens", "context" (the model's context is full), or "stopped" (closed or interrupted
    # early); "" while running
    stop_reason: str = ""
    seed: int = 0
    shifts: int = 0  # context shifts the run made (Request.context_shift)

    @property
    def eval_runs(self) -> int:
        """Single-token steps after the first token (each generated token but the first, which the prompt gave)."""
        return max(self.generated_tokens - 1, 0)

    @property
    def eval_seconds(self) -> float:
        """Time spent on those steps."""
        return max(self.seconds - self.prompt_seconds, 0.0)

    @property
    def prompt_tokens_per_second(self) -> float:
        """Prompt ids run per second until the first token (0.0 before it)."""
        return self.prompt_evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generation speed: tokens per second after the first one (prompt processing not folded in; 0.0 before
        a second token)."""
        return self.eval_runs / self.eval_seconds if self.eval_runs and self.eval_seconds > 0 else 0.0


def _perf_line(label: str, seconds: float, n: int, unit: str, rates: bool = True) -> str:
    """One llama_perf_context_print line: time, count, and (rates) ms per item and items per second."""
    ms = seconds * 1000
    per = f"({ms / n:8.2f} ms per token, {n / seconds:8.2f} tokens per second)" if rates and n and seconds > 0 else ""
    return f"{label:>16} = {ms:10.2f} ms / {n:5d} {unit:<6} {per}".rstrip()


def perf_lines(stats: GenerationStats) -> list[str]:
    """The run's timings as llama.cpp prints them (llama_perf_context_print): prompt eval, eval, total, plus the
    time to the first token."""
    reused = stats.prompt_tokens - stats.prompt_evaluated
    return [_perf_line("prompt eval time", stats.prompt_seconds, stats.prompt_evaluated, "tokens")
            + (f" [{reused} more from the cache]" if reused > 0 else ""),
            _perf_line("eval time", stats.eval_seconds, stats.eval_runs, "runs"),
            _perf_line("total time", stats.seconds, stats.prompt_evaluated + stats.eval_runs, "tokens", rates=False),
            f"{'first token':>16} = {stats.prompt_seconds * 1000:10.2f} ms after the request"]


class Generation(Iterator[str]):
    """One run of a Request: an iterator of the reply's text chunks, plus its prompt ids, generated ids and stats.

    The only way to the generation loop (generate(), the API, the server, the CLI and the chat all build a
    Request). Stop strings (request.stop) are matched on the decoded text, so one split over several tokens is
    found; text that could be the start of one is held back until it is clear; the run stops at the first one
    (stats.stop_reason request.stop_reason), which is not shown, and reply_ids says how many of ids the reply
    holds.
    """

    def __init__(self, model: LanguageModel, tok: Tokenizer, request: Request) -> None:
        self.model, self.tok, self.request = model, tok, request
        self.prompt_ids: list[int] = list(request.prompt)
        self.max_tokens = request.max_tokens
        self.sampler = Sampler.from_params(request.sampling)
        self.stop_at_eog = request.stop_at_eog
        self.constraint = request.constraint
        if request.reasoning_budget is not None:  # the budget's forced ids before the constraint's mask
            from .reasoning_budget import BudgetGate

            self.constraint = BudgetGate(request.reasoning_budget, tok, request.constraint)
        removed = list(request.heal)
        dec = tok.stream_decoder(skip_special_tokens=True)  # the healed tokens' text, which the prompt holds
        # token healing: (the prompt's ids taken off, the text they decode to); nothing to heal by default
        self.heal: tuple[list[int], str] = (removed, "".join(dec.push(i) for i in removed) + dec.flush())
        self.ids: list[int] = []  # the generated ids that were decoded (no final eog)
        # with n_probs > 0: one TokenLogprob per generated id, the final eog included
        self.logprobs: list[TokenLogprob] = []
        self.eog_id: int | None = None  # the end-of-generation id that stopped the run, if one did
        self.text = ""  # the chunks yielded so far, joined (the reply, without a stop string)
        self.reply_ids: int | None = None  # when a stop string ended the run: how many of ids the reply holds
        self.stop_string = ""  # the stop string that ended the run, if one did
        self.stats = GenerationStats()
        n_ctx = context_length(model)
        if len(self.prompt_ids) >= n_ctx:  # as llama.cpp: "prompt is too long", not an empty success
            raise ContextLengthError(f"the prompt has {len(self.prompt_ids)} tokens but the model's context holds "
                                     f"{n_ctx}: expected at most {n_ctx - 1}, to leave room for a reply")
        self.stats.prompt_tokens = self.stats.prompt_evaluated = len(self.prompt_ids)
        self.stats.seed = self.sampler.seed
        self.sampler.accept(self.prompt_ids)  # the penalties see the prompt, as llama-server's sampler does
        self._cancelled = threading.Event()
        self._tokens = self._run()
        self._chunks = self._stop_at(self._tokens) if request.stop else self._tokens

    def __next__(self) -> str:
        return next(self._chunks)

    def __iter__(self) -> Generation:
        return self

    def __repr__(self) -> str:
        return f"Generation(prompt_tokens={len(self.prompt_ids)}, ids={len(self.ids)}, stats={self.stats})"

    @property
    def reply(self) -> list[int]:
        """The generated ids the reply's text holds (those before a stop string; no final eog)."""
        return self.ids if self.reply_ids is None else self.ids[:self.reply_ids]

    def cancel(self) -> None:
        """Stop early from any thread, even while another is inside next(): no model step is asked for after this
        (the one running finishes, as does a step a batched session queued ahead: at most one, its token dropped),
        and the iterator ends (stats.stop_reason 'stopped')."""
        self._cancelled.set()

    def close(self) -> None:
        """Stop early (stats.stop_reason becomes 'stopped' if the run had not ended)."""
        self._chunks.close()
        self._tokens.close()
        if not self.stats.stop_reason:
            self.stats.stop_reason = "stopped"

    def _run(self) -> Iterator[str]:
        """Ask the model for each id, stop at eog or max_tokens, stream ids through the tokenizer's decoder."""
        tok, stats = self.tok, self.stats
        n_vocab = tok.n_vocab
        decoder = tok.stream_decoder(skip_special_tokens=True)
        context = list(self.prompt_ids)
        removed, prefix = self.heal
        heal = b"".join(tok.token_to_piece(i) for i in removed)  # bytes the first tokens must spell out
        skip = len(prefix)  # ... and the text they give, already in the prompt: not yielded again
        n_ctx = context_length(self.model)
        # a batched session can queue each next step as soon as the last one's pass ends (Session.next_token's ahead)
        runs_ahead = getattr(self.model, "runs_ahead", False) is True
        stop = tok.is_eog if self.stop_at_eog else None
        start = time.perf_counter()
        try:
            while stats.generated_tokens < self.max_tokens:
                if self._cancelled.is_set():
                    stats.stop_reason = "stopped"
                    break
                if len(context) >= n_ctx and not self._shift(context, n_ctx):  # as llama-server: stop, keep the text
                    stats.stop_reason = "context"
                    break
                if heal:
                    self.sampler.constrain(_healing_mask(tok, heal), fallback=removed[0])
                elif self.constraint is not None:
                    self.sampler.constrain(self.constraint.allowed(), fallback=_first_eog(tok))
                self.sampler.last_logprob = None
                if runs_ahead and not heal and self.constraint is None and not self.sampler.penalizes \
                        and not self.sampler.n_probs:  # nothing changes the sampler between draws: steps may run ahead
                    ahead = int(min(self.max_tokens - stats.generated_tokens, n_ctx - len(context))) - 1
                    token = operator.index(self.model.next_token(context, self.sampler, ahead=ahead, stop=stop))
                else:
                    token = operator.index(self.model.next_token(context, self.sampler))
                if self.sampler.last_logprob is not None:
                    self.logprobs.append(self.sampler.last_logprob)
                if self.constraint is not None:
                    self.constraint.accept(token)
                self.sampler.accept((token,))
                if heal:
                    self.sampler.constrain(None)
                    piece = tok.token_to_piece(token) if 0 <= token < n_vocab else b""
                    heal = b"" if piece.startswith(heal) else heal[len(piece):]
                if not 0 <= token < n_vocab:
                    raise ArgumentError(f"the model returned token id {token}, outside the vocab (0..{n_vocab - 1})")
                stats.generated_tokens += 1
                stats.seconds = time.perf_counter() - start
                if stats.generated_tokens == 1:
                    stats.prompt_seconds = stats.seconds
                    evaluated = getattr(self.model, "evaluated", None)
                    if isinstance(evaluated, int):
                        stats.prompt_evaluated = evaluated
                if self.stop_at_eog and tok.is_eog(token):
                    self.eog_id = token
                    stats.stop_reason = "eog"
                    break
                context.append(token)
                self.ids.append(token)
                chunk = decoder.push(token)
                if skip and chunk:
                    chunk, skip = chunk[skip:], max(skip - len(chunk), 0)
                if chunk:
                    if self._chunks is self._tokens:
                        self.text += chunk
                    yield chunk
            else:
                stats.stop_reason = "max_tokens"
            tail = decoder.flush()
            if skip and tail:
                tail = tail[skip:]
            if tail:
                if self._chunks is self._tokens:
                    self.text += tail
                yield tail
        finally:
            if not stats.stop_reason:
                stats.stop_reason = "stopped"

    def _shift(self, context: list[int], n_ctx: int | float) -> bool:
        """llama-server's context shift (server-context.cpp's pre_decode) of a full context, when the request asks
        for it and the model can (Session.shift_context): positions after n_keep (plus a bos) dropped from the
        model's cache and from context, n_discard of them (default half); False (the run stops) otherwise."""
        req = self.request
        if not req.context_shift or not getattr(self.model, "can_shift", False):
            return False
        n_keep = len(self.prompt_ids) if req.n_keep < 0 else req.n_keep
        n_keep = int(min(n_ctx - 4, n_keep + (1 if self.tok.add_bos else 0)))
        n_left = len(context) - 1 - n_keep  # the positions the cache holds after n_keep (not the last pick)
        n_discard = max(0, min(req.n_discard or n_left // 2, n_left - 1))
        if n_keep < 0 or n_discard == 0:
            return False
        self.model.shift_context(n_keep, n_discard)  # type: ignore[attr-defined]
        del context[n_keep:n_keep + n_discard]
        self.stats.shifts += 1
        return True

    def _stop_at(self, tokens: Iterator[str]) -> Iterator[str]:
        """tokens' text up to the first stop string: the run stops there, the stop string is not shown."""
        markers = self.request.stop
        held = ""  # decoded text not yielded yet: it may begin a stop string
        for chunk in tokens:
            held += chunk
            at = min((i for i in (held.find(m) for m in markers) if i >= 0), default=-1)
            if at >= 0:
                self.stats.stop_reason = self.request.stop_reason
                self.stop_string = next(m for m in markers if held.find(m) == at)
                tokens.close()  # type: ignore[attr-defined]
                held = held[:at]
                self.reply_ids = _ids_within(self.tok, self.ids, self.text + held)
                break
            keep = _marker_start(held, markers)
            out, held = held[:len(held) - keep], held[len(held) - keep:]
            if out:
                self.text += out
                yield out
        if held:
            self.text += held
            yield held


def StopAt(gen: Generation, markers: Sequence[str], reason: str = "stop_string") -> Generation:  # noqa: N802
    """gen's run (not started yet) again, ending before the first of markers it writes (stats.stop_reason
    `reason`), with the seed gen drew: kept for callers of the old wrapper; a Request's stop does this."""
    sampling = replace(gen.request.sampling, seed=gen.stats.seed)
    return Generation(gen.model, gen.tok, replace(gen.request, sampling=sampling, stop=tuple(markers),
                                                  stop_reason=reason))


def _ids_within(tok: Tokenizer, ids: list[int], text: str) -> int:
    """The most leading ids whose decoded text is a beginning of text (binary search: a few decodes)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(tok.decode(ids[:mid], skip_special_tokens=True)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _marker_start(text: str, markers: Sequence[str]) -> int:
    """The length of the longest end of text that is the beginning of a marker (0 when none is)."""
    for k in range(min(len(text), max(map(len, markers), default=1) - 1), 0, -1):
        if any(m.startswith(text[-k:]) for m in markers):
            return k
    return 0


def _first_eog(tok: Tokenizer) -> int:
    """An end-of-generation id (eos, else eot, else 0): what a constraint that allows nothing falls back to."""
    return next((i for i in (tok.eos_id, tok.eot_id) if i is not None), 0)


def context_length(model: object) -> int | float:
    """The most ids the model can take (its `n_ctx`, as minillama.model.Model has), or infinity when it says none."""
    n_ctx = getattr(model, "n_ctx", None)
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else float("inf")


def _healing_mask(tok: Tokenizer, heal: bytes) -> np.ndarray:
    """Ids whose piece (non-empty, not a control token) begins with heal or is a beginning of it."""
    plain = tok.pieces.pieces_plain
    return np.fromiter((bool(p) and (p.startswith(heal) or heal.startswith(p)) for p in plain), bool, len(plain))


def prompt_ids(tok: Tokenizer, prompt: str | Sequence[int], heal: bool = False) -> tuple[list[int], list[int]]:
    """A prompt's ids and, with heal=True (str prompts), the ids taken off its end for token healing.

    A str prompt is encoded with add_special=True (bos as the vocab says) and parse_special=True (chat template
    control tokens become their ids); a sequence of ids is used as is."""
    if isinstance(prompt, str):
        if heal:
            ids, removed, _ = tok._completion(prompt, add_special=True, parse_special=True)
            return ids, removed
        return tok.encode(prompt, add_special=True, parse_special=True), []
    return [operator.index(i) for i in prompt], []


def generate(model: LanguageModel, tok: Tokenizer, prompt: str | Sequence[int], max_tokens: int, *,
             temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95, seed: int | None = None,
             stop_at_eog: bool = True, heal: bool = False, min_p: float = 0.0, repeat_penalty: float = 1.0,
             repeat_last_n: int = 64, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
             logit_bias: Mapping[int, float] | None = None, logprobs: int = 0,
             constraint: Constraint | None = None, stop: Sequence[str] | str = ()) -> Generation:
    """Stream the text model writes after prompt, up to max_tokens ids or an end-of-generation id: a Request
    built from these keywords, run (Generation(model, tok, request) does the same with a Request).

    A str prompt is encoded with add_special=True (bos as the vocab says) and parse_special=True (chat
    template control tokens become their ids); a sequence of ids is used as is. The returned Generation
    is an iterator of non-empty text chunks whose concatenation equals tok.decode(generation.ids).

    heal=True (token healing, str prompts): the prompt's last token is taken off
    (tok.encode_for_completion) and the first sampled tokens must spell it out again, so "The quick bro"
    can go on as " brown" rather than " bro" + "wn". The sampler is constrained, not the model, so any
    LanguageModel works; when the model offers no fitting candidate, the prompt's own token is used.
    Then generation.ids starts with the healed tokens, and the chunks (and generation.text) hold only
    the text after the prompt.

    min_p (0 here: off), repeat_penalty (over the last repeat_last_n ids, prompt included; -1 all),
    presence_penalty, frequency_penalty and logit_bias ({id: added score}) are llama.cpp's samplers (see
    SamplingParams and Sampler for the order). logprobs=N > 0 records each generated id's log-probability and the
    N best (generation.logprobs). constraint (e.g. minillama.constrain.JsonConstraint) limits each pick to the ids
    it allows. stop: strings that end the text before them (the Generation's text then ends before the first).
    """
    if heal and constraint is not None:
        raise ArgumentError("expected either heal=True or a constraint, found both")
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, min_p=min_p,
                              repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              logit_bias=logit_bias or {}, n_probs=logprobs)
    ids, removed = prompt_ids(tok, prompt, heal)
    return Generation(model, tok, Request(ids, int(max_tokens), sampling, stop=stop, constraint=constraint,
                                          heal=removed, stop_at_eog=stop_at_eog))


class ChatFormat(Protocol):
    """Turns a conversation into the text the model continues (a ChatTemplate, or chat.SimpleFormat)."""

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as prompt text, ending where the assistant's reply starts."""
        ...


def chat_prompt(tok: Tokenizer, fmt: ChatFormat, messages: Sequence[Mapping[str, Any]], *,
                reply_room: int | None = None, n_ctx: int | float = float("inf"),
                **template_kwargs: Any) -> tuple[list[int], int]:
    """The one chat-prompt renderer (the API's and the chat's): messages rendered with fmt (add_generation_prompt;
    template_kwargs go to the template), without a leading bos text when encoding adds bos itself (never two
    bos), encoded with control tokens matched; and how many exchanges were left out.

    With reply_room, the oldest exchanges are left out (the system message and the last message are kept) until
    the prompt and a reply of reply_room tokens fit n_ctx. Exchanges go whole (a user message with the reply to
    it), so the roles still alternate as chat templates require. When the last message alone leaves no room at
    all, ContextLengthError; when it leaves some, the ids (the reply stops when the context is full).
    """
    messages = list(messages)
    dropped = 0
    while True:
        text = without_bos(fmt.render(messages, add_generation_prompt=True, **template_kwargs),
                           getattr(fmt, "bos_token", ""), tok.add_bos)
        ids = tok.encode(text, add_special=True, parse_special=True)
        if reply_room is None or len(ids) + reply_room <= n_ctx:
            return ids, dropped
        first = 1 if messages[0]["role"] == "system" else 0
        if len(messages) - first <= 1:  # only the new message is left
            if len(ids) < n_ctx:
                return ids, dropped
            raise ContextLengthError(f"the message takes {len(ids)} tokens with the conversation's format; "
                                     f"the model's context holds {n_ctx}")
        del messages[first:first + 2]
        dropped += 1
