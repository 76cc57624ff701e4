"""A reasoning budget in tokens, as llama.cpp's reasoning-budget sampler (common/reasoning-budget.cpp): once the
thinking tag opens, at most `tokens` ids are thought; then the end tag (after an optional message) is forced.

    gate = BudgetGate(budget, tok, inner)       # budget: minillama.request.ReasoningBudget; inner: a Constraint
    gate.allowed(); gate.accept(id)             # the Constraint protocol the generation loop drives

The tags are matched on token ids, as llama.cpp matches them (a tag whose text merges with its neighbours into
other tokens is not seen, there as here). The ids of the template's generation prompt are fed first (llama.cpp's
prefill), so a prompt ending in "<think>\\n" starts the count. While thinking, a lazy constraint (a tool call's)
is neither applied nor fed; at the end tag it gets the tag's ids, as llama.cpp replays them into its grammar.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .request import Constraint, ReasoningBudget
    from .tokenizer import Tokenizer

__all__ = ["BudgetGate", "IDLE", "COUNTING", "FORCING", "WAITING_UTF8", "DONE"]

IDLE, COUNTING, FORCING, WAITING_UTF8, DONE = "idle", "counting", "forcing", "waiting_utf8", "done"


class _Matcher:
    """Which of seqs (token id sequences) ends at the id just seen: the longest, by its index, or -1. After a match
    it starts over (llama.cpp's token_matcher over an Aho-Corasick trie)."""

    def __init__(self, seqs: tuple[tuple[int, ...], ...]) -> None:
        self.seqs = tuple(dict.fromkeys(s for s in seqs if s))
        self.longest = max(map(len, self.seqs), default=0)
        self.seen: list[int] = []

    def advance(self, token: int) -> int:
        self.seen = (self.seen + [token])[-self.longest:] if self.longest else []
        best = -1
        for i, s in enumerate(self.seqs):
            if len(s) <= len(self.seen) and tuple(self.seen[-len(s):]) == s and (
                    best < 0 or len(s) > len(self.seqs[best])):
                best = i
        if best >= 0:
            self.seen = []
        return best

    def reset(self) -> None:
        self.seen = []


def utf8_complete(piece: bytes) -> bool:
    """Whether piece does not end inside a UTF-8 sequence (llama.cpp's common_utf8_is_complete)."""
    if not piece:
        return True
    for i in range(1, min(4, len(piece)) + 1):
        c = piece[-i]
        if c & 0xC0 != 0x80:
            return i >= (4 if c >= 0xF0 else 3 if c >= 0xE0 else 2 if c >= 0xC0 else 1)
    return False


class BudgetGate:
    """The budget's state machine in front of an inner constraint (or none): while forcing, only the next forced
    id is allowed; otherwise the inner constraint's mask (a lazy one only outside thinking)."""

    def __init__(self, budget: ReasoningBudget, tok: Tokenizer, inner: Constraint | None = None) -> None:
        self.budget, self.tok, self.inner = budget, tok, inner
        self.start = _Matcher((budget.start,))
        self.end = _Matcher(budget.ends)
        self.forced = budget.forced or (budget.ends[0] if budget.ends else ())
        self.limit = budget.tokens if budget.tokens >= 0 else 2**31 - 1
        self.remaining = self.limit
        self.state = IDLE
        self.force_pos = 0
        self.lazy = bool(getattr(inner, "lazy", False))
        for t in budget.prefill:
            self._step(t)

    @property
    def thinking(self) -> bool:
        return self.state in (COUNTING, FORCING, WAITING_UTF8)

    def allowed(self) -> np.ndarray | None:
        if self.state == FORCING and self.force_pos < len(self.forced):
            mask = np.zeros(self.tok.n_vocab, dtype=bool)
            mask[self.forced[self.force_pos]] = True
            return mask
        if self.inner is None or (self.lazy and self.thinking):
            return None
        return self.inner.allowed()

    def accept(self, token: int) -> None:
        feed_inner = self.inner is not None and not (self.lazy and self.thinking)
        ended = self._step(token)
        if feed_inner:
            self.inner.accept(token)  # type: ignore[union-attr]
        elif self.inner is not None and ended is not None:  # thinking just ended: the lazy constraint sees the tag
            for t in ended:
                self.inner.accept(t)

    @property
    def done(self) -> bool:
        return bool(getattr(self.inner, "done", False))

    def _open(self) -> None:
        self.state, self.remaining = COUNTING, self.limit
        if self.remaining <= 0:
            self.state, self.force_pos = FORCING, 0

    def _step(self, token: int) -> tuple[int, ...] | None:
        """Advance past token; the end sequence that closed thinking, when it just did (else None)."""
        if self.state == IDLE:
            if self.start.advance(token) >= 0:
                self._open()
        elif self.state in (COUNTING, WAITING_UTF8):
            m = self.end.advance(token)
            if m >= 0:
                self.state = DONE
                return self.end.seqs[m]
            complete = utf8_complete(self.tok.token_to_piece(token)) if 0 <= token < self.tok.n_vocab else True
            if self.state == WAITING_UTF8:
                if complete:
                    self.state, self.force_pos = FORCING, 0
                    self.end.reset()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.state = FORCING if complete else WAITING_UTF8
                    self.force_pos = 0
                    self.end.reset()
        elif self.state == FORCING:
            m = self.end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state = DONE
                return self.end.seqs[m] if m >= 0 else ()
        elif self.start.advance(token) >= 0:  # DONE: a new thinking block gets a fresh budget
            self.end.reset()
            self._open()
        return None


def thinking_tags(family: str) -> tuple[str, tuple[str, ...]]:
    """The tags that open and close thinking for a template family, as llama.cpp's parsers name them."""
    if family == "gpt_oss":
        return "<|channel|>analysis<|message|>", ("<|end|>",)
    return "<think>", ("</think>",)


def make_budget(tok: Tokenizer, family: str, tokens: int, message: str, generation_prompt: str) -> Any:
    """The ReasoningBudget for a chat request: the family's tags and the message tokenized as llama.cpp tokenizes
    them (control tokens matched, no bos), the generation prompt's ids as the prefill."""
    from .request import ReasoningBudget

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special=False, parse_special=True)) if text else ()

    start, ends = thinking_tags(family)
    end_ids = tuple(ids(e) for e in ends)
    prefill = list(ids(generation_prompt))
    if prefill and generation_prompt and not generation_prompt[0].isspace():
        first = tok.token_to_piece(prefill[0], special=True)
        if first[:1].isspace():  # a space some tokenizers put before a first special token: not the prompt's
            prefill = prefill[1:]
    return ReasoningBudget(tokens, ids(start), end_ids, ids(message) + end_ids[0], tuple(prefill))
