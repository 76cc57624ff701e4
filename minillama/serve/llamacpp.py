"""llama.cpp's own server routes (llama-server's native API) for `minillama serve`: POST /completion (and
/completions) with llama.cpp's request fields and response shape, streamed as llama-server streams it.

The requests run as the OpenAI routes' do: the same slots (slots.py), the same Llama internals (its prompt ids, its
SamplingParams, one minillama.request.Request per call, Llama.run), so the two route families give the same tokens
for the same settings. Only the fields' names and the answer's shape are llama.cpp's (tools/server/README.md):

- the prompt as text, token ids, or a list mixing both (each text encoded with control tokens matched; the first
  with the model's bos, as llama.cpp's tokenize_mixed);
- `n_predict` (-1: until the context is full, 0: nothing), `n_probs` (completion_probabilities: each token's
  log-probability and the n best), `ignore_eos`, `stop`, `samplers` (the sampler chain: a sampler left out is
  off; minillama runs them in llama.cpp's default order, a different order is refused), `json_schema`, `grammar`
  (GBNF), `t_max_predict_ms` (stop at a newline once generation took longer), `logit_bias` in llama.cpp's array
  and object forms; `cache_prompt`, `id_slot` and `n_keep` are accepted (the prompt cache picks the slot holding
  the longest prefix whatever they say; n_keep is what a context shift keeps, under --context-shift);
- errors are llama.cpp's object: {"error": {"code": 400, "message": ..., "type": "invalid_request_error"}}.

The other native routes live here too: /infill, /apply-template, /embedding, /props, /metrics, /slots and the slot
actions, and /rerank (with its aliases, behind --reranking: Llama.rank's scores in Jina's or TEI's shape).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api import token_text
from ..constrain import JsonConstraint
from ..errors import ArgumentError, ContextLengthError, MinillamaError
from ..request import Request as GenRequest
from . import params
from .params import INT32_MAX, UINT64_MAX, ApiError, _f
from .slots import ClientGone, load_cache, save_cache, valid_filename
from .sse import EventStream, first_of

__all__ = ["routes", "COMPLETION", "SAMPLERS", "llamacpp_error"]

#: llama.cpp's sampler names in its default order (common_params_sampling.samplers); those minillama runs change the
#: tokens, the rest are off at their defaults here (dry, typ_p, xtc, top_n_sigma) and may be named or left out.
SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
#: `samplers` as a string: one letter each (llama.cpp's common_sampler_types_from_chars).
_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p", "m": "min_p",
            "x": "xtc", "t": "temperature"}
#: what leaving one of minillama's samplers out of `samplers` sets (the sampler then does nothing).
_OFF = {"penalties": {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
        "top_k": {"top_k": 0}, "top_p": {"top_p": 1.0}, "min_p": {"min_p": 0.0}, "temperature": {"temperature": 1.0}}
#: llama.cpp's sampling settings minillama does not have, at llama.cpp's defaults (generation_settings shows them).
NEUTRAL: dict[str, Any] = {"dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0,
                           "xtc_threshold": 0.1, "typical_p": 1.0, "dry_multiplier": 0.0, "dry_base": 1.75,
                           "dry_allowed_length": 2, "dry_penalty_last_n": -1, "mirostat": 0, "mirostat_tau": 5.0,
                           "mirostat_eta": 0.1, "min_keep": 0, "post_sampling_probs": False}
#: generation_settings' other keys llama-server reports, at what they are here.
SHOWN = {"dry_sequence_breakers": ["\n", ":", "\"", "*"], "adaptive_target": -1.0, "adaptive_decay": 0.9,
         "n_discard": 0, "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
         "chat_format": "Content-only", "reasoning_format": "none", "reasoning_in_content": False,
         "generation_prompt": "", "speculative.types": "none", "backend_sampling": False, "lora": []}
#: Of those, the ones that switch a sampler on: accepted only at their "off" value (the others are then unused).
SWITCHES: dict[str, Callable[[Any], bool]] = {
    "dynatemp_range": lambda v: v <= 0, "top_n_sigma": lambda v: v <= 0, "xtc_probability": lambda v: v <= 0,
    "typical_p": lambda v: v >= 1, "dry_multiplier": lambda v: v == 0, "mirostat": lambda v: v == 0,
    "post_sampling_probs": lambda v: v is False}

_NUM = params.FLT_MAX
#: /completion's body: field -> Field (kwarg "": the field's own name; the handler reads them itself).
COMPLETION: dict[str, params.Field] = {
    "prompt": _f("string or array", required=True), "n_predict": _f("integer", lo=-1, hi=INT32_MAX),
    "max_tokens": _f("integer", lo=-1, hi=INT32_MAX), "temperature": _f("number", lo=-_NUM, hi=_NUM),
    "top_k": _f("integer", lo=-INT32_MAX, hi=INT32_MAX), "top_p": _f("number", lo=0, hi=1),
    "min_p": _f("number", lo=0, hi=1), "seed": _f("integer", lo=-1, hi=UINT64_MAX),
    "repeat_penalty": _f("number", lo=0, hi=_NUM), "repeat_last_n": _f("integer", lo=-1, hi=INT32_MAX),
    "presence_penalty": _f("number", lo=-_NUM, hi=_NUM), "frequency_penalty": _f("number", lo=-_NUM, hi=_NUM),
    "stop": _f("string or array of strings"), "stream": _f("boolean"), "n_probs": _f("integer", lo=0, hi=100),
    "cache_prompt": _f("boolean"), "id_slot": _f("integer", lo=-1, hi=INT32_MAX), "return_tokens": _f("boolean"),
    "timings_per_token": _f("boolean"), "ignore_eos": _f("boolean"), "n_keep": _f("integer", lo=-1, hi=INT32_MAX),
    "samplers": _f("string or array of strings"), "json_schema": _f("object"), "grammar": _f("string"),
    "t_max_predict_ms": _f("integer", lo=0, hi=INT32_MAX), "logit_bias": _f("array or object"),
    "response_fields": _f("array of strings"), "model": _f("string", None), "return_progress": _f("boolean"),
    **{name: _f("number" if isinstance(v, float) else "boolean" if isinstance(v, bool) else "integer",
                lo=-_NUM, hi=_NUM) if not isinstance(v, bool) else _f("boolean") for name, v in NEUTRAL.items()},
}


def llamacpp_error(exc: ApiError) -> Response:
    """exc as llama-server's error object: {"error": {"code", "message", "type"}} with its status."""
    kind = "exceed_context_size_error" if exc.code == "context_length_exceeded" else exc.type
    body = {"error": {"code": exc.status, "message": exc.message, "type": kind}}
    return Response(json.dumps(body, ensure_ascii=True), status_code=exc.status, media_type="application/json")


