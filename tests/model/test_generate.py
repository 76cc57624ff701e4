"""generate() and the Sampler: seeded runs repeat, greedy is deterministic, top-k=1 is greedy, eog and
max_tokens stop a run, and the streamed chunks join to Tokenizer.decode(ids) (the reference, which the
conformance tests check against llama.cpp)."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from minillama.errors import ArgumentError, ContextLengthError
from minillama.generate import Generation, LanguageModel, Sampler, StopAt, generate, perf_lines
from minillama.ngram import NGramModel, default_corpus_path
from minillama.tokenizer import Tokenizer, default_vocab_path

PROMPT = "The tokenizer"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(default_vocab_path())


@pytest.fixture(scope="module")
def lm(tok: Tokenizer) -> NGramModel:
    return NGramModel.train_files(tok, [default_corpus_path()])


class Scripted:
    """A model that returns fixed ids in turn (and records the contexts it was given)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)
        self.contexts: list[list[int]] = []

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        self.contexts.append(list(ids))
        return self.ids[len(self.contexts) - 1]


class Uniform:
    """Every id equally likely: arbitrary sequences, partial UTF-8 tokens and control tokens included."""

    def __init__(self, n_vocab: int) -> None:
        self.probs = np.full(n_vocab, 1.0 / n_vocab)

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        return sampler.sample_probs(self.probs)


def _run(gen: Generation) -> tuple[list[str], str]:
    chunks = list(gen)
    return chunks, "".join(chunks)


def test_protocol(lm: NGramModel) -> None:
    assert isinstance(lm, LanguageModel) and isinstance(Scripted([]), LanguageModel)
    assert not isinstance(object(), LanguageModel)


def test_seeded_runs_repeat(lm: NGramModel, tok: Tokenizer) -> None:
    runs = [generate(lm, tok, PROMPT, 80, temperature=1.0, top_k=0, top_p=1.0, seed=42) for _ in range(3)]
    texts = [_run(g)[1] for g in runs]
    assert texts[0] == texts[1] == texts[2]
    assert runs[0].ids == runs[1].ids == runs[2].ids and runs[0].stats.seed == 42
    others = {_ids(generate(lm, tok, PROMPT, 80, temperature=1.0, seed=s)) for s in range(8)}
    assert len(others) > 1  # different seeds give different text


def _ids(gen: Generation) -> tuple[int, ...]:
    list(gen)
    return tuple(gen.ids)


def test_random_seed_is_recorded(lm: NGramModel, tok: Tokenizer) -> None:
    gen = generate(lm, tok, PROMPT, 40, temperature=1.0)
    text = _run(gen)[1]
    again = generate(lm, tok, PROMPT, 40, temperature=1.0, seed=gen.stats.seed)
    assert _run(again)[1] == text


def test_greedy_is_deterministic(lm: NGramModel, tok: Tokenizer) -> None:
    runs = [_ids(generate(lm, tok, PROMPT, 60, temperature=0.0, seed=s)) for s in (None, 1, 2, 3)]
    assert len(set(runs)) == 1
    # each greedy id is the argmax of the model's distribution (the first among equals)
    ids = tok.encode(PROMPT, add_special=True, parse_special=True)
    for i in runs[0]:
        assert i == int(np.argmax(lm.probabilities(ids)))
        ids.append(i)


def test_top_k_1_is_greedy(lm: NGramModel, tok: Tokenizer) -> None:
    greedy = _ids(generate(lm, tok, PROMPT, 60, temperature=0.0))
    for seed in (5, 6, 7):
        assert _ids(generate(lm, tok, PROMPT, 60, temperature=1.5, top_k=1, top_p=1.0, seed=seed)) == greedy


