"""minillama.api: a GGUF model behind llama-cpp-python's `Llama` calls, with results in the OpenAI shapes.

    from minillama.api import Llama
    llm = Llama("SmolLM2-135M-Instruct.Q4_1.gguf", seed=1)
    llm.create_completion("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
    llm.create_chat_completion([{"role": "user", "content": "Hi"}])["choices"][0]["message"]["content"]
    for chunk in llm.create_chat_completion(messages, stream=True): ...      # chat.completion.chunk dicts
    llm.create_embedding("Hello")["data"][0]["embedding"]

Each call runs in a Session of its own (its own KV cache; the model's weights are only read), so threads can
each drive a request on one loaded Llama at once: what a server's slots need. A streamed call is a generator;
closing it (or dropping it) ends the generation at once and frees its session. Each call builds one
minillama.request.Request (its SamplingParams, stop strings, JSON constraint) and runs it (Llama.run); sampling is
llama.cpp's chain and order (logit_bias, grammar, penalties, top_k, top_p, min_p, temperature).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .chat_template import ChatTemplate
from .constrain import JsonConstraint, json_constraint
from .errors import ArgumentError, ArgumentTypeError, ChatTemplateError
from .generate import Generation, chat_prompt
from .model import AUTO, Model, Session, Threads
from .request import RANDOM_SEED, Request, SamplingParams
from .tokenizer import Tokenizer
from .toolcalls import Plan, StreamSplitter, detect, opened_thinking, thinks
from .toolcalls.lazy import LazyConstraint

__all__ = ["Llama", "Stream", "POOLING", "FINISH_REASONS"]

#: GenerationStats.stop_reason -> OpenAI's finish_reason ("stopped": closed early by the caller).
FINISH_REASONS: dict[str, str | None] = {"eog": "stop", "stop_string": "stop", "next_turn": "stop",
                                         "max_tokens": "length", "context": "length", "stopped": None}

#: llama.cpp's pooling types ({arch}.pooling_type, --pooling): how token states become one embedding.
POOLING: dict[int, str] = {1: "mean", 2: "cls", 3: "last"}

#: pooling name -> the vector it makes of the hidden states [n_tokens, n_embd] (llama.cpp's build_pooling).
POOL = {"mean": lambda h: h.mean(axis=0), "cls": lambda h: h[0], "last": lambda h: h[-1]}

#: Most alternatives reported per token: OpenAI's limits (completions logprobs <= 5, chat top_logprobs <= 20).
MAX_LOGPROBS, MAX_TOP_LOGPROBS = 5, 20


def token_text(piece: bytes) -> str:
    """A token's text in logprobs: its UTF-8, or for a piece that is not whole UTF-8 (part of a character)
    "bytes:\\xNN..." as OpenAI writes such tokens, so different byte tokens never share a name."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


def _flat_message(message: Mapping[str, Any], i: int) -> Mapping[str, Any]:
    """message with its content given as parts ([{"type": "text", "text": ...}, ...], OpenAI's form) joined into
    one text by newlines, as llama.cpp's server joins them for a template that takes text; ArgumentError for
    a part that is not text (an image: the model takes text only)."""
    content = message.get("content")
    if not isinstance(content, list | tuple):
        return message
    texts = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, Mapping):
            raise ArgumentTypeError(f"expected {where} to be a content part {{'type': 'text', 'text': ...}}, found "
                                    f"{type(part).__name__}")
        kind = part.get("type")
        if kind != "text":
            raise ArgumentError(f"expected {where} to be a part of type 'text' (this model takes text only), found "
                                f"type {kind!r:.60}")
        text = part.get("text")
        if not isinstance(text, str):
            raise ArgumentTypeError(f"expected {where}.text to be a str, found {type(text).__name__}")
        texts.append(text)
    return {**message, "content": "\n".join(texts)}


class Stream(Iterator[dict[str, Any]]):
    """The chunks of a streamed call. close() (from the thread that iterates) or cancel() (from any thread, e.g. a
    server's event loop when the client disconnects while a worker thread waits in next()) ends the generation:
    no model step starts after it, and its session is freed with the stream."""

    def __init__(self, chunks: Iterator[dict[str, Any]], gen: Generation) -> None:
        self._chunks, self._gen = chunks, gen

    def __next__(self) -> dict[str, Any]:
        return next(self._chunks)

    def close(self) -> None:
        """End the stream now (the thread that iterates it)."""
        self._chunks.close()  # type: ignore[attr-defined]

    def cancel(self) -> None:
        """End the generation from any thread: the stream then ends after at most the step under way."""
        self._gen.cancel()


