"""`minillama serve`: an OpenAI-compatible HTTP server for one GGUF model, with a token playground at /.

    minillama serve --model SmolLM2-135M-Instruct.Q4_1.gguf --parallel 4
    curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'

It runs on Starlette and uvicorn, the optional extra `serve` (pip install ".[serve]"), imported only here;
app.py has the routes, slots.py the --parallel slots, params.py the request tables, guard.py the timeouts and the
Host/Origin checks, playground.html the page.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ChatTemplateError, MinillamaError
from .limits import DEFAULT_HEADER_TIMEOUT, DEFAULT_TIMEOUT, EMBEDDING_MAX_INPUTS, EMBEDDING_MAX_TOKENS
from .prompt_cache import DEFAULT_CACHE_RAM_MIB

if TYPE_CHECKING:  # imported where a socket is made: every CLI command reads DEFAULT_HOST/PORT from here
    import socket

__all__ = ["serve", "require_extra", "cache_ram_bytes", "DEFAULT_HOST", "DEFAULT_PORT", "MAX_PARALLEL",
           "DEFAULT_TIMEOUT", "DEFAULT_HEADER_TIMEOUT", "EMBEDDING_MAX_INPUTS", "EMBEDDING_MAX_TOKENS",
           "DEFAULT_CACHE_RAM_MIB"]

DEFAULT_HOST = "127.0.0.1"  # loopback only unless asked: the server runs code paths anyone could reach
DEFAULT_PORT = 8080  # llama.cpp's llama-server's
#: Most slots: each holds a KV cache and a thread; more than a few per core only queue inside BLAS.
MAX_PARALLEL = 64
#: llama.cpp rounds a context size up to a multiple of this (llama_context: GGML_PAD(n_ctx, 256)), so -c does too.
CTX_PAD = 256

#: The modules the `serve` extra installs (import name -> what pip installs).
EXTRA = {"starlette": "starlette", "uvicorn": "uvicorn"}


def require_extra() -> None:
    """MinillamaError naming the missing package and the command that installs it, when the extra is absent."""
    import importlib.util

    missing = [pkg for mod, pkg in EXTRA.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise MinillamaError(f"minillama serve needs {' and '.join(missing)}, found none installed: "
                             "pip install \".[serve]\" (from the minillama checkout)")


def cache_ram_bytes(mib: int | str) -> int:
    """--cache-ram's MiB as bytes, or MinillamaError unless it is a whole number of 0 or more (0: no RAM cache)."""
    text = str(mib).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise MinillamaError(f"expected --cache-ram as a whole number of MiB from 0 (no RAM cache) to 999999999, "
                             f"found {str(mib)[:40]!r}")
    return int(text) << 20