def test_stops_at_eog(tok: Tokenizer) -> None:
    a, b, c = tok.encode(" the herd", add_special=False)[:2] + [65]
    eos = tok.eos_id
    assert eos is not None and tok.is_eog(eos)
    model = Scripted([a, b, eos, c, c, c])
    gen = generate(model, tok, "x", 10)
    chunks, text = _run(gen)
    assert gen.ids == [a, b] and gen.eog_id == eos and gen.stats.stop_reason == "eog"
    assert gen.stats.generated_tokens == 3 and text == tok.decode([a, b])
    assert model.contexts[1] == gen.prompt_ids + [a]  # the model sees the whole sequence so far
    # stop_at_eog=False: the eog id is decoded like any other (control tokens render as nothing)
    gen = generate(Scripted([a, b, eos, c, c, c]), tok, "x", 5, stop_at_eog=False)
    text = _run(gen)[1]
    assert gen.ids == [a, b, eos, c, c] and gen.eog_id is None and gen.stats.stop_reason == "max_tokens"
    assert text == tok.decode(gen.ids)


class Bounded(Scripted):
    """Scripted, with a context of n_ctx ids that it refuses to go past (as minillama.model.Model does)."""

    def __init__(self, ids: Sequence[int], n_ctx: int) -> None:
        super().__init__(ids)
        self.n_ctx = n_ctx

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        assert len(ids) <= self.n_ctx, "generate went past the model's context"
        return super().next_token(ids, sampler)


def test_stops_when_the_context_is_full(tok: Tokenizer) -> None:
    a = tok.encode(" the", add_special=False)[0]
    prompt = tok.encode("the herd", add_special=True)
    model = Bounded([a] * 20, n_ctx=len(prompt) + 3)
    gen = generate(model, tok, prompt, 10)
    text = _run(gen)[1]
    # three ids fill the context; the fourth request would not fit: stopped, what was made kept
    assert gen.ids == [a, a, a] and gen.stats.stop_reason == "context" and text == tok.decode([a, a, a])
    assert [len(c) for c in model.contexts] == [len(prompt), len(prompt) + 1, len(prompt) + 2]


def test_max_tokens(lm: NGramModel, tok: Tokenizer) -> None:
    for n in (0, 1, 5, 33):
        gen = generate(Uniform(tok.n_vocab), tok, PROMPT, n, seed=n, stop_at_eog=False)
        _run(gen)
        assert len(gen.ids) == gen.stats.generated_tokens == n and gen.stats.stop_reason == "max_tokens"
    gen = generate(lm, tok, PROMPT, 7, seed=1)
    _run(gen)
    assert gen.stats.generated_tokens <= 7 and len(gen.ids) <= 7


@pytest.mark.parametrize("seed", range(6))
def test_chunks_join_to_decode(lm: NGramModel, tok: Tokenizer, seed: int) -> None:
    for model in (lm, Uniform(tok.n_vocab)):
        gen = generate(model, tok, PROMPT, 120, temperature=1.0, seed=seed, stop_at_eog=model is lm)
        chunks, text = _run(gen)
        assert all(chunks), "every chunk is non-empty"
        assert text == tok.decode(gen.ids) == gen.text