def _as_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    return ApiError(400, str(exc))


@dataclass
class Context:
    """What the llama.cpp routes share with the app: the model, the slots, the body reader, the names, the defaults
    (--temp, --seed, -n: server-wide, a request's own fields override them)."""

    llm: Any
    pool: Any
    read_body: Callable[[Request, Mapping[str, params.Field]], Awaitable[dict[str, Any]]]
    model_name: str
    check_key: Callable[[Request], None] | None = None  # the API key check (--api-key), if any
    defaults: dict[str, Any] = field(default_factory=dict)
    started: int = field(default_factory=lambda: int(time.time()))
    metrics: bool = False  # GET /metrics (--metrics)
    slots: bool = True  # GET /slots (--no-slots: off)
    slot_save_path: str | None = None  # the folder of POST /slots/{id}?action=save|restore (--slot-save-path)
    reranking: bool = False  # POST /rerank and its aliases (--reranking, --pooling rank)


def _prompt_ids(llm: Any, prompt: Any) -> list[int]:
    """llama.cpp's prompt forms as ids: text, ids, or one list mixing texts and ids (tokenize_mixed)."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool))
                                          for p in prompt):
        if len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
            raise ApiError(400, f"expected one prompt (a text, token ids, or texts and ids mixed), found "
                                f"{len(prompt)} texts: send one request per prompt", param="prompt")
        items = prompt
    else:
        raise ApiError(400, "expected 'prompt' as a string, a list of token ids, or a list mixing strings and token "
                            f"ids, found {params._short(prompt)}", param="prompt")
    ids: list[int] = []
    for k, item in enumerate(items):
        if isinstance(item, str):
            ids += llm.tokenizer.encode(item, add_special=k == 0, parse_special=True)
        else:
            if not 0 <= item < llm.tokenizer.n_vocab:
                raise ApiError(400, f"expected token ids from 0 to {llm.tokenizer.n_vocab - 1} in 'prompt', found "
                                    f"{params._short(item)}", param="prompt")
            ids.append(item)
    if not ids:
        raise ApiError(400, "expected a prompt of at least one token, found none", param="prompt")
    return ids


def _logit_bias(llm: Any, bias: Any) -> dict[int, float]:
    """llama.cpp's logit_bias forms: [[id or text, bias or false], ...] or {"id or text": bias or false}; a text's
    every token gets the bias; false bans."""
    pairs = bias.items() if isinstance(bias, dict) else bias
    out: dict[int, float] = {}
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise ApiError(400, f"expected each 'logit_bias' entry as [token id or text, bias or false], found "
                                f"{params._short(pair)}", param="logit_bias")
        key, value = pair
        if value is False:
            value = -math.inf
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ApiError(400, f"expected a 'logit_bias' bias as a finite number or false, found "
                                f"{params._short(value)}", param="logit_bias")
        if isinstance(key, str) and not (isinstance(bias, dict) and key.lstrip("-").isdigit()):
            ids = llm.tokenizer.encode(key, add_special=False, parse_special=False)
        elif isinstance(key, int | str) and not isinstance(key, bool):
            ids = [int(key)]
        else:
            raise ApiError(400, f"expected a 'logit_bias' token as an id or a text, found {params._short(key)}",
                           param="logit_bias")
        for i in ids:
            if 0 <= i < llm.tokenizer.n_vocab:
                out[i] = float(value)
    return out


def _samplers(names: Any) -> dict[str, Any]:
    """The settings that turn off the samplers `samplers` leaves out; ApiError for an unknown name or an order of
    minillama's samplers other than llama.cpp's default."""
    if isinstance(names, str):  # llama.cpp's short form: one letter each
        bad = next((c for c in names if c not in _LETTERS), None)
        if bad is not None:
            raise ApiError(400, f"expected 'samplers' letters from {''.join(_LETTERS)}, found {bad!r}",
                           param="samplers")
        names = [_LETTERS[c] for c in names]
    aliases = {"typical_p": "typ_p", "top-k": "top_k", "top-p": "top_p", "min-p": "min_p", "nucleus": "top_p",
               "typical": "typ_p", "temp": "temperature", "top-n-sigma": "top_n_sigma"}
    names = [aliases.get(n, n) for n in names]
    bad = next((n for n in names if n not in SAMPLERS), None)
    if bad is not None:
        raise ApiError(400, f"expected 'samplers' names from {', '.join(SAMPLERS)}, found {bad!r}", param="samplers")
    ours = [n for n in names if n in _OFF]
    if ours != sorted(ours, key=SAMPLERS.index) or len(set(ours)) != len(ours):
        raise ApiError(400, f"expected 'samplers' in llama.cpp's default order ({', '.join(SAMPLERS)}; minillama "
                            f"runs them in that order), found {', '.join(names)}", param="samplers")
    off: dict[str, Any] = {}
    for name, settings in _OFF.items():
        if name not in ours:
            off.update(settings)
    return off


@dataclass
class _Call:
    """One /completion request, read and checked: the Request to run and how to answer."""

    ids: list[int]
    request: GenRequest
    settings: dict[str, Any]
    n_probs: int
    return_tokens: bool
    timings_per_token: bool
    t_max_ms: int
    stream: bool


def _read_call(ctx: Context, body: dict[str, Any]) -> _Call:
    llm = ctx.llm
    for name, off in SWITCHES.items():
        if name in body and not off(body[name]):
            raise ApiError(400, f"expected '{name}' at {NEUTRAL[name]!r} (minillama has no such sampler), found "
                                f"{params._short(body[name])}", param=name)
    kw = {**ctx.defaults, **body}
    ids = _prompt_ids(llm, kw["prompt"])
    n_predict = kw.get("n_predict", kw.get("max_tokens", -1))
    settings = {"temperature": kw.get("temperature", 0.8), "top_k": kw.get("top_k", 40),
                "top_p": kw.get("top_p", 0.95), "min_p": kw.get("min_p", 0.05),
                "repeat_penalty": kw.get("repeat_penalty", 1.0), "repeat_last_n": kw.get("repeat_last_n", 64),
                "presence_penalty": kw.get("presence_penalty", 0.0),
                "frequency_penalty": kw.get("frequency_penalty", 0.0)}
    settings["temperature"] = max(settings["temperature"], 0.0)  # llama.cpp: <= 0 is greedy
    settings["top_k"] = max(settings["top_k"], 0)  # <= 0: all
    if "samplers" in kw:
        settings.update(_samplers(kw["samplers"]))
    n_probs = kw.get("n_probs", 0)
    bias = _logit_bias(llm, kw["logit_bias"]) if "logit_bias" in kw else {}
    if kw.get("ignore_eos", False):  # as llama-server: the end-of-generation ids are banned
        from ..constrain import _eog_ids

        bias.update({i: -math.inf for i in sorted(_eog_ids(llm.tokenizer))})
    sampling = llm._sampling(seed=kw.get("seed"), logit_bias=bias, n_probs=n_probs, **settings)
    limit = llm.n_ctx if n_predict < 0 else max(n_predict, 1)  # llama-server's first token comes with the prompt
    constraint = None
    if "grammar" in kw and "json_schema" in kw:
        raise ApiError(400, "expected either 'grammar' or 'json_schema', found both", param="grammar")
    if kw.get("grammar"):
        constraint = _gbnf(llm, kw["grammar"])
    elif "json_schema" in kw:
        constraint = JsonConstraint(llm.tokenizer, kw["json_schema"])
    request = GenRequest(ids, limit, sampling, stop=kw.get("stop") or (), constraint=constraint,
                         stop_at_eog=not kw.get("ignore_eos", False), n_keep=kw.get("n_keep", 0))
    shown = {**settings, "seed": sampling.seed, "n_predict": n_predict, "max_tokens": n_predict,
             "n_keep": kw.get("n_keep", 0), "ignore_eos": kw.get("ignore_eos", False),
             "stream": kw.get("stream", False), "n_probs": n_probs, "grammar": kw.get("grammar", ""),
             "stop": [kw["stop"]] if isinstance(kw.get("stop"), str) else list(kw.get("stop") or []),
             "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": i} for i, b in bias.items()],
             "samplers": _sampler_names(kw.get("samplers")),
             "timings_per_token": kw.get("timings_per_token", False)}
    return _Call(ids, request, shown, n_probs, kw.get("return_tokens", False), kw.get("timings_per_token", False),
                 kw.get("t_max_predict_ms", 0), kw.get("stream", False))


def _sampler_names(given: Any) -> list[str]:
    """generation_settings' samplers: the names given (a string's letters spelt out), else llama.cpp's default."""
    if given is None:
        return list(SAMPLERS)
    return [_LETTERS[c] for c in given] if isinstance(given, str) else list(given)