def read_chat_template(path: str) -> str:
    """--chat-template-file's text, or a MinillamaError saying why not (unreadable, not UTF-8, empty)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise MinillamaError(f"cannot read --chat-template-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise MinillamaError(f"expected --chat-template-file {path} to be UTF-8 text, found byte "
                             f"0x{exc.object[exc.start]:02x} at offset {exc.start}") from None
    if not text.strip():
        raise MinillamaError(f"expected a Jinja chat template in --chat-template-file {path}, found an empty file")
    return text


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket, or MinillamaError naming host:port and why not (e.g. in use)."""
    import socket

    if not 0 <= port <= 65535:
        raise MinillamaError(f"expected --port from 0 to 65535, found {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise MinillamaError(f"expected --host to be an address or a host name, found {host!r} ({exc})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise MinillamaError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(model: str, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, parallel: int = 1,
          api_key: str | None = None, vocabs: Sequence[str] = (), threads: Any = "auto",
          timeout: float = DEFAULT_TIMEOUT, header_timeout: float = DEFAULT_HEADER_TIMEOUT,
          allowed_hosts: Sequence[str] = (), cors_origins: Sequence[str] = (),
          embedding_max_inputs: int = EMBEDDING_MAX_INPUTS, embedding_max_tokens: int = EMBEDDING_MAX_TOKENS,
          cache_ram: int | str = DEFAULT_CACHE_RAM_MIB, verbose: bool = False, reasoning_format: str = "auto",
          chat_template_file: str | None = None, n_ctx: int = 0, alias: str | None = None,
          server_defaults: Mapping[str, Any] | None = None, pooling: str | None = None, metrics: bool = False,
          slots: bool = True, slot_save_path: str | None = None, ignored: Sequence[str] = (),
          reasoning_budget: int = -1, reasoning_budget_message: str = "", reranking: bool = False,
          context_shift: bool = False, log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Load model (and the --vocab tokenizers), listen on host:port and serve until interrupted.

    The line "minillama serve: listening on http://HOST:PORT ..." is logged once the socket listens (port 0
    picks a free port and the line names it). timeout, header_timeout: see guard.py; allowed_hosts: Host names
    accepted beside localhost, IP addresses and host ("*": any); cors_origins: origins other sites' pages may call
    from ("*": any); cache_ram: MiB of host RAM for prefixes evicted from the slots (llama-server's --cache-ram, 0:
    none); verbose: one log line per request; reasoning_format: chat's default (a request's reasoning_format
    overrides it); chat_template_file: a Jinja chat template used instead of the model's (a model with none and
    no file chats in ChatML, as llama-server does, and the log says so); n_ctx: the context (-c; 0: the model's; else rounded up
    to a multiple of CTX_PAD, as llama.cpp pads it);
    alias: the model's name in the API (--alias; default: the file's name); server_defaults: llama.cpp's request
    fields every request starts from (--temp, --seed, -n); pooling: the embeddings' pooling (--pooling; default:
    the file's); metrics, slots, slot_save_path: llama-server's GET /metrics, GET /slots and slot files folder;
    ignored: llama-server flags given that mean nothing here, each logged once; reasoning_budget,
    reasoning_budget_message: chat's thinking budget in tokens (-1: none) and the text forced before its end tag;
    reranking: serve /rerank with rank pooling (--reranking; pooling "rank" does the same, embeddings being on);
    context_shift: a generation that fills the context drops old positions and goes on (--context-shift; a
    request's n_keep says how many first ones stay), on models whose sessions can (Model.can_shift)."""
    require_extra()
    for line in ignored:
        log(f"minillama serve: warning: ignoring {line}")
    if slot_save_path is not None and not os.path.isdir(slot_save_path):
        raise MinillamaError(f"expected --slot-save-path to be a folder, found {slot_save_path!r} "
                             f"({'a file' if os.path.exists(slot_save_path) else 'nothing there'})")
    if n_ctx < 0:
        raise MinillamaError(f"expected --ctx-size (-c) of 0 (the model's) or more, found {n_ctx}")
    n_ctx = -(-n_ctx // CTX_PAD) * CTX_PAD  # llama_context pads n_ctx so: llama-server's -c 100 holds 256 tokens
    cache_bytes = cache_ram_bytes(cache_ram)
    chat_template = read_chat_template(chat_template_file) if chat_template_file is not None else None
    if reasoning_format not in ("auto", "deepseek", "none"):
        raise MinillamaError(f"expected --reasoning-format auto, deepseek or none, found {reasoning_format!r}")
    if not -1 <= reasoning_budget < 2**31:
        raise MinillamaError(f"expected --reasoning-budget from 0 to {2**31 - 1:,} (or -1: none), found "
                             f"{reasoning_budget}")
    if not 1 <= parallel <= MAX_PARALLEL:
        raise MinillamaError(f"expected --parallel from 1 to {MAX_PARALLEL}, found {parallel}")
    if api_key is not None and not api_key.strip():
        raise MinillamaError("expected a non-empty --api-key, found an empty one")
    for name, value in (("--timeout", timeout), ("--header-timeout", header_timeout)):
        if not 0 < value < float("inf"):
            raise MinillamaError(f"expected {name} as seconds above 0, found {value}")
    for name, count in (("--embedding-max-inputs", embedding_max_inputs),
                        ("--embedding-max-tokens", embedding_max_tokens)):
        if count < 1:
            raise MinillamaError(f"expected {name} of 1 or more, found {count}")
    import uvicorn

    from ..api import Llama
    from ..tokenizer import Tokenizer
    from .app import create_app
    from .guard import MAX_HEADER_BYTES, Guard, protocol

    reranking = reranking or pooling == "rank"
    if reranking:
        if pooling not in (None, "rank"):
            raise MinillamaError(f"expected --reranking without --pooling or with --pooling rank, found --pooling "
                                 f"{pooling}")
        pooling = "rank"
    name = alias or os.path.basename(model)
    sock = listen(host, port)  # first: a port in use fails before the model loads
    try:
        # several slots: their decode steps share passes of the model (Linear multiplies a few rows reading w once)
        try:
            llm = Llama(model, n_ctx=n_ctx, threads=threads, model_name=name, batch_steps=parallel > 1,
                        chat_template=chat_template, pooling=pooling)
        except ChatTemplateError as exc:
            raise MinillamaError(f"--chat-template-file {chat_template_file}: {exc}") from None
        if reranking and getattr(llm.model, "rank_head", None) is None:
            log(f"minillama serve: warning: {os.path.basename(model)} has no rank head (cls.output.weight): /rerank "
                "scores with the last hidden state's first value, as llama-server does (load a reranker)")
        can_shift = llm.model.can_shift(int(llm.n_ctx))
        if context_shift and not can_shift:  # as llama-server on a context it cannot shift
            log("minillama serve: warning: context shift is not supported by this model and context (it needs the "
                "native backend's C blocks, a cache of keys and values only, and a sliding-window cache as large as "
                "the context): it is disabled")
        llm.context_shift = context_shift and can_shift
        if llm.chat_template_fallback:
            log(f"minillama serve: {os.path.basename(model)} has no chat template (tokenizer.chat_template): chat "
                "uses ChatML, as llama-server does (--chat-template-file gives another)")
        tokenizers = {model: llm.tokenizer}
        for path in vocabs:
            tokenizers[path] = Tokenizer.from_file(path)
        app = create_app(llm, parallel=parallel, api_key=api_key, vocabs=tokenizers,
                         model_name=name, embedding_max_inputs=embedding_max_inputs,
                         embedding_max_tokens=embedding_max_tokens, cache_bytes=cache_bytes,
                         request_log=log if verbose else None, reasoning_format=reasoning_format,
                         server_defaults=server_defaults, metrics=metrics, slots=slots,
                         slot_save_path=slot_save_path, reasoning_budget=reasoning_budget,
                         reasoning_budget_message=reasoning_budget_message, reranking=reranking)
        guarded = Guard(app, bound_host=host, allowed_hosts=allowed_hosts, cors_origins=cors_origins,
                        body_timeout=timeout)
        bound = sock.getsockname()
        log(f"minillama serve: listening on http://{_url_host(bound[0])}:{bound[1]} ({model}, {parallel} slot"
            f"{'s' if parallel > 1 else ''}{', API key required' if api_key else ''}); Ctrl-C stops")
        # h11 (not httptools) whatever is installed: guard.protocol adds its header and write timers to it
        config = uvicorn.Config(guarded, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                                http=protocol(header_timeout, timeout), h11_max_incomplete_event_size=MAX_HEADER_BYTES)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except KeyboardInterrupt:  # Ctrl-C (SIGINT), the way to stop a server: uvicorn has shut down cleanly
            pass
        log("minillama serve: stopped")
    finally:
        sock.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