def test_chunks_join_to_decode_real_model() -> None:
    """The same on a real SPM/BPE vocab when one is configured (SmolLM2: BPE with many multi-byte pieces)."""
    path = os.environ.get("MINILLAMA_TEST_GGUF")
    if not path or not os.path.exists(path):
        pytest.skip("MINILLAMA_TEST_GGUF is not set to an existing GGUF file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    real = Tokenizer.from_file(path)
    for seed in range(3):
        gen = generate(Uniform(real.n_vocab), real, "Hello", 200, seed=seed, stop_at_eog=False)
        text = _run(gen)[1]
        assert text == real.decode(gen.ids)


def test_prompt_encoding(tok: Tokenizer) -> None:
    prompt = "<|endoftext|>Hello"
    gen = generate(Scripted([tok.eos_id]), tok, prompt, 5)
    _run(gen)
    assert gen.prompt_ids == tok.encode(prompt, add_special=True, parse_special=True)
    assert gen.prompt_ids[0] == tok.eos_id  # the control token text became its id
    assert gen.stats.prompt_tokens == len(gen.prompt_ids)
    gen = generate(Scripted([tok.eos_id]), tok, [1, 2, 3], 5)  # ids are used as given
    _run(gen)
    assert gen.prompt_ids == [1, 2, 3]


def test_stats(lm: NGramModel, tok: Tokenizer) -> None:
    gen = generate(Uniform(tok.n_vocab), tok, PROMPT, 50, seed=3, stop_at_eog=False)
    assert gen.stats.stop_reason == "" and gen.stats.tokens_per_second == 0.0
    _run(gen)
    st = gen.stats
    assert st.generated_tokens == 50 and st.seconds > 0
    assert st.tokens_per_second == pytest.approx(49 / (st.seconds - st.prompt_seconds))  # the prompt not folded in
    gen = generate(Uniform(tok.n_vocab), tok, PROMPT, 50, seed=3, stop_at_eog=False)
    next(gen)
    gen.close()
    assert gen.stats.stop_reason == "stopped" and list(gen) == []


def test_model_returning_bad_id(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="outside the vocab"):
        list(generate(Scripted([tok.n_vocab]), tok, "x", 3))


# --- the Sampler on its own ------------------------------------------------------------------

PROBS = np.array([0.05, 0.5, 0.15, 0.3])  # order by probability: 1, 3, 2, 0


def _draws(n: int = 400, **kw: float) -> Counter[int]:
    s = Sampler(seed=123, **kw)  # type: ignore[arg-type]
    return Counter(s.sample_probs(PROBS) for _ in range(n))


def test_sampler_greedy() -> None:
    assert set(_draws(temperature=0.0)) == {1}
    assert set(_draws(temperature=2.0, top_k=1, top_p=1.0)) == {1}
    assert Sampler(temperature=0).sample_logits([1.0, 3.0, 3.0]) == 1  # the first among equals
    assert Sampler(temperature=0).sample_logits([1.0, 3.0], ids=[7, 9]) == 9


def test_greedy_over_a_whole_vocab_keeps_the_chains_answers() -> None:
    """Greedy with nothing to adjust takes a shortcut (argmax over the raw scores): llama.cpp's greedy sampler's
    pick (the first highest score, -inf never, +inf first), and the chain's errors for NaN and no candidate;
    logit_bias, penalties and the allowed set still go through the chain."""
    greedy = Sampler(temperature=0)
    f32 = np.array([0.5, -np.inf, 2.0, 2.0, -1.0], np.float32)
    assert greedy.sample_logits(f32) == 2
    assert greedy.sample_logits(np.array([-np.inf, 1.0, np.inf, np.inf])) == 2
    assert greedy.sample_logits(np.array([3, 7, 7])) == 1
    for bad in ([1.0, np.nan, 5.0], [-np.inf, -np.inf], np.array([], np.float32)):
        with pytest.raises(ArgumentError):
            greedy.sample_logits(bad)
    assert Sampler(temperature=0, logit_bias={0: 10.0}).sample_logits(f32) == 0
    penalized = Sampler(temperature=0, repeat_penalty=2.0)
    penalized.accept([2, 3])
    assert penalized.sample_logits(np.array([1.5, -np.inf, 2.0, 2.0])) == 0  # 2.0 / 2 for the seen ids 2, 3
    allowed = Sampler(temperature=0)
    allowed.constrain(np.array([True, False, False, True, True]))
    assert allowed.sample_logits(f32) == 3


def test_sampler_top_k_top_p() -> None:
    assert set(_draws(temperature=1.0, top_k=2, top_p=1.0)) == {1, 3}
    assert set(_draws(temperature=1.0, top_k=0, top_p=0.75)) == {1, 3}  # 0.5 + 0.3 reaches 0.75
    assert set(_draws(temperature=1.0, top_k=0, top_p=0.85)) == {1, 3, 2}
    assert set(_draws(temperature=1.0, top_k=0, top_p=1.0)) == {0, 1, 2, 3}
    assert set(_draws(temperature=1.0, top_k=0, top_p=0.1)) == {1}  # at least one candidate is kept


def test_top_k_order_is_the_full_stable_sort() -> None:
    """top_k's candidates (sorted without sorting the whole vocab) are the first k of a stable argsort of the
    negated scores: best first, equals in candidate order, ties across the k-th place cut as the full sort cuts
    them (so a seeded draw picks what it picked before), whether the k are found among all scores or among those
    above a sample's floor (large vocabs)."""
    from minillama.sampling import _best_first
    rng = np.random.default_rng(5)
    for n, k, levels in [(49152, 40, 0), (1000, 40, 7), (1000, 3, 2), (300, 50, 30), (50, 40, 0), (10, 0, 3),
                         (200, 1, 1), (6, 5, 0), (49152, 40, 3), (49152, 40, 1), (5000, 40, 7), (3000, 5, 2)]:
        for _ in range(5):
            x = rng.standard_normal(n)
            if levels:  # few distinct values: many ties, around the k-th place too
                x = np.round(x * levels / 3) * 0.5
                x[rng.integers(0, n, n // 10)] = -0.0
            want = np.argsort(-x, kind="stable")[:k if k > 0 else None]
            np.testing.assert_array_equal(_best_first(x, k), want)


def test_sampler_temperature() -> None:
    plain = _draws(4000, temperature=1.0, top_k=0, top_p=1.0)
    for i, p in enumerate(PROBS):
        assert abs(plain[i] / 4000 - p) < 0.03
    cold = _draws(4000, temperature=0.3, top_k=0, top_p=1.0)
    hot = _draws(4000, temperature=3.0, top_k=0, top_p=1.0)
    assert cold[1] > plain[1] > hot[1] and cold[0] < plain[0] < hot[0]


def test_sampler_zero_probability_never_drawn() -> None:
    s = Sampler(temperature=5.0, top_k=0, top_p=1.0, seed=1)
    assert {s.sample_probs([0.0, 1e-9, 0.0, 1.0], ids=[10, 11, 12, 13]) for _ in range(300)} <= {11, 13}
    with pytest.raises(ValueError, match="non-zero"):
        s.sample_probs([0.0, 0.0])


def test_sampler_arguments() -> None:
    for kw in ({"temperature": -1.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            Sampler(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="candidate"):
        Sampler().sample_logits([1.0, 2.0], ids=[1])
    with pytest.raises(ValueError, match="NaN"):
        Sampler().sample_logits([1.0, float("nan")])


# --- --seed -1, a prompt longer than the context, prompt and generation speeds apart ---------------


def test_seed_minus_one_is_a_random_seed() -> None:
    """llama.cpp's --seed -1 (LLAMA_DEFAULT_SEED) asks for a random seed; numpy raised ValueError on it."""
    seeds = {Sampler(seed=-1).seed for _ in range(4)}
    assert len(seeds) > 1 and all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ArgumentError, match=r"expected a seed of 0 or more \(or -1 for a random one\), found -2"):
        Sampler(seed=-2)


class Contexted(Scripted):
    """A scripted model with a context of n_ctx ids."""

    def __init__(self, ids: Sequence[int], n_ctx: int) -> None:
        super().__init__(ids)
        self.n_ctx = n_ctx


def test_prompt_longer_than_the_context_is_an_error(tok: Tokenizer) -> None:
    """It gave no text and a success; now ContextLengthError naming both lengths, before the model runs."""
    model = Contexted([5, 6, 7], n_ctx=4)
    for prompt in ([1, 2, 3, 4, 5], [1, 2, 3, 4]):  # a full context leaves no room for a reply either
        with pytest.raises(ContextLengthError, match=rf"the prompt has {len(prompt)} tokens but the model's context "
                                                     r"holds 4: expected at most 3"):
            generate(model, tok, prompt, 3)
    assert list(generate(model, tok, [1, 2, 3], 3)) or True  # 3 prompt ids fit


class Timed:
    """A model whose first call (the prompt) takes `prompt_s` and every later call `step_s`; it says it evaluated
    `evaluated` of the prompt's ids, as Model does when its cache held the rest."""

    def __init__(self, prompt_s: float, step_s: float, evaluated: int) -> None:
        self.prompt_s, self.step_s, self.calls, self._evaluated = prompt_s, step_s, 0, evaluated
        self.evaluated = 0

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        time.sleep(self.prompt_s if self.calls == 0 else self.step_s)
        self.evaluated = self._evaluated if self.calls == 0 else 1
        self.calls += 1
        return 70


def test_prompt_and_generation_speeds_apart(tok: Tokenizer) -> None:
    """A slow prompt pass no longer drags tokens/s down: prompt eval and eval are timed apart, as llama.cpp does."""
    gen = generate(Timed(0.3, 0.01, evaluated=8), tok, list(range(1, 11)), 6, stop_at_eog=False)
    _run(gen)
    st = gen.stats
    assert st.prompt_seconds >= 0.3 and st.prompt_evaluated == 8 and st.prompt_tokens == 10
    assert st.eval_runs == 5 and st.eval_seconds == pytest.approx(st.seconds - st.prompt_seconds)
    assert st.tokens_per_second == pytest.approx(5 / st.eval_seconds) and st.tokens_per_second > 20
    assert st.prompt_tokens_per_second == pytest.approx(8 / st.prompt_seconds)
    lines = perf_lines(st)
    # llama_perf_context_print's layout: "<label> = <ms> ms / <n> tokens (<ms> ms per token, <n> tokens per second)"
    assert re.fullmatch(r" *prompt eval time = +[\d.]+ ms / +8 tokens +\( *[\d.]+ ms per token, +[\d.]+ tokens per "
                        r"second\) \[2 more from the cache\]", lines[0]), lines[0]
    assert re.fullmatch(r" *eval time = +[\d.]+ ms / +5 runs +\( *[\d.]+ ms per token, +[\d.]+ tokens per second\)",
                        lines[1]), lines[1]
    assert re.fullmatch(r" *total time = +[\d.]+ ms / +13 tokens", lines[2]), lines[2]
    assert re.fullmatch(r" *first token = +[\d.]+ ms after the request", lines[3]), lines[3]


# --- llama.cpp's penalties, min_p, logit_bias, logprobs, stop strings ------------------------------


def test_penalties_follow_llamacpps_formula() -> None:
    """llama_sampler_penalties: a candidate seen c > 0 times in the last n ids has its logit l multiplied by
    repeat_penalty when l <= 0, divided when l > 0, then reduced by c * frequency + presence. By hand:"""
    s = Sampler(repeat_penalty=1.5, frequency_penalty=0.2, presence_penalty=0.3, repeat_last_n=64)
    s.accept([0, 1, 1, 3])  # id 0 once, id 1 twice, id 3 once, id 2 never
    got = s.adjust(np.array([2.0, -1.0, 0.5, 3.0]), np.arange(4))
    assert got.tolist() == pytest.approx([2.0 / 1.5 - 0.2 - 0.3, -1.0 * 1.5 - 2 * 0.2 - 0.3, 0.5, 3.0 / 1.5 - 0.5])
    # the window: only the last two ids (1, 3) count
    s = Sampler(repeat_penalty=1.5, frequency_penalty=0.2, presence_penalty=0.3, repeat_last_n=2)
    s.accept([0, 1, 1, 3])
    assert s.adjust(np.array([2.0, -1.0, 0.5, 3.0]), np.arange(4)).tolist() == pytest.approx(
        [2.0, -1.5 - 0.2 - 0.3, 0.5, 2.0 - 0.5])
    # repeat_last_n=0 turns every penalty off, as in llama.cpp
    s = Sampler(repeat_penalty=1.5, frequency_penalty=0.2, repeat_last_n=0)
    s.accept([0, 1])
    assert s.adjust(np.array([2.0, -1.0]), np.arange(2)).tolist() == [2.0, -1.0]


def test_repeat_penalty_changes_the_greedy_pick() -> None:
    s = Sampler(temperature=0, repeat_penalty=2.0)
    assert s.sample_logits([1.0, 1.5]) == 1
    s.accept([1])
    assert s.sample_logits([1.0, 1.5]) == 0  # 1.5 / 2 = 0.75 < 1.0


def test_penalties_see_the_prompt(tok: Tokenizer) -> None:
    """As llama-server, the prompt's ids are in the penalties' window: a model that always scores the last
    prompt id highest is turned away from it by presence_penalty."""
    prompt = tok.encode("Hello", add_special=False)

    class Echo:
        def next_token(self, ids, sampler):
            x = np.zeros(tok.n_vocab)
            x[prompt[-1]] = 1.0
            return sampler.sample_logits(x)

    def first(**kw: float) -> list[int]:
        gen = generate(Echo(), tok, prompt, 1, temperature=0, **kw)
        list(gen)
        return gen.ids

    assert first() == [prompt[-1]]
    assert first(presence_penalty=2.0) not in ([prompt[-1]], [])


def test_min_p_keeps_candidates_within_a_factor_of_the_best() -> None:
    """llama_sampler_min_p: keep p >= min_p * p_max. PROBS: 0.5 best; min_p 0.25 keeps >= 0.125 (ids 1, 3, 2)."""
    assert set(_draws(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25)) == {1, 3, 2}
    assert set(_draws(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5)) == {1, 3}
    assert set(_draws(temperature=1.0, top_k=0, top_p=1.0, min_p=1.0)) == {1}
    assert set(_draws(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)) == {0, 1, 2, 3}


def test_logit_bias() -> None:
    assert set(_draws(temperature=1.0, top_k=0, top_p=1.0, logit_bias={1: -np.inf, 3: -np.inf})) == {0, 2}
    assert Sampler(temperature=0, logit_bias={"0": 100}).sample_probs(PROBS) == 0  # OpenAI's keys are strings
    with pytest.raises(ArgumentError, match="logit_bias"):
        Sampler(logit_bias={0: float("nan")})


def test_new_sampler_arguments() -> None:
    for kw in ({"min_p": -0.1}, {"min_p": 1.5}, {"repeat_penalty": 0.0}, {"repeat_last_n": -2},
               {"presence_penalty": float("inf")}, {"n_probs": -1}):
        with pytest.raises(ArgumentError):
            Sampler(**kw)  # type: ignore[arg-type]


def test_logprobs_are_log_softmax_of_the_raw_scores() -> None:
    x = np.array([1.0, 3.0, -2.0, 0.5])
    ref = x - np.log(np.exp(x).sum())
    s = Sampler(temperature=0.5, seed=4, n_probs=2, logit_bias={0: 5.0}, repeat_penalty=3.0)
    s.accept([1])
    pick = s.sample_logits(x)
    lp = s.last_logprob
    assert lp is not None and lp.id == pick and lp.logprob == pytest.approx(ref[pick])
    assert [i for i, _ in lp.top] == [1, 0]  # before the bias (0 would lead) and the penalty
    assert [v for _, v in lp.top] == pytest.approx([ref[1], ref[0]])


def test_generation_records_logprobs(lm: NGramModel, tok: Tokenizer) -> None:
    gen = generate(lm, tok, "Once upon a time", 12, seed=3, logprobs=1)
    list(gen)
    assert len(gen.logprobs) == gen.stats.generated_tokens
    assert [lp.id for lp in gen.logprobs[:len(gen.ids)]] == gen.ids
    assert all(lp.logprob <= 0 for lp in gen.logprobs)


@pytest.mark.parametrize("seed", range(6))
def test_stop_strings(lm: NGramModel, tok: Tokenizer, seed: int) -> None:
    """The text ends before the first stop string of the same seeded run; none of it is shown, even in part."""
    kw = {"seed": seed, "stop_at_eog": False}
    full = "".join(generate(lm, tok, "Once upon a time", 60, **kw))
    for stop in {full[i:i + 4] for i in range(10, len(full) - 4, 7)}:
        run = StopAt(generate(lm, tok, "Once upon a time", 60, **kw), [stop])
        chunks = list(run)
        assert "".join(chunks) == run.text == full[:full.index(stop)]
        assert run.stats.stop_reason == "stop_string"
        assert run.text.startswith(tok.decode(run.ids[:run.reply_ids]))  # the ids wholly before the stop string
    run = StopAt(generate(lm, tok, "Once upon a time", 60, **kw), ["\x00never"])
    assert "".join(run) == full and run.stats.stop_reason == "max_tokens"


def test_sampling_params_have_llamacpps_defaults_and_are_checked_once() -> None:
    """SamplingParams' defaults are llama.cpp's common_params_sampling (common/common.h: temp 0.80, top_k 40, top_p
    0.95, min_p 0.05, penalty_last_n 64, penalty_repeat 1.0, penalty_freq 0.0, penalty_present 0.0, seed
    LLAMA_DEFAULT_SEED); each bad value is refused when it is built, with the Sampler's own messages, and it is
    frozen."""
    import dataclasses

    from minillama.request import SamplingParams

    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
            p.presence_penalty, p.seed, p.logit_bias, p.n_probs) == (0.8, 40, 0.95, 0.05, 64, 1.0, 0.0, 0.0, None,
                                                                     {}, 0)
    for kw in ({"temperature": -1.0}, {"top_k": -1}, {"top_p": 0.0}, {"min_p": 1.5}, {"repeat_penalty": 0.0},
               {"repeat_last_n": -2}, {"presence_penalty": float("inf")}, {"n_probs": -1}, {"seed": -2},
               {"logit_bias": {"-1": 1.0}}):
        with pytest.raises(ArgumentError) as params_error:
            SamplingParams(**kw)  # type: ignore[arg-type]
        with pytest.raises(ArgumentError) as sampler_error:
            Sampler(**kw)  # type: ignore[arg-type]
        assert str(params_error.value) == str(sampler_error.value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.0  # type: ignore[misc]


def test_a_request_runs_as_the_keywords_do(lm: NGramModel, tok: Tokenizer) -> None:
    """Generation(model, tok, Request) is what generate() runs: the same ids for the same settings, a Sampler built
    from SamplingParams picks as the one built from keywords, and stop strings end the text as StopAt does."""
    from minillama.request import Request, SamplingParams

    kw = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repeat_penalty": 1.2, "seed": 5}
    by_keywords = generate(lm, tok, "Once upon a time", 40, stop_at_eog=False, **kw)
    full = "".join(by_keywords)
    ids = tok.encode("Once upon a time", add_special=True, parse_special=True)
    run = Generation(lm, tok, Request(ids, 40, SamplingParams(**kw), stop_at_eog=False))
    assert "".join(run) == full and run.ids == by_keywords.ids
    stop = full[12:16]
    cut = Generation(lm, tok, Request(ids, 40, SamplingParams(**kw), stop=[stop], stop_at_eog=False))
    assert "".join(cut) == full[:full.index(stop)] and cut.stats.stop_reason == "stop_string"
    assert cut.reply == cut.ids[:cut.reply_ids]
    with pytest.raises(TypeError, match="expected stop as a str or a list of str"):
        Request(ids, 4, stop=[1])  # type: ignore[list-item]