def _finish_reason(gen: Generation) -> str | None:
    """OpenAI's finish_reason for the run (None while it runs)."""
    return FINISH_REASONS.get(gen.stats.stop_reason)


def _chat_finish(gen: Generation, calls: Sequence[Any]) -> str | None:
    """The chat reply's finish_reason: "tool_calls" when it ended by itself with calls."""
    reason = _finish_reason(gen)
    return "tool_calls" if calls and reason == "stop" else reason


def _usage(gen: Generation) -> dict[str, Any]:
    """OpenAI's usage: the prompt's tokens and the generated ones (a final eog included), and of the prompt's, those
    the session's cache already held (prompt_tokens_details.cached_tokens, as llama-server counts them)."""
    p, n = gen.stats.prompt_tokens, gen.stats.generated_tokens
    cached = p - gen.stats.prompt_evaluated if n else 0
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n,
            "prompt_tokens_details": {"cached_tokens": cached}}


class _Offsets:
    """Where the text of each generated id starts in the reply (decoded as the stream is), found as needed."""

    def __init__(self, gen: Generation) -> None:
        self.gen, self.chars = gen, 0
        self.starts: list[int] = []
        self.decoder = gen.tok.stream_decoder(skip_special_tokens=True)

    def __call__(self, n: int) -> list[int]:
        """The starts of the first n generated ids."""
        for i in self.gen.ids[len(self.starts):n]:
            self.starts.append(self.chars)
            self.chars += len(self.decoder.push(i))
        return self.starts


