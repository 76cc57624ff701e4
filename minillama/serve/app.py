"""The routes of `minillama serve`: OpenAI's /v1 endpoints, llama.cpp's /tokenize and /detokenize, /health, /slots
and the token playground at /, as a Starlette app over minillama.api.Llama.

The app is a thin layer: it reads the body (at most MAX_BODY bytes, counted while reading), checks its fields
against the endpoint's table (minillama/serve/params.py), hands them to the Llama's session in a slot
(minillama/serve/slots.py) and sends the API's dicts back, streamed ones as server-sent events
(`data: {...}` blocks ending in `data: [DONE]`). Every error is OpenAI's error object with its status (400, 401,
404, 413, 500), never a traceback; a 500 is logged with its traceback on the server's side only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import ContextLengthError, MinillamaError
from . import anthropic, params, responses, sse
from .limits import EMBEDDING_MAX_INPUTS, EMBEDDING_MAX_TOKENS
from .params import ApiError
from .slots import ClientGone, SlotPool

__all__ = ["create_app", "MAX_BODY", "TOKENIZE_MAX_PIECES", "TOKENIZE_AT_ONCE"]

log = logging.getLogger("minillama.serve")

#: The largest request body read (4 MiB, far above any prompt the context holds): larger ones get 413.
MAX_BODY = 4 << 20

#: Most tokens /tokenize answers with pieces (each costs ~270 bytes while the answer is built; ids alone are cheap).
TOKENIZE_MAX_PIECES = 1 << 17
#: /tokenize and /detokenize requests run at once (outside the slots; more wait, their bodies not yet read).
TOKENIZE_AT_ONCE = 2

#: The completions' system_fingerprint (OpenAI's field; llama-server puts its build there).
FINGERPRINT = f"minillama-{__version__}"

#: Endpoints anyone may call when --api-key is set, as llama.cpp's server keeps them public.
PUBLIC = frozenset({"/", "/health", "/v1/models", "/models"})

Handler = Callable[[Request], Awaitable[Response]]


def create_app(llm: Any, *, parallel: int = 1, api_key: str | None = None,
               vocabs: Mapping[str, Any] | None = None, model_name: str = "minillama",
               max_body: int = MAX_BODY, embedding_max_inputs: int = EMBEDDING_MAX_INPUTS,
               embedding_max_tokens: int = EMBEDDING_MAX_TOKENS, cache_bytes: int = 0,
               request_log: Callable[[str], None] | None = None, reasoning_format: str = "auto",
               server_defaults: Mapping[str, Any] | None = None, metrics: bool = False, slots: bool = True,
               slot_save_path: str | None = None, reasoning_budget: int = -1,
               reasoning_budget_message: str = "", reranking: bool = False) -> Starlette:
    """The server's ASGI app for one loaded model.

    llm: a minillama.api.Llama; each of the `parallel` slots gets its own session (llm.session(): a KV cache of
    its own, its single-token steps batched with the other sessions' by the model's StepBatcher), which every
    request run in that slot uses (session=).
    vocabs: path -> Tokenizer, the tokenizers /tokenize and the playground offer (the model's own first); the
    page names each by its file name (never its path), and /tokenize's `vocab` takes either.
    embedding_max_inputs, embedding_max_tokens: the most inputs and tokens (all inputs together) per embeddings
    request; more is a 400.
    cache_bytes: the RAM cache of prefixes evicted from the slots, in bytes (--cache-ram; 0: none).
    request_log: given, it gets one line per request (method, route, status, tokens, time: -v).
    reasoning_format: chat's default (--reasoning-format), a request's own overrides it.
    server_defaults: llama.cpp's /completion fields (temperature, seed, n_predict) every request starts from
    (--temp, --seed, -n); metrics, slots, slot_save_path: GET /metrics (--metrics), GET /slots (--no-slots: False),
    the folder of the slot files (--slot-save-path; None: no slot actions), as llama-server's.
    reasoning_budget, reasoning_budget_message: chat's thinking budget in tokens (--reasoning-budget, -1: none) and
    the text forced before the end tag; a request's reasoning_budget_tokens overrides it, except -1 (the default).
    reranking: POST /rerank (and /reranking, /v1/rerank, /v1/reranking) answers (--reranking; llm.pooling "rank").
    """
    pool = SlotPool(llm.session, parallel, cache_bytes)
    llm.model.batcher.expected = lambda: pool.busy  # a decode step waits (briefly) for the other busy slots'
    tokenizers = dict(vocabs or {})
    names = _file_names(list(tokenizers))  # path -> the name the page shows
    by_name = {name: tokenizers[path] for path, name in names.items()}
    tokenizing = asyncio.Semaphore(TOKENIZE_AT_ONCE)
    started = int(time.time())
    chat_defaults: dict[str, Any] = {"reasoning_format": reasoning_format}
    if reasoning_budget != -1:
        chat_defaults["reasoning_budget_tokens"] = reasoning_budget
    if reasoning_budget_message:
        chat_defaults["reasoning_budget_message"] = reasoning_budget_message

    async def read_body(request: Request, fields: Mapping[str, params.Field]) -> dict[str, Any]:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body:
            raise _too_large(int(declared), max_body)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                raise _too_large(len(body), max_body)
        try:
            data = json.loads(body)
        except RecursionError:  # deeper than Python's parser goes: far past params.MAX_DEPTH
            raise params.too_deep_body() from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"expected a JSON body, found bytes that do not parse: {exc}") from None
        return params.api_kwargs(data, fields)

    # -- generation ----------------------------------------------------------------------------------------------

    async def generation(request: Request, fields: Mapping[str, params.Field], task: str,
                         method: str, defaults: Mapping[str, Any] | None = None, api: Any = None) -> Response:
        kwargs = await read_body(request, fields)
        if api is not None:  # /v1/responses, /v1/messages: the body as chat's keywords, the reply converted back
            api = api.convert(kwargs)
            kwargs = api.chat
        if kwargs.get("reasoning_budget_tokens") == -1:  # llama-server's -1: the server's budget
            del kwargs["reasoning_budget_tokens"]
        kwargs = {**(defaults or {}), **kwargs}
        stream = bool(kwargs.pop("stream", False))

        def run(s: Any, **more: Any) -> Any:
            request.state.run = s  # its counts and times: the response's timings, the request log
            return getattr(llm, method)(session=s, **kwargs, **more)

        if not stream:
            try:
                result = await pool.call(task, run, request.is_disconnected)
            except ClientGone:  # nobody to answer: the slot is free, the status is only for the access log
                return Response(status_code=499)
            if api is not None:
                return JSONResponse(api.reply(result, request.state.run))
            return JSONResponse({**result, "system_fingerprint": FINGERPRINT, "timings": request.state.run.timings()})
        chunks = pool.stream(task, lambda s: run(s, stream=True))
        first = await sse.first_of(chunks)
        if api is not None:
            return sse.EventStream(api.events(first, chunks, request.state.run), chunks.aclose)
        if isinstance(first, dict):
            first = {**first, "system_fingerprint": FINGERPRINT}
        return sse.EventStream(_events(first, _with_timings(chunks, request)), chunks.aclose)

    # --temp, --seed, -n: every request's defaults, its own fields override them (llama.cpp's names)
    given = dict(server_defaults or {})
    openai_defaults = {{"n_predict": "max_tokens"}.get(k, k): v for k, v in given.items()}

    async def completions(request: Request) -> Response:
        return await generation(request, params.COMPLETION, "completion", "create_completion", openai_defaults)

    async def chat_completions(request: Request) -> Response:
        return await generation(request, params.CHAT, "chat completion", "create_chat_completion",
                                {**openai_defaults, **chat_defaults})

    async def converted(request: Request) -> Response:  # the agents' APIs, converted onto the chat path
        api = responses if request.url.path == "/v1/responses" else anthropic
        return await generation(request, api.FIELDS, "chat completion", "create_chat_completion",
                                {**openai_defaults, **chat_defaults}, api)

    async def count_tokens(request: Request) -> Response:
        kwargs = anthropic.count_kwargs(await read_body(request, anthropic.COUNT_FIELDS))
        return JSONResponse({"input_tokens": await run_in_threadpool(lambda: llm.count_chat_tokens(**kwargs))})

    async def embeddings(request: Request) -> Response:
        kwargs = await read_body(request, params.EMBEDDING)
        base64 = params.encoding_base64(kwargs.get("encoding_format", "float"))
        given = kwargs["input"]  # text, texts, ids (one input) or lists of ids
        texts = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else given
        if not texts:
            raise ApiError(400, "expected at least one input to embed, found an empty list", param="input")
        if len(texts) > embedding_max_inputs:
            raise ApiError(400, f"expected at most {embedding_max_inputs:,} inputs per request "
                                f"(--embedding-max-inputs), found {len(texts):,}", param="input",
                           code="too_many_inputs")

        def run(s: Any) -> dict[str, Any]:
            """Each input encoded (bounded in total), then embedded; a client that leaves stops it between inputs."""
            inputs, total = [], 0
            for text in texts:
                s.check()
                ids = llm._prompt_ids(text)  # a text as llm.embed encodes it; ids checked against the vocab
                total += len(ids)
                if total > embedding_max_tokens:
                    raise ApiError(400, f"expected at most {embedding_max_tokens:,} tokens over all inputs "
                                        f"(--embedding-max-tokens), found {total:,} or more", param="input",
                                   code="too_many_tokens")
                inputs.append(ids)
            parts = []
            for ids in inputs:
                s.check()
                parts.append(llm.create_embedding(ids))
            return dict(parts[0], data=[dict(p["data"][0], index=i, **params.vector_base64(p["data"][0], base64))
                                        for i, p in enumerate(parts)],
                        usage={"prompt_tokens": total, "total_tokens": total})

        try:
            return JSONResponse(await pool.call("embedding", run, request.is_disconnected))
        except ClientGone:  # nobody to answer: the slot is free, the status is only for the access log
            return Response(status_code=499)

    # -- tokenizers ----------------------------------------------------------------------------------------------

    def tokenizer(name: str | None) -> Any:
        if name is None:  # the first vocab given (serve() gives the model's first), else the model's
            return next(iter(tokenizers.values()), llm.tokenizer)
        tok = by_name.get(name, tokenizers.get(name))
        if tok is None:
            raise ApiError(400, f"expected 'vocab' to be one of {', '.join(map(repr, by_name))}, found {name!r}",
                           param="vocab", code="unknown_vocab")
        return tok

    async def tokenize(request: Request) -> Response:
        async with tokenizing:  # a few at once, each bounded: the body, then the pieces
            kw = await read_body(request, params.TOKENIZE)
            tok = tokenizer(kw.get("vocab"))

            def run() -> dict[str, Any]:
                ids = tok.encode(kw["content"], add_special=kw.get("add_special", False),
                                 parse_special=kw.get("parse_special", True))
                if not kw.get("with_pieces", False):
                    return {"tokens": ids}
                if len(ids) > TOKENIZE_MAX_PIECES:
                    raise ApiError(400, f"expected at most {TOKENIZE_MAX_PIECES:,} tokens with 'with_pieces', found "
                                        f"{len(ids):,} (without pieces, any number)", param="with_pieces",
                                   code="too_many_tokens")
                return {"tokens": [{"id": i, "piece": _piece(tok.token_to_piece(i))} for i in ids]}

            return JSONResponse(await run_in_threadpool(run))

    async def detokenize(request: Request) -> Response:
        async with tokenizing:
            return await _detokenize(request)

    async def _detokenize(request: Request) -> Response:
        kw = await read_body(request, params.DETOKENIZE)
        tok = tokenizer(kw.get("vocab"))
        bad = next((i for i in kw["tokens"] if not 0 <= i < tok.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"expected token ids from 0 to {tok.n_vocab - 1}, found {bad}", param="tokens",
                           code="invalid_token")
        # control tokens shown as their text, as llama.cpp's /detokenize does
        data = await run_in_threadpool(lambda: tok.decode_bytes(kw["tokens"], remove_special=False,
                                                                unparse_special=True))
        return JSONResponse({"content": data.decode("utf-8", "replace")})

    # -- state ---------------------------------------------------------------------------------------------------

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "slots_idle": parallel - pool.busy, "slots_processing": pool.busy,
                             "requests_waiting": pool.waiting})

    model_meta = _model_meta(llm)

    async def models(request: Request) -> Response:
        meta = {**model_meta, "n_ctx": getattr(llm, "n_ctx", None), "pooling": getattr(llm, "pooling", None),
                "slots": parallel}
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": started,
                                                         "owned_by": "minillama", "meta": meta}]})

    async def playground(request: Request) -> Response:
        return HTMLResponse(playground_html(list(names.values())))

    routes = [("/", playground, "GET"), ("/health", health, "GET"),
              ("/v1/models", models, "GET"), ("/v1/completions", completions, "POST"),
              ("/v1/chat/completions", chat_completions, "POST"), ("/v1/embeddings", embeddings, "POST"),
              ("/tokenize", tokenize, "POST"), ("/detokenize", detokenize, "POST"),
              ("/v1/responses", converted, "POST"), ("/v1/messages", converted, "POST"),
              ("/v1/messages/count_tokens", count_tokens, "POST")]
    routes += [(path.removeprefix("/v1"), fn, m) for path, fn, m in routes  # as there; its /completions is native
               if path.startswith("/v1/") and path != "/v1/completions"]
    from . import llamacpp  # llama-server's native routes, on the same slots and request handling
    native = llamacpp.routes(llamacpp.Context(llm, pool, read_body, model_name, None if api_key is None else
                                              lambda r: _check_key(r, api_key), given,
                                              started=started, metrics=metrics, slots=slots,
                                              slot_save_path=slot_save_path, reranking=reranking))
    app = Starlette(routes=[Route(path, _guarded(fn, None if path in PUBLIC else api_key,
                                                 anthropic.error_body if "/messages" in path
                                                 else ApiError.body), methods=[method])
                            for path, fn, method in routes] + [Route(p, fn, methods=[m]) for p, fn, m in native],
                    middleware=[Middleware(_RequestLog, log=request_log)] if request_log is not None else None,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error},
                    lifespan=_closing(pool))
    app.router.redirect_slashes = False  # paths are exact, as llama-server's: /v1/completions/ is a 404
    app.state.pool = pool
    return app


def _closing(pool: SlotPool) -> Callable[[Starlette], Any]:
    """The app's lifespan: at shutdown, cancel what the slots run and stop their threads."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            pool.close()

    return lifespan


def _guarded(handler: Handler, api_key: str | None,
             shape: Callable[[ApiError], dict[str, Any]] = ApiError.body) -> Handler:
    """handler with the API key check (when one is set) and every error turned into OpenAI's error object (or
    shape's: Anthropic's on /v1/messages)."""

    async def run(request: Request) -> Response:
        try:
            if api_key is not None:
                _check_key(request, api_key)
            return await handler(request)
        except ApiError as exc:
            return _error(exc, shape)
        except ContextLengthError as exc:
            return _error(ApiError(400, str(exc), code="context_length_exceeded"), shape)
        except MinillamaError as exc:
            return _error(ApiError(400, str(exc)), shape)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: logged here, never a traceback to the client
            return _server_error_response(request, exc, shape)

    return run


class _RequestLog:
    """ASGI middleware writing one line per HTTP request once its answer is sent (a stream's at its end): method,
    route, status, the prompt's tokens and of those the cached ones, the generated ones, seconds."""

    def __init__(self, app: Any, log: Callable[[str], None]) -> None:
        self.app, self.log = app, log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 0

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            run = scope.get("state", {}).get("run")  # the generation's counts (request.state.run)
            tokens = (f" prompt_tokens={run.prompt_n} cached_tokens={run.cache_n} completion_tokens={run.predicted_n}"
                      if run is not None and run.predicted_n else "")
            self.log(f"minillama serve: {scope['method']} {scope['path']} {status or '-'}{tokens} "
                     f"{time.perf_counter() - started:.3f}s")


async def _with_timings(chunks: AsyncIterator[Any], request: Request) -> AsyncIterator[Any]:
    """chunks with the system_fingerprint, and llama-server's `timings` added to the last one(s): the one with a
    finish_reason, and the usage chunk after it."""
    async for chunk in chunks:
        if isinstance(chunk, dict):
            chunk = {**chunk, "system_fingerprint": FINGERPRINT}
            if "usage" in chunk or any(c.get("finish_reason") for c in chunk.get("choices", ()) if isinstance(c, dict)):
                chunk["timings"] = request.state.run.timings()
        yield chunk


def _check_key(request: Request, api_key: str) -> None:
    """ApiError 401 unless the request says `Authorization: Bearer <the key>` (or Anthropic's `x-api-key: <the
    key>`, as llama-server takes it)."""
    if "x-api-key" in request.headers and "authorization" not in request.headers:
        if not hmac.compare_digest(request.headers["x-api-key"].strip().encode(), api_key.encode()):
            raise ApiError(401, "expected the server's API key as 'x-api-key: <key>', found a different key",
                           type="authentication_error", code="invalid_api_key")
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        found = "a different key" if scheme.lower() == "bearer" else "no 'Authorization: Bearer' header"
        raise ApiError(401, f"expected the server's API key as 'Authorization: Bearer <key>', found {found}",
                       type="authentication_error", code="invalid_api_key")


def _too_large(n: int, limit: int) -> ApiError:
    return ApiError(413, f"expected a request body of at most {limit:,} bytes, found {n:,} or more",
                    code="request_too_large")


def _error(exc: ApiError, shape: Callable[[ApiError], dict[str, Any]] = ApiError.body) -> Response:
    """exc's error object as JSON, non-ASCII escaped: any text it quotes encodes, a lone surrogate included."""
    return Response(json.dumps(shape(exc), ensure_ascii=True), status_code=exc.status,
                    media_type="application/json")


def _model_meta(llm: Any) -> dict[str, Any]:
    """llama-server's /v1/models "meta": vocab size, training context, embedding width, parameters and bytes of
    the model's tensors (from the GGUF's tensor table)."""
    from ..gguffile import read_gguf
    from ..inspection import tensor_size

    model = getattr(llm, "model", None)
    hp = getattr(model, "hparams", None)
    meta: dict[str, Any] = {"n_vocab": getattr(model, "n_vocab", None), "n_ctx_train": getattr(hp, "n_ctx", None),
                            "n_embd": getattr(hp, "n_embd", None), "n_params": None, "size": None}
    path = getattr(llm, "model_path", None)
    if path is not None:
        tensors = read_gguf(path, tensors=True).tensors
        meta["n_params"] = sum(math.prod(t.shape) for t in tensors)
        meta["size"] = sum(tensor_size(t.shape, t.ggml_type) or 0 for t in tensors)
    return meta


#: Starlette's own HTTP errors (no such route, wrong method) as OpenAI's error types.
_HTTP_TYPES = {404: "not_found_error", 405: "invalid_request_error"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = f"{request.method} {request.url.path}"
    message = {404: f"no such endpoint: {what}", 405: f"method not allowed: {what}"}.get(exc.status_code, exc.detail)
    path = request.url.path
    if exc.status_code == 404 and path.endswith("/") and any(
            getattr(r, "path", None) == path.rstrip("/") for r in request.app.routes):
        message += f" (paths are exact: {path.rstrip('/')}, without the trailing slash)"
    return _error(ApiError(exc.status_code, message, type=_HTTP_TYPES.get(exc.status_code, "invalid_request_error")))


async def _server_error(request: Request, exc: Exception) -> Response:
    return _server_error_response(request, exc)


def _server_error_response(request: Request, exc: Exception,
                           shape: Callable[[ApiError], dict[str, Any]] = ApiError.body) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(ApiError(500, f"internal server error ({type(exc).__name__}); the server log has the details",
                           type="server_error"), shape)


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8", "backslashreplace") + b"\n\n"


async def _events(first: Any, chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """Server-sent events: each chunk as `data: {...}`, then `data: [DONE]`; an error midway as its error object."""
    try:
        if first is not None:
            yield _sse(first)
        async for chunk in chunks:
            yield _sse(chunk)
    except Exception as exc:  # noqa: BLE001 - the 200 is sent: the error goes in the stream, the log has the rest
        yield _sse(sse.stream_error(exc).body())
        return
    yield b"data: [DONE]\n\n"


def _piece(data: bytes) -> str | list[int]:
    """A token's piece as llama.cpp's /tokenize gives it: text when valid UTF-8, else its bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def _file_names(paths: list[str]) -> dict[str, str]:
    """path -> its file name, the name the public page shows (a path says where the server's files are); a name
    two paths share gets " (2)", " (3)"... on the later ones."""
    out: dict[str, str] = {}
    for path in paths:
        name = base = os.path.basename(path) or path
        n = 1
        while name in out.values():
            n += 1
            name = f"{base} ({n})"
        out[path] = name
    return out


#: JSON made safe inside a <script>: no "</script", "<!--" or "<script" (which end or change the script's parsing
#: in HTML) and no U+2028/U+2029 (line ends in older JavaScript), all as \u escapes, which JSON and JS read back.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def playground_html(vocabs: list[str]) -> str:
    """The playground page, with the CLI's palette and the vocab names filled in."""
    from ..palette import FOREGROUND, NEWLINE_MARK, PALETTE

    def css(rgb: tuple[int, int, int]) -> str:
        return "#{:02x}{:02x}{:02x}".format(*rgb)

    config = {"palette": [css(c) for c in PALETTE], "foreground": css(FOREGROUND), "newline": NEWLINE_MARK,
              "vocabs": vocabs}
    page = resources.files(__package__).joinpath("playground.html").read_text(encoding="utf-8")
    return page.replace("/*CONFIG*/null", json.dumps(config, ensure_ascii=False).translate(_SCRIPT_SAFE))