def _gbnf(llm: Any, grammar: str) -> JsonConstraint:
    """A GBNF grammar (llama.cpp's) as a constraint, through llguidance's converter."""
    try:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        lark = gbnf_to_lark(grammar)
    except ImportError:
        raise ApiError(400, "expected the llguidance package for 'grammar', found it not installed") from None
    except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions for bad grammars
        raise ApiError(400, f"expected 'grammar' as a GBNF grammar, found one that does not parse: {exc}",
                       param="grammar") from None
    try:
        return JsonConstraint(llm.tokenizer, None, lark=lark)
    except ArgumentError as exc:
        raise ApiError(400, f"expected 'grammar' as a GBNF grammar llguidance can enforce: {exc}",
                       param="grammar") from None


_STOP_TYPES = {"eog": "eos", "stop_string": "word", "max_tokens": "limit", "context": "limit", "stopped": "none"}


def _probs(llm: Any, run: Any, start: int, end: int, n: int) -> list[dict[str, Any]]:
    """completion_probabilities of the generated ids start..end: each id, its text, bytes and log-probability, and
    its n best alternatives (llama.cpp's probs_to_json without post_sampling_probs)."""
    def entry(i: int, logprob: float) -> dict[str, Any]:
        piece = llm.tokenizer.token_to_piece(i)
        return {"id": i, "token": token_text(piece), "bytes": list(piece), "logprob": logprob}

    return [{**entry(lp.id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top[:n]]}
            for lp in run.logprobs[start:end]]