class Llama:
    """A loaded GGUF model and its tokenizer, answering llama-cpp-python's / OpenAI's calls.

    n_ctx caps the context (None or 0: the model's); seed is the default seed of every call (-1: a fresh random
    seed per call); threads: BLAS threads of the forward pass as Model.from_file takes them, None (as
    llama-cpp-python's n_threads=None) meaning minillama's default "auto"; pooling "mean", "cls" or "last" overrides the file's
    {arch}.pooling_type for create_embedding (mean when the file says none); model_name is the "model" the
    results name (default: the file's name); batch_steps=True runs the single-token steps of requests that come
    at the same time as one pass (worth it from 2 at once on the native backend, about 4 on the pure one:
    minillama/model/batch.py); chat_template: a Jinja chat template to use instead of the file's.
    """

    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int | None = None, seed: int = RANDOM_SEED,
                 threads: Threads = None, *, pooling: str | None = None, model_name: str | None = None,
                 batch_steps: bool = False, verbose: bool = False, chat_template: str | None = None) -> None:
        path = os.fspath(model_path)
        if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 0):
            raise ArgumentError(f"expected n_ctx as a count of tokens (0 or None: the model's), found {n_ctx!r}")
        if seed is not None and seed < 0 and seed != RANDOM_SEED:
            raise ArgumentError(f"expected a seed of 0 or more (or {RANDOM_SEED} for a random one), found {seed}")
        self.model_path = path
        self.model = Model.from_file(path, threads=AUTO if threads is None else threads)
        self.tokenizer = Tokenizer.from_file(path)
        #: Most tokens a request (prompt and reply) may hold.
        self.n_ctx = self.model.n_ctx if not n_ctx else min(n_ctx, self.model.n_ctx)
        self.seed = seed
        self.model_name = model_name or os.path.basename(path)
        self.verbose = verbose
        self.pooling = self._pooling(pooling)
        #: Requests' single-token steps that come at the same time share one pass (minillama/model/batch.py).
        self.batch_steps = batch_steps
        #: The Jinja chat template chat uses instead of the file's (llama-server's --chat-template-file), or None.
        self.chat_template = chat_template
        self._template: ChatTemplate | None = None
        self._template_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Llama({self.model_path!r}, n_ctx={self.n_ctx})"

    # -- tokens ----------------------------------------------------------------------------------------------

    def tokenize(self, text: bytes | str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama.cpp's ids for text (bytes are tokenized as they are, invalid UTF-8 included)."""
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8", "surrogateescape")
        elif not isinstance(text, str):
            raise ArgumentTypeError(f"expected text as str or bytes, found {type(text).__name__}")
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], special: bool = True) -> bytes:
        """The bytes of ids (llama_detokenize; special=False leaves control tokens out)."""
        return self.tokenizer.decode_bytes(ids, remove_special=not special, unparse_special=special)

    def session(self) -> Session:
        """A sequence of its own on the model (a slot): pass it as session= to reuse its KV cache across calls."""
        return self.model.session(self.n_ctx, batched=self.batch_steps)

    # -- completions -----------------------------------------------------------------------------------------

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                          stop: str | Sequence[str] | None = None, stream: bool = False, logprobs: int | None = None,
                          seed: int | None = None, repeat_penalty: float = 1.0, presence_penalty: float = 0.0,
                          frequency_penalty: float = 0.0, logit_bias: Mapping[int, float] | None = None,
                          response_format: Mapping[str, Any] | None = None, echo: bool = False, *,
                          repeat_last_n: int = 64, model: str | None = None, session: Session | None = None,
                          stream_options: Mapping[str, Any] | None = None) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's text_completion for prompt (a str, encoded with bos and control tokens matched, or ids), or
        with stream=True an iterator of text_completion chunks (the last one carries finish_reason).

        max_tokens None or <= 0: until the context is full. logprobs=N (0..5): each token's log-probability and the
        N best, in the completions API's shape. echo puts the prompt text before the reply (its tokens get no
        logprobs).
        """
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise ArgumentError(f"expected logprobs between 0 and {MAX_LOGPROBS}, found {logprobs}")
        ids = self._prompt_ids(prompt)
        sampling = self._sampling(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                                  repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  logit_bias=logit_bias, n_probs=0 if logprobs is None else max(logprobs, 1))
        run = self.run(self._request(ids, max_tokens, sampling, stop, response_format), session)
        head = {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": model or self.model_name}
        prefix = (prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)) if echo else ""
        want = logprobs if logprobs is not None else None
        if stream:
            return Stream(self._completion_chunks(run, head, prefix, want, stream_options), run)
        text = prefix + "".join(run)
        lp = self._completion_logprobs(run, _Offsets(run), run.reply, want, len(prefix)) if want is not None else None
        return {**head, "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": _finish_reason(run)}],
                "usage": _usage(run)}

    def __call__(self, prompt: str | Sequence[int], **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """create_completion(prompt, ...), as llama-cpp-python's Llama is callable."""
        return self.create_completion(prompt, **kwargs)

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, stream: bool = False,
                               stop: str | Sequence[str] | None = None, seed: int | None = None,
                               response_format: Mapping[str, Any] | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, logit_bias: Mapping[int, float] | None = None,
                               logprobs: bool | None = False, top_logprobs: int | None = None, *,
                               repeat_last_n: int = 64, model: str | None = None, session: Session | None = None,
                               stream_options: Mapping[str, Any] | None = None,
                               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = "auto",
                               parallel_tool_calls: bool = False, reasoning_format: str = "auto",
                               chat_template_kwargs: Mapping[str, Any] | None = None,
                               **template_kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's chat.completion for messages, rendered with the GGUF's chat template (in its sandbox), or with
        stream=True an iterator of chat.completion.chunk dicts (a first one with the role, the last one with
        finish_reason). Defaults as llama-cpp-python's. logprobs=True, top_logprobs=N (0..20): the chat API's
        logprobs.content list. Other keywords go to the template as variables (e.g. tools). A message's content
        may be OpenAI's list of parts: text parts are joined by newlines (as llama.cpp's server joins them), any
        other part is an ArgumentError (the model takes text only).

        tools (OpenAI's function tools), tool_choice ("auto", "none", "required" or {"type": "function",
        "function": {"name": ...}}) and parallel_tool_calls: the reply's calls come as message.tool_calls with
        finish_reason "tool_calls", parsed in the format of the template's family (minillama.toolcalls); with
        "required" or a named function the reply is constrained to a call whose arguments follow the function's
        schema; a template without tool support gets llama.cpp's generic JSON format (always constrained). Messages
        may hold an assistant's tool_calls and "tool" results. reasoning_format ("auto", the default, "deepseek"
        or "none"): thinking (<think>...</think>) goes to message.reasoning_content. chat_template_kwargs are
        template variables (e.g. {"enable_thinking": False}), as llama.cpp's server takes them.
        """
        if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ArgumentError(f"expected top_logprobs between 0 and {MAX_TOP_LOGPROBS}, found {top_logprobs}")
        if top_logprobs and not logprobs:
            raise ArgumentError("top_logprobs needs logprobs=True")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise ArgumentTypeError(f"expected chat_template_kwargs as a dict, found {type(chat_template_kwargs).__name__}")
        plan, ids, source = self._chat_setup(messages, tools, tool_choice, parallel_tool_calls, reasoning_format,
                                             {**dict(chat_template_kwargs or {}), **template_kwargs})
        grammar = plan.constraint_grammar()
        if grammar is not None and response_format is not None:
            raise ArgumentError("expected either response_format or tools that constrain the reply, found both")
        think_open = opened_thinking(self.tokenizer.decode(ids[-4:])) if thinks(source) else ""
        sampling = self._sampling(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                                  repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  logit_bias=logit_bias, n_probs=max(top_logprobs or 0, 1) if logprobs else 0)
        request = self._request(ids, max_tokens, sampling, stop, response_format)
        if grammar is not None:
            request = replace(request, constraint=JsonConstraint(self.tokenizer, None, lark=grammar))
        elif plan.lazy_triggers() and response_format is None:
            request = replace(request, constraint=LazyConstraint(self.tokenizer, plan.lazy_triggers()))
        run = self.run(request, session)
        head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()),
                "model": model or self.model_name}
        want = (top_logprobs or 0) if logprobs else None
        splitter = StreamSplitter(plan, think_open)
        if stream:
            return Stream(self._chat_chunks(run, head, want, stream_options, splitter), run)
        _, parsed = splitter.finish("".join(run))
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning_content:
            message["reasoning_content"] = parsed.reasoning_content
        if parsed.tool_calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
        lp = {"content": self._chat_logprobs(run, run.reply, want), "refusal": None} if want is not None else None
        return {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "logprobs": lp,
                             "finish_reason": _chat_finish(run, parsed.tool_calls)}],
                "usage": _usage(run)}

    def count_chat_tokens(self, messages: Sequence[Mapping[str, Any]],
                          tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = "auto",
                          parallel_tool_calls: bool = False, chat_template_kwargs: Mapping[str, Any] | None = None,
                          **template_kwargs: Any) -> int:
        """The prompt's length in tokens for create_chat_completion with these messages and tools, without running
        the model (Anthropic's count_tokens)."""
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise ArgumentTypeError(f"expected chat_template_kwargs as a dict, found {type(chat_template_kwargs).__name__}")
        return len(self._chat_setup(messages, tools, tool_choice, parallel_tool_calls, "auto",
                                    {**dict(chat_template_kwargs or {}), **template_kwargs})[1])

    def _chat_setup(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                    tool_choice: Any, parallel_tool_calls: bool, reasoning_format: str,
                    extra: dict[str, Any]) -> tuple[Plan, list[int], str | None]:
        """A chat call's tool and reasoning plan, its prompt ids (messages with calls and results rendered as the
        plan says, the tools given to the template) and the template's source."""
        template = self._chat_template()
        source = template.source if template is not None else None
        plan = Plan.make(detect(source), tools, tool_choice, parallel_tool_calls, reasoning_format, thinks(source))
        if plan.tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages
                             if isinstance(m, Mapping)):
            messages = plan.messages(messages)
        if plan.template_tools():
            extra["tools"] = plan.template_tools()
        return plan, self._chat_prompt(messages, extra), source

    # -- embeddings ------------------------------------------------------------------------------------------

    def embed(self, input: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
              normalize: bool = True) -> list[list[float]]:
        """One vector per input: the final hidden state pooled (self.pooling) and, normalize=True, scaled to unit
        length (llama.cpp's --embd-normalize 2, the default). Texts are encoded with bos and control tokens matched,
        as llama-server encodes them."""
        out = []
        for ids in self._embedding_inputs(input):
            h = self.model.hidden(ids).astype(np.float64)
            v = POOL[self.pooling](h)
            if normalize:
                norm = np.linalg.norm(v)
                v = v / norm if norm > 0 else v
            out.append([float(x) for x in v])
        return out

    def create_embedding(self, input: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
                         model: str | None = None) -> dict[str, Any]:
        """OpenAI's embedding list: {"object": "list", "data": [{"object": "embedding", "embedding", "index"}],
        "model", "usage"}; see embed for the pooling."""
        inputs = self._embedding_inputs(input)
        vectors = self.embed(inputs)
        n = sum(len(i) for i in inputs)
        return {"object": "list", "model": model or self.model_name,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    # -- internals -------------------------------------------------------------------------------------------

    def _pooling(self, pooling: str | None) -> str:
        """The pooling asked for, else the file's {arch}.pooling_type, else mean."""
        if pooling is not None:
            if pooling not in POOLING.values():
                raise ArgumentError(f"expected pooling {', '.join(POOLING.values())}, found {pooling!r}")
            return pooling
        key = f"{self.model.hparams.arch}.pooling_type"
        return POOLING.get(int(self.tokenizer.vocab.metadata.get(key, 1) or 1), "mean")

    def _embedding_inputs(self, input: Any) -> list[list[int]]:
        """OpenAI's input forms (a str, a list of str, a list of ids, a list of lists of ids) as lists of ids."""
        if isinstance(input, str):
            items: list[Any] = [input]
        elif isinstance(input, Sequence) and input and all(isinstance(i, int) and not isinstance(i, bool)
                                                            for i in input):
            items = [list(input)]
        elif isinstance(input, Sequence) and not isinstance(input, bytes | bytearray):
            items = list(input)
        else:
            raise ArgumentTypeError(f"expected input as a str, a list of str or of token ids, found "
                                    f"{type(input).__name__}")
        if not items:
            raise ArgumentError("expected at least one input to embed, found an empty list")
        out = []
        for item in items:
            ids = self._prompt_ids(item)
            if len(ids) > self.n_ctx:
                raise ArgumentError(f"an input has {len(ids)} tokens but the context holds {self.n_ctx}")
            out.append(ids)
        return out

    def _prompt_ids(self, prompt: Any) -> list[int]:
        """A str prompt encoded with bos and control tokens matched, or a list of ids checked."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        elif isinstance(prompt, Sequence) and not isinstance(prompt, bytes | bytearray) and all(
                isinstance(i, int | np.integer) and not isinstance(i, bool) for i in prompt):
            ids = [int(i) for i in prompt]
            bad = next((i for i in ids if not 0 <= i < self.tokenizer.n_vocab), None)
            if bad is not None:
                raise ArgumentError(f"token id {bad} is out of range (expected 0..{self.tokenizer.n_vocab - 1})")
        else:
            raise ArgumentTypeError(f"expected a prompt as a str or a list of token ids, found {type(prompt).__name__}")
        if not ids:
            raise ArgumentError("expected a prompt of at least one token, found none")
        return ids

    def _chat_template(self) -> ChatTemplate | None:
        with self._template_lock:
            if self._template is None:
                self._template = self.tokenizer.build_chat_template(self.chat_template)
            return self._template

    def _chat_prompt(self, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]) -> list[int]:
        """messages rendered with the file's chat template (add_generation_prompt) and encoded."""
        if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not all(
                isinstance(m, Mapping) and "role" in m for m in messages):
            raise ArgumentTypeError("expected messages as a list of {'role': ..., 'content': ...} dicts")
        if not messages:
            raise ArgumentError("expected at least one message, found none")
        messages = [_flat_message(m, i) for i, m in enumerate(messages)]
        template = self._chat_template()
        if template is None:
            raise ChatTemplateError(f"{self.model_path}: the file has no tokenizer.chat_template to render messages "
                                    "with; use create_completion with a prompt")
        return chat_prompt(self.tokenizer, template, messages, **kwargs)[0]

    def _sampling(self, seed: int | None, **settings: Any) -> SamplingParams:
        """A call's SamplingParams: its settings, its seed or else the Llama's."""
        return SamplingParams(seed=self.seed if seed is None else seed, **settings)

    def _request(self, ids: list[int], max_tokens: int | None, sampling: SamplingParams,
                 stop: str | Sequence[str] | None, response_format: Mapping[str, Any] | None) -> Request:
        """A call's Request: max_tokens None or <= 0 meaning until the context is full, a response_format's JSON
        constraint."""
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise ArgumentTypeError(f"expected max_tokens as an int or None, found {max_tokens!r}")
        limit = self.n_ctx if max_tokens is None or max_tokens <= 0 else max_tokens
        request = Request(ids, limit, sampling, stop=stop or ())  # stop checked before the grammar is built
        return replace(request, constraint=json_constraint(self.tokenizer, response_format))

    def run(self, request: Request, session: Session | None = None) -> Generation:
        """The Generation of request in a session (a new one unless given): what every generation call runs."""
        gen = Generation(session or self.session(), self.tokenizer, request)
        if session is not None and hasattr(session, "generation"):
            session.generation = gen  # a server slot's: its stop string (Anthropic's stop_sequence)
        return gen

    def _piece(self, token: int) -> str:
        return token_text(self.tokenizer.token_to_piece(token))

    def _completion_logprobs(self, run: Generation, offsets: _Offsets, ids: list[int], n: int, offset: int,
                             start: int = 0) -> dict[str, Any]:
        """The completions API's logprobs of ids[start:] (tokens, token_logprobs, top_logprobs, text_offset: where
        each token's text starts in the choice's text, offset being the echoed prompt's length)."""
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        starts = offsets(len(ids))
        for k, (i, lp) in enumerate(zip(ids[start:], run.logprobs[start:len(ids)], strict=False), start):
            out["tokens"].append(self._piece(i))
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({self._piece(t): v for t, v in lp.top[:n]} if n else None)
            out["text_offset"].append(offset + starts[k])
        return out

    def _chat_logprobs(self, gen: Generation, ids: list[int], n: int, start: int = 0) -> list[dict[str, Any]]:
        """The chat API's logprobs.content entries of ids[start:]."""
        def entry(token: int, logprob: float) -> dict[str, Any]:
            piece = self.tokenizer.token_to_piece(token)
            return {"token": token_text(piece), "logprob": logprob, "bytes": list(piece)}

        return [{**entry(i, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top[:n]]}
                for i, lp in zip(ids[start:], gen.logprobs[start:len(ids)], strict=False)]

    def _completion_chunks(self, run: Generation, head: dict[str, Any], prefix: str, want: int | None,
                           stream_options: Mapping[str, Any] | None) -> Iterator[dict[str, Any]]:
        """text_completion chunks: the text as it comes (each with its new tokens' logprobs), then finish_reason."""
        def chunk(text: str, lp: dict[str, Any] | None, finish: str | None) -> dict[str, Any]:
            return {**head, "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

        done, offsets = 0, _Offsets(run)
        try:
            if prefix:
                yield chunk(prefix, None, None)
            for text in run:
                ids = run.ids
                lp = self._completion_logprobs(run, offsets, ids, want, len(prefix), done) \
                    if want is not None else None
                done = len(ids)
                yield chunk(text, lp, None)
            ids = run.reply
            lp = self._completion_logprobs(run, offsets, ids, want, len(prefix), done) \
                if want is not None and len(ids) > done else None
            yield chunk("", lp, _finish_reason(run))
            if stream_options and stream_options.get("include_usage"):
                yield {**head, "choices": [], "usage": _usage(run)}
        finally:
            run.close()  # a client gone: end the generation now (its session goes with it)

    def _chat_chunks(self, run: Generation, head: dict[str, Any], want: int | None,
                     stream_options: Mapping[str, Any] | None,
                     splitter: StreamSplitter) -> Iterator[dict[str, Any]]:
        """chat.completion.chunk dicts: the role, the text as it comes (with its new tokens' logprobs; split by
        splitter into reasoning_content and content, a possible call held back), the calls, the end."""
        def chunk(delta: dict[str, Any], lp: list[dict[str, Any]] | None, finish: str | None) -> dict[str, Any]:
            return {**head, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None if lp is None else
                                 {"content": lp, "refusal": None}, "finish_reason": finish}]}

        done, so_far = 0, ""
        try:
            yield chunk({"role": "assistant", "content": ""}, None, None)
            for text in run:
                so_far += text
                deltas = splitter.feed(so_far)
                if not deltas:
                    continue
                ids = run.ids
                lp = self._chat_logprobs(run, ids, want, done) if want is not None else None
                done = len(ids)
                for k, delta in enumerate(deltas):
                    yield chunk(delta, lp if k == 0 else None, None)
            deltas, parsed = splitter.finish(so_far)
            ids = run.reply
            lp = self._chat_logprobs(run, ids, want, done) if want is not None and len(ids) > done else None
            for delta in deltas:
                yield chunk(delta, lp, None)
                lp = None
            yield chunk({}, lp, _chat_finish(run, parsed.tool_calls))
            if stream_options and stream_options.get("include_usage"):
                yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(run)}
        finally:
            run.close()