def _stopping_word(run: Any) -> str:
    """The stop string that ended run (the first of them found right after the reply's text)."""
    if run.stats.stop_reason != "stop_string":
        return ""
    rest = run.tok.decode(run.ids)[len(run.text):]
    return next((s for s in run.request.stop if rest.startswith(s)), "")


def routes(ctx: Context) -> list[tuple[str, Callable[[Request], Awaitable[Response]], str]]:
    """The llama.cpp routes: (path, handler, method); each handler answers errors in llama.cpp's shape and checks
    the API key itself."""
    llm, pool = ctx.llm, ctx.pool

    def slot_of(s: Any) -> int:
        session = getattr(s, "_session", None)
        return next((k for k, x in enumerate(pool.caches.sessions) if x is session), 0)

    def final(call: _Call, run: Any, s: Any, content: str) -> dict[str, Any]:
        stats = run.stats
        out = {"index": 0, "content": content, "tokens": list(run.reply) if call.return_tokens and not call.stream
               else [], "id_slot": slot_of(s), "stop": True, "model": ctx.model_name,
               "tokens_predicted": stats.generated_tokens, "tokens_evaluated": len(call.ids),
               "generation_settings": {**call.settings, **NEUTRAL, **SHOWN, "seed": stats.seed}, "prompt": llm.tokenizer.decode(call.ids),
               "has_new_line": "\n" in run.text, "truncated": stats.stop_reason == "context" or stats.shifts > 0,
               "stop_type": _STOP_TYPES.get(stats.stop_reason, "none"), "stopping_word": _stopping_word(run),
               "tokens_cached": len(call.ids) + stats.generated_tokens - 1, "timings": s.timings()}
        if call.n_probs and not call.stream:
            out["completion_probabilities"] = _probs(llm, run, 0, len(run.logprobs), call.n_probs)
        return out

    def chunks(call: _Call, s: Any) -> Iterator[dict[str, Any]]:
        """The run's llama-server events: one per piece of text (with its new ids), then the final one."""
        s.shown = call.settings  # for /slots
        run = llm.run(call.request, s)
        first: float | None = None
        done_ids = done_probs = 0
        try:
            for text in run:
                now = time.perf_counter()
                first = first if first is not None else now
                if call.stream:
                    event = {"index": 0, "content": text, "tokens": run.ids[done_ids:], "stop": False, "id_slot": -1,
                             "tokens_predicted": run.stats.generated_tokens, "tokens_evaluated": len(call.ids)}
                    if call.timings_per_token:
                        event["timings"] = s.timings()
                    if call.n_probs:
                        event["completion_probabilities"] = _probs(llm, run, done_probs, len(run.ids), call.n_probs)
                        done_probs = len(run.ids)
                    done_ids = len(run.ids)
                    yield event
                if call.t_max_ms and (now - first) * 1000 > call.t_max_ms and "\n" in run.text:
                    run.close()
                    run.stats.stop_reason = "max_tokens"
                    break
            yield final(call, run, s, "" if call.stream else run.text)
        finally:
            run.close()

    async def completion(request: Request) -> Response:
        try:
            if ctx.check_key is not None:
                ctx.check_key(request)
            return await completion_of(request, await ctx.read_body(request, COMPLETION))
        except (ApiError, MinillamaError) as exc:
            return llamacpp_error(_as_api_error(exc))

    async def completion_of(request: Request, body: dict[str, Any]) -> Response:
        """body (read and checked) run as a /completion: one answer, or its events streamed."""
        try:
            call = _read_call(ctx, body)
            if not call.stream:
                try:
                    result = await pool.call("completion", lambda s: list(chunks(call, s))[-1],
                                             request.is_disconnected)
                except ClientGone:
                    return Response(status_code=499)
                return JSONResponse(result)

            # the pool sets the slot's cancel flag when the client leaves: no model step is asked for after it
            events = pool.stream("completion", lambda s: chunks(call, s))
            first = await first_of(events)
            return EventStream(_sse(first, events), events.aclose)
        except (ApiError, MinillamaError) as exc:
            return llamacpp_error(_as_api_error(exc))

    async def infill(request: Request) -> Response:
        """llama-server's /infill: the FIM prompt built from input_prefix, input_suffix and input_extra
        (infill_ids), then a /completion."""
        try:
            if ctx.check_key is not None:
                ctx.check_key(request)
            missing = "".join(f"{what} token is missing. " for what, key in (("prefix", "fim_pre"),
                              ("suffix", "fim_suf"), ("middle", "fim_mid")) if llm.tokenizer.vocab.special.get(key) is None)
            if missing:
                raise ApiError(501, f"Infill is not supported by this model: {missing}", type="not_supported_error")
            body = await ctx.read_body(request, INFILL)
            ids = infill_ids(llm, body, ctx.defaults.get("n_predict", -1))
            body = {k: v for k, v in body.items() if k not in ("input_prefix", "input_suffix", "input_extra")}
            return await completion_of(request, {**body, "prompt": ids})
        except (ApiError, MinillamaError) as exc:
            return llamacpp_error(_as_api_error(exc))

    def native(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """handler with the API key check and its errors in llama.cpp's shape."""
        async def run(request: Request) -> Response:
            try:
                if ctx.check_key is not None:
                    ctx.check_key(request)
                return await handler(request)
            except (ApiError, MinillamaError) as exc:
                return llamacpp_error(_as_api_error(exc))

        return run

    async def apply_template(request: Request) -> Response:
        body = await ctx.read_body(request, APPLY_TEMPLATE)
        return JSONResponse({"prompt": render_chat(llm, body["messages"])})

    async def embedding(request: Request) -> Response:
        body = await ctx.read_body(request, EMBEDDING)
        content = body["content"]
        items = [content] if isinstance(content, str) or (content and all(isinstance(i, int) for i in content)) \
            else content
        ids = [_prompt_ids(llm, item) for item in items]

        def run(s: Any) -> list[dict[str, Any]]:
            out = []
            for k, one in enumerate(ids):
                s.check()
                out.append({"index": k, "embedding": llm.embed([one])})  # pooled: one vector, in a list
            return out

        try:
            return JSONResponse(await pool.call("embedding", run, request.is_disconnected))
        except ClientGone:
            return Response(status_code=499)

    async def rerank(request: Request) -> Response:
        """llama-server's /rerank: each document's relevance to the query (Llama.rank), best first; Jina's shape
        ({model, object, usage, results: [{index, relevance_score}]}), or TEI's (a list of {index, score, text?})
        when the body names its documents `texts`."""
        if not ctx.reranking:
            raise ApiError(501, "This server does not support reranking. Start it with `--reranking`",
                           type="not_supported_error")
        body = await ctx.read_body(request, RERANK)
        if "query" not in body:
            raise ApiError(400, '"query" must be provided: expected a string, found no \'query\'', param="query")
        documents = body.get("documents", body.get("texts", []))
        if not documents:
            raise ApiError(400, '"documents" must be a non-empty string array: expected at least one document, '
                                "found none", param="documents")

        def run(s: Any) -> tuple[list[float], int]:
            """Each pair's prompt encoded and scored; a client that leaves stops it between documents."""
            scores, n_tokens = [], 0
            for document in documents:
                s.check()
                ids = llm.rerank_ids(body["query"], document)
                n_tokens += len(ids)
                scores.append(llm.rank_ids(ids))
            return scores, n_tokens

        try:
            scores, n_tokens = await pool.call("rerank", run, request.is_disconnected)
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse(rerank_results(body, scores, documents, n_tokens, ctx.model_name))

    async def props(request: Request) -> Response:
        if request.method == "POST":
            raise ApiError(501, "This server does not support changing global properties (as llama-server without "
                                "--props)", type="not_supported_error")
        tok = llm.tokenizer
        template = llm._chat_template()
        return JSONResponse({
            "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": llm.n_ctx, "is_processing": False,
                                            "params": {**SHOWN, **NEUTRAL, **DEFAULTS, **ctx.defaults}},
            "total_slots": len(pool.slots), "model_alias": ctx.model_name, "model_path": ctx.model_name,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_props": False, "endpoint_metrics": ctx.metrics, "endpoint_slots": ctx.slots,
            "chat_template": template.source if template is not None else "",
            "bos_token": tok.token_to_piece(tok.bos_id).decode("utf-8", "replace") if tok.bos_id is not None else "",
            "eos_token": tok.token_to_piece(tok.eos_id).decode("utf-8", "replace") if tok.eos_id is not None else "",
            "build_info": "minillama", "is_sleeping": False})

    async def metrics(request: Request) -> Response:
        if not ctx.metrics:
            raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                           type="not_supported_error")
        text = prometheus(pool.metrics, busy=pool.busy, waiting=pool.waiting)
        return Response(text, media_type="text/plain; version=0.0.4",
                        headers={"Process-Start-Time-Unix": str(ctx.started)})

    async def slots(request: Request) -> Response:
        if not ctx.slots:
            raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`",
                           type="not_supported_error")
        if request.query_params.get("fail_on_no_slot") and pool.busy == len(pool.slots):
            raise ApiError(503, "no slot available", type="unavailable_error")
        return JSONResponse([slot_json(k) for k in range(len(pool.slots))])

    def slot_json(k: int) -> dict[str, Any]:
        """llama-server's entry for slot k (its KV cache k and the last request that ran on it)."""
        busy = bool(pool.slots[k].task)
        out: dict[str, Any] = {"id": k, "n_ctx": llm.n_ctx, "speculative": False, "is_processing": busy}
        if k in pool.last:
            task, run = pool.last[k]
            gen = run.generation
            out.update({"id_task": task, "n_prompt_tokens": len(pool.caches.sessions[k].cached_ids),
                        "n_prompt_tokens_processed": run.prompt_n - run.cache_n, "n_prompt_tokens_cache": run.cache_n,
                        "params": slot_params(run),
                        "next_token": [{"has_next_token": busy, "has_new_line": gen is not None and "\n" in gen.text,
                                        "n_remain": -1, "n_decoded": run.predicted_n}]})
        return out

    async def slot_action(request: Request) -> Response:
        if ctx.slot_save_path is None:
            raise ApiError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                           type="not_supported_error")
        given = request.path_params["id_slot"]
        if not (given.isascii() and given.lstrip("-").isdigit()) or not 0 <= int(given) < len(pool.slots):
            raise ApiError(400, f"Invalid slot ID: expected a slot from 0 to {len(pool.slots) - 1}, found "
                                f"{params._short(given)}", param="id_slot")
        k = int(given)
        action = request.query_params.get("action", "")
        if action == "erase":
            def erase(session: Any) -> dict[str, Any]:
                n = len(session.cached_ids)
                session.reset()
                return {"id_slot": k, "n_erased": n}

            return await on_cache("slot erase", k, erase, request)
        if action not in ("save", "restore"):
            raise ApiError(400, f"Invalid action: expected ?action=save, restore or erase, found "
                                f"{params._short(action)}", param="action")
        body = await ctx.read_body(request, SLOT_ACTION)
        name = body["filename"]
        if not valid_filename(name):
            raise ApiError(400, f"Invalid filename: expected a file name without directory parts (no /, \\ or ..) "
                                f"nor reserved characters, found {params._short(name)}", param="filename")
        path = os.path.join(ctx.slot_save_path, name)

        def save(session: Any) -> dict[str, Any]:
            start = time.perf_counter()
            n_bytes = save_cache(session, path)
            return {"id_slot": k, "filename": name, "n_saved": len(session.cached_ids), "n_written": n_bytes,
                    "timings": {"save_ms": 1000 * (time.perf_counter() - start)}}

        def restore(session: Any) -> dict[str, Any]:
            start = time.perf_counter()
            try:
                n, n_bytes = load_cache(session, path, llm.tokenizer.n_vocab, llm.n_ctx)
            except (OSError, ValueError) as exc:
                session.reset()  # as llama-server: a failed restore leaves the slot empty
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ApiError(400, f"Unable to restore slot: {why} ({name})", param="filename") from None
            return {"id_slot": k, "filename": name, "n_restored": n, "n_read": n_bytes,
                    "timings": {"restore_ms": 1000 * (time.perf_counter() - start)}}

        return await on_cache(f"slot {action}", k, save if action == "save" else restore, request)

    async def on_cache(task: str, k: int, fn: Callable[[Any], dict[str, Any]], request: Request) -> Response:
        try:
            return JSONResponse(await pool.on_cache(task, k, fn, request.is_disconnected))
        except ClientGone:
            return Response(status_code=499)

    return [("/completion", completion, "POST"), ("/completions", completion, "POST"),
            ("/infill", infill, "POST"), ("/apply-template", native(apply_template), "POST"),
            ("/embedding", native(embedding), "POST"),
            ("/props", native(props), "GET"), ("/props", native(props), "POST"),
            ("/metrics", native(metrics), "GET"), ("/slots", native(slots), "GET"),
            ("/slots/{id_slot}", native(slot_action), "POST")] + [
            (path, native(rerank), "POST") for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")]


#: The keys of a slot's `params` in llama-server's /slots (task_params::to_json with only_metrics), in its order.
SLOT_PARAMS = ("seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
               "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
               "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
               "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "max_tokens",
               "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "n_probs", "min_keep", "chat_format",
               "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers", "speculative.types",
               "timings_per_token", "post_sampling_probs", "backend_sampling", "lora")


def slot_params(run: Any) -> dict[str, Any]:
    """A run's settings as llama-server's /slots shows them: a /completion's own, or those of an OpenAI route's
    request (its sampling and max_tokens)."""
    shown = {**SHOWN, **NEUTRAL, **DEFAULTS}
    gen = run.generation
    if run.shown is not None:
        shown.update(run.shown)
    elif gen is not None:
        sp = gen.request.sampling
        shown.update({name: getattr(sp, name) for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                                                            "repeat_last_n", "presence_penalty", "frequency_penalty",
                                                            "n_probs")})
        shown["n_predict"] = shown["max_tokens"] = gen.request.max_tokens
    if gen is not None:
        shown["seed"] = gen.stats.seed
    return {name: shown[name] for name in SLOT_PARAMS}


#: /metrics' series: (name, help, type, value from the counts), llama-server's names (server_task_result_metrics).
_SERIES: tuple[tuple[str, str, str, Callable[[Any, int, int], float]], ...] = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", "counter",
     lambda m, b, w: m.prompt_n),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", "counter",
     lambda m, b, w: m.cache_n),
    ("prompt_seconds_total", "Total time spent processing prompts", "counter", lambda m, b, w: m.prompt_s),
    ("tokens_predicted_total", "Number of generation tokens processed", "counter", lambda m, b, w: m.predicted_n),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens", "counter",
     lambda m, b, w: m.predicted_s),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
     "counter", lambda m, b, w: m.n_decode),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)", "counter",
     lambda m, b, w: m.n_tokens_max),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", "counter", lambda m, b, w: 0),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
     "counter", lambda m, b, w: 0),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", "counter",
     lambda m, b, w: 0),
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", "gauge",
     lambda m, b, w: m.bucket[0] / m.bucket[1] if m.bucket[1] else 0),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s", "gauge",
     lambda m, b, w: m.bucket[2] / m.bucket[3] if m.bucket[3] else 0),
    ("requests_processing", "Number of requests processing", "gauge", lambda m, b, w: b),
    ("requests_deferred", "Number of requests deferred", "gauge", lambda m, b, w: w),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", "gauge",
     lambda m, b, w: m.busy_sum / max(m.n_decode, 1)),
)


def prometheus(metrics: Any, busy: int, waiting: int) -> str:
    """llama-server's /metrics text (Prometheus' text format 0.0.4, its `llamacpp:` names); the throughput gauges
    cover the time since the last scrape, as there (the bucket starts again)."""
    lines = []
    for name, text, kind, value in _SERIES:
        v = float(value(metrics, busy, waiting))
        lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {int(v) if v.is_integer() else f'{v:.6g}'}"]
    metrics.bucket[:] = [0, 0.0, 0, 0.0]
    return "\n".join(lines) + "\n"


#: The /completion defaults llama-server shows in /props (a request's fields and the server's flags override them).
DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
                            "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": -1,
                            "n_predict": -1, "max_tokens": -1, "timings_per_token": False, "n_keep": 0, "ignore_eos": False, "stream": False, "n_probs": 0,
                            "grammar": "", "stop": [], "logit_bias": [], "samplers": list(SAMPLERS)}
#: /infill's body: /completion's, the prompt optional (a text put after the prefix), and the FIM parts.
INFILL: dict[str, params.Field] = {**COMPLETION, "prompt": _f("string"),
                                   "input_prefix": _f("string or array", required=True),
                                   "input_suffix": _f("string or array", required=True),
                                   "input_extra": _f("array")}  # of {filename, text}: infill_ids checks each
#: llama-server's logical batch (-b, 2048 by default): /infill keeps the prefix and suffix to fit in one.
N_BATCH = 2048


def infill_ids(llm: Any, body: Mapping[str, Any], n_predict: int) -> list[int]:
    """The FIM prompt as llama-server builds it (format_prompt_infill, the repo-level pattern): [FIM_REP]myproject
    and each extra chunk after [FIM_SEP]filename (or a "--- snippet ---" line where the vocab has no FIM_SEP), then
    [FIM_SEP]filename, [BOS], [FIM_PRE] the prefix's last 3/4 batch tokens and the prompt, [FIM_SUF] as much of the
    suffix as fits the batch's last quarter, [FIM_MID]; the extra chunks' last tokens that fit n_ctx - n_batch -
    2 n_predict."""
    tok, special = llm.tokenizer, llm.tokenizer.vocab.special

    def mixed(value: Any, what: str) -> list[int]:
        if isinstance(value, str):
            return tok.encode(value, add_special=False, parse_special=False)
        if isinstance(value, list) and all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
                                           for v in value):
            out: list[int] = []
            for v in value:
                if isinstance(v, int) and not 0 <= v < tok.n_vocab:
                    raise ApiError(400, f"expected token ids from 0 to {tok.n_vocab - 1} in '{what}', found {v}",
                                   param=what)
                out += tok.encode(v, add_special=False, parse_special=False) if isinstance(v, str) else [v]
            return out
        raise ApiError(400, f"expected '{what}' as a string or a list of strings and token ids, found "
                            f"{params._short(value)}", param=what)

    def plain(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=False)

    prefix, suffix = mixed(body["input_prefix"], "input_prefix"), mixed(body["input_suffix"], "input_suffix")
    prompt = tok.encode(body.get("prompt", ""), add_special=False, parse_special=True) if body.get("prompt") else []
    extra: list[int] = []
    if special.get("fim_rep") is not None:
        extra += [special["fim_rep"], *plain("myproject\n")]
    for k, chunk in enumerate(body.get("input_extra") or []):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, 'extra_context chunk must contain a "text" field with a string value',
                           param=f"input_extra[{k}]")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError(400, 'extra_context chunk\'s "filename" field must be a string', param=f"input_extra[{k}]")
        if special.get("fim_sep") is not None:
            extra += [special["fim_sep"], *plain(chunk.get("filename", "tmp") + "\n")]
        else:
            extra += plain("\n\n--- snippet ---\n\n")
        extra += plain(chunk["text"])
    if special.get("fim_sep") is not None:
        extra += [special["fim_sep"], *plain("filename\n")]
    n_prefix = min(len(prefix), 3 * (N_BATCH // 4))
    n_suffix = min(len(suffix), max(0, N_BATCH // 4 - (2 + len(prompt))))
    n_extra = min(max(0, llm.n_ctx - N_BATCH - 2 * n_predict), len(extra))
    head = [special["fim_pre"], *prefix[len(prefix) - n_prefix:], *prompt]
    if tok.vocab.add_bos and special.get("bos") is not None:
        head.insert(0, special["bos"])
    return [*extra[len(extra) - n_extra:], *head, special["fim_suf"], *suffix[:n_suffix], special["fim_mid"]]


#: /rerank's body: Jina's fields (query, documents, top_n), or TEI's (texts, return_text), as llama-server reads them.
RERANK: dict[str, params.Field] = {"query": _f("string"), "documents": _f("array of strings"),
                                   "texts": _f("array of strings"), "top_n": _f("integer", lo=0, hi=INT32_MAX),
                                   "return_text": _f("boolean"), "model": _f("string")}


def rerank_results(body: Mapping[str, Any], scores: list[float], documents: list[str], n_tokens: int,
                   model_name: str) -> Any:
    """llama-server's /rerank answer (format_response_rerank): the documents' indexes and scores, best first, the
    first top_n of them (default: all); in TEI's form (the body gave `texts`) a bare list, each with its `text` when
    return_text is true, else Jina's object with the model (the request's, else the server's) and the tokens."""
    tei = "texts" in body
    label = "score" if tei else "relevance_score"
    results = [{"index": i, label: score} for i, score in enumerate(scores)]
    if tei and body.get("return_text", False):
        for r in results:
            r["text"] = documents[r["index"]]
    results.sort(key=lambda r: -r[label])
    results = results[:body.get("top_n", len(results))]
    if tei:
        return results
    return {"model": body.get("model", model_name), "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}


APPLY_TEMPLATE: dict[str, params.Field] = {"messages": _f("array of messages {role, content}", required=True),
                                           "model": _f("string", None)}
SLOT_ACTION: dict[str, params.Field] = {"filename": _f("string", required=True)}
EMBEDDING: dict[str, params.Field] = {"content": _f("string, array of strings or array of token ids or arrays",
                                                    required=True), "model": _f("string", None)}


def render_chat(llm: Any, messages: Any) -> str:
    """messages rendered with the model's chat template and the generation prompt (llama-server's
    /apply-template: the text /completion would then continue)."""
    from ..api import _flat_message
    from ..errors import ChatTemplateError

    template = llm._chat_template()
    if template is None:
        raise ChatTemplateError("the model file has no tokenizer.chat_template to render messages with")
    return template.render([_flat_message(m, i) for i, m in enumerate(messages)], add_generation_prompt=True)


def _event(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8", "backslashreplace") + b"\n\n"


async def _sse(first: Any, events: Any) -> Any:
    """llama-server's /completion stream: `data: {...}` per event, no [DONE]; an error midway as its error object."""
    try:
        if first is not None:
            yield _event(first)
        async for e in events:
            yield _event(e)
    except (ApiError, MinillamaError) as exc:
        err = _as_api_error(exc)
        yield _event({"error": {"code": err.status, "message": err.message, "type": err.type}})
