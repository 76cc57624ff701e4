"""minillama.api: a GGUF model behind llama-cpp-python's `Llama` calls, with results in the OpenAI shapes.

    from minillama.api import Llama
    llm = Llama("SmolLM2-135M-Instruct.Q4_1.gguf", seed=1)
    llm.create_completion("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
    llm.create_chat_completion([{"role": "user", "content": "Hi"}])["choices"][0]["message"]["content"]
    for chunk in llm.create_chat_completion(messages, stream=True): ...      # chat.completion.chunk dicts
    llm.create_embedding("Hello")["data"][0]["embedding"]
    Llama("reranker.gguf", pooling="rank").rank("query", ["doc 1", "doc 2"])  # a reranker's relevance scores

Each call runs in a Session of its own (its own KV cache; the model's weights are only read), so threads can
each drive a request on one loaded Llama at once: what a server's slots need. A call without session= takes the
session of the last call that finished, when no other call has taken it, so a multi-turn chat reprocesses only
what its prompt adds to the last one's (the longest shared prefix stays cached, as llama-cpp-python keeps its
context). A streamed call is a generator; closing it (or dropping it) ends the generation at once and frees its
session. Each call builds one
minillama.request.Request (its SamplingParams, stop strings, JSON constraint) and runs it (Llama.run); sampling is
llama.cpp's chain and order (logit_bias, grammar, penalties, top_k, top_p, min_p, temperature).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .chat_template import ChatTemplate
from .constrain import JsonConstraint, gbnf_to_lark, json_constraint, schema_of
from .errors import ArgumentError, ArgumentTypeError, UnsupportedError
from .generate import Generation, chat_prompt
from .model import AUTO, Model, Session, Threads
from .model.cache import Prefix
from .request import RANDOM_SEED, ReasoningBudget, Request, SamplingParams
from .tokenizer import Tokenizer
from .toolcalls import Plan, StreamSplitter, detect, opened_thinking, thinks
from .toolcalls.lazy import LazyConstraint

__all__ = ["Llama", "LlamaGrammar", "LlamaState", "Stream", "POOLING", "FINISH_REASONS", "CHATML_TEMPLATE",
           "IGNORED_KEYWORDS", "CHAT_FORMATS", "REASONING_EFFORTS"]

#: GenerationStats.stop_reason -> OpenAI's finish_reason ("stopped": closed early by the caller).
FINISH_REASONS: dict[str, str | None] = {"eog": "stop", "stop_string": "stop", "next_turn": "stop",
                                         "max_tokens": "length", "context": "length", "stopped": None}

#: llama.cpp's pooling types ({arch}.pooling_type, --pooling): how token states become one embedding, or for "rank"
#: a reranker's relevance score (Llama.rank).
POOLING: dict[int, str] = {1: "mean", 2: "cls", 3: "last", 4: "rank"}

#: pooling name -> the vector it makes of the hidden states [n_tokens, n_embd] (llama.cpp's build_pooling).
POOL = {"mean": lambda h: h.mean(axis=0), "cls": lambda h: h[0], "last": lambda h: h[-1]}

#: llama.cpp's default chat template (common/chat.cpp, CHATML_TEMPLATE_SRC): what chat renders with when the file
#: has no tokenizer.chat_template, as llama-server falls back to it, and what chat_format="chatml" names.
CHATML_TEMPLATE = ("{%- for message in messages -%}\n"
                   "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
                   "{%- endfor -%}\n"
                   "{%- if add_generation_prompt -%}\n"
                   "  {{- '<|im_start|>assistant\n' -}}\n"
                   "{%- endif -%}")

#: llama-cpp-python's Llama keywords that mean nothing on minillama's CPU runtime (GPU offload, memory mapping,
#: llama.cpp's batch and thread split, logging, KV layout): accepted whatever their value, and ignored.
IGNORED_KEYWORDS = frozenset({
    "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "use_mmap", "use_mlock", "n_ubatch",
    "n_threads_batch", "offload_kqv", "flash_attn", "op_offload", "swa_full", "no_perf", "last_n_tokens_size",
    "numa", "logits_all", "verbose"})

#: llama-cpp-python's Llama keywords that would change what the model computes (a LoRA, RoPE scaling, metadata
#: overrides, another tokenizer or chat handler, a quantized KV cache): accepted only at the value that leaves
#: the model as the file says (their defaults); anything else is an UnsupportedError naming the keyword.
DEFAULT_ONLY_KEYWORDS: dict[str, Any] = {
    "vocab_only": False, "kv_overrides": None, "rope_scaling_type": -1, "rope_freq_base": 0.0,
    "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0,
    "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0, "attention_type": -1, "lora_base": None, "lora_scale": 1.0,
    "lora_path": None, "chat_handler": None, "draft_model": None, "tokenizer": None, "spm_infill": False,
    "type_k": None, "type_v": None}

#: create_* keywords of llama-cpp-python's samplers and hooks minillama does not have, with the value that leaves
#: them off (ANY: any value, as it only matters when another is on); another value is an UnsupportedError.
_ANY = object()
NEUTRAL_CALL_KEYWORDS: dict[str, Any] = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0, "mirostat_tau": _ANY,
                                         "mirostat_eta": _ANY, "logits_processor": None, "stopping_criteria": None,
                                         "suffix": None}

#: chat_format names (llama-cpp-python's) -> a text their templates hold: a name is accepted when the template
#: in use holds its text (the file's own family), and "chatml" also when it does not (llama.cpp's ChatML then).
CHAT_FORMATS: dict[str, str] = {"chatml": "<|im_start|>", "qwen": "<|im_start|>", "llama-3": "<|start_header_id|>",
                                "llama-2": "[INST]", "mistral-instruct": "[INST]", "gemma": "<start_of_turn>",
                                "phi-3": "<|end|>", "zephyr": "<|user|>"}

#: OpenAI's reasoning_effort values; chat passes the one given to the template as a variable (gpt-oss reads it).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")

#: The metadata key of a reranker's prompt (llama_model_chat_template(model, "rerank")): {query} and {document}.
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"

#: llama.cpp's LLAMA_TOKEN_NULL: what token_bos()/token_eos() answer for a vocab without that token.
TOKEN_NULL = -1

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
    no model step is asked for after it (Generation.cancel); the next call reuses its session's cache, as after a call
    that ran to its end."""

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


class _Count(int):
    """A count that is also callable: Llama.n_ctx as minillama's attribute and llama-cpp-python's n_ctx()."""

    def __call__(self) -> int:
        return int(self)


class LlamaGrammar:
    """A grammar the reply must follow (llama-cpp-python's LlamaGrammar): llama.cpp's GBNF (or a Lark grammar),
    or a JSON schema, enforced through llguidance as response_format's schemas are."""

    def __init__(self, *, gbnf: str | None = None, schema: Mapping[str, Any] | None = None) -> None:
        self.gbnf, self.schema = gbnf, schema
        if gbnf is not None:
            self._lark = gbnf_to_lark(gbnf)  # a bad grammar fails here, as llama-cpp-python's does

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """A GBNF grammar's text (root ::= ...); ArgumentError when it does not parse."""
        return cls(gbnf=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        """A GBNF grammar read from a file."""
        with open(file, encoding="utf-8") as f:
            return cls(gbnf=f.read())

    @classmethod
    def from_json_schema(cls, json_schema: str | Mapping[str, Any], verbose: bool = True) -> LlamaGrammar:
        """A JSON schema (its JSON text, as llama-cpp-python takes it, or a dict): the reply is a JSON value of it."""
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(json_schema)
            except ValueError as e:
                raise ArgumentError(f"expected a JSON schema as JSON text, found text that does not parse: {e}") \
                    from None
        schema = schema_of({"type": "json_schema", "json_schema": {"schema": json_schema}})
        return cls(schema=schema)

    def constraint(self, tok: Tokenizer) -> JsonConstraint:
        """The grammar's state for one reply."""
        if self.gbnf is not None:
            return JsonConstraint(tok, None, lark=self._lark)
        return JsonConstraint(tok, self.schema)


def _grammar(grammar: Any) -> LlamaGrammar:
    """grammar= as a LlamaGrammar: one already, or GBNF text."""
    if isinstance(grammar, LlamaGrammar):
        return grammar
    if isinstance(grammar, str):
        return LlamaGrammar.from_string(grammar)
    raise ArgumentTypeError(f"expected grammar as a LlamaGrammar or GBNF text, found {type(grammar).__name__}")


class LlamaState:
    """A session's saved state (llama-cpp-python's LlamaState fields): the ids its KV cache holds (input_ids,
    n_tokens), the cache's key and value rows (llama_state, bytes; llama_state_size), the seed. scores is empty:
    minillama keeps no per-position logits. Picklable."""

    def __init__(self, input_ids: np.ndarray, scores: np.ndarray, n_tokens: int, llama_state: bytes,
                 llama_state_size: int, seed: int) -> None:
        self.input_ids, self.scores, self.n_tokens = input_ids, scores, n_tokens
        self.llama_state, self.llama_state_size, self.seed = llama_state, llama_state_size, seed

    @classmethod
    def of(cls, prefix: Prefix, seed: int, n_vocab: int) -> LlamaState:
        """The state holding prefix (a session's export_prefix)."""
        buf = io.BytesIO()
        np.savez(buf, *prefix.k, *prefix.v)
        data = buf.getvalue()
        return cls(np.array(prefix.ids, np.intc), np.zeros((0, n_vocab), np.single), prefix.n, data, len(data), seed)

    def prefix(self) -> Prefix:
        """The saved prefix, for a session's import_prefix (ArgumentError when the bytes are not a state's)."""
        try:
            with np.load(io.BytesIO(self.llama_state), allow_pickle=False) as z:
                arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
        except (OSError, ValueError, KeyError) as e:
            raise ArgumentError(f"expected a LlamaState from save_state, found llama_state bytes that do not load: "
                                f"{e}") from None
        half = len(arrays) // 2
        ids = [int(i) for i in self.input_ids]
        if len(arrays) % 2 or any(len(a) != len(ids) for a in arrays):
            raise ArgumentError(f"expected a LlamaState whose rows match its {len(ids)} input_ids, found others")
        return Prefix(ids, arrays[:half], arrays[half:])


class Llama:
    """A loaded GGUF model and its tokenizer, answering llama-cpp-python's / OpenAI's calls.

    n_ctx caps the context (None or 0: the model's; an int that is also callable, llama-cpp-python's n_ctx());
    seed is the default seed of every call (-1: a fresh random seed per call); threads (or llama-cpp-python's
    n_threads): BLAS threads of the forward pass as Model.from_file takes them, None meaning minillama's default
    "auto"; pooling "mean", "cls" or "last" (or llama-cpp-python's pooling_type 1, 2, 3) overrides the file's
    {arch}.pooling_type for create_embedding (mean when the file says none), and "rank" (pooling_type 4, a
    reranker's) makes it a reranker (rank; checked now as llama.cpp checks it); model_name is the "model" the
    results name (default: the file's name); batch_steps=True runs the single-token steps of requests that come
    at the same time as one pass (worth it from 2 at once on the native backend, about 4 on the pure one:
    minillama/model/batch.py); chat_template: a Jinja chat template to use instead of the file's (checked now);
    chat_format: llama-cpp-python's name of a chat format, accepted when it names the template in use ("chatml"
    also when it does not: llama.cpp's ChatML then). A file without a chat template chats in ChatML, as
    llama-server does (chat_template_fallback is then True).

    Also accepted: n_batch (kept as self.n_batch; prompts run in passes of minillama's own size), embedding
    (create_embedding works either way), the keywords in IGNORED_KEYWORDS (ignored) and those in
    DEFAULT_ONLY_KEYWORDS at their defaults. Any other keyword is an ArgumentTypeError naming it.
    """

    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int | None = None, seed: int = RANDOM_SEED,
                 threads: Threads = None, *, n_threads: int | None = None, n_batch: int = 512,
                 embedding: bool = False, chat_format: str | None = None, pooling: str | None = None,
                 pooling_type: int = -1, model_name: str | None = None, batch_steps: bool = False,
                 verbose: bool = False, chat_template: str | None = None, **kwargs: Any) -> None:
        _check_keywords("Llama", kwargs, IGNORED_KEYWORDS, DEFAULT_ONLY_KEYWORDS)
        path = os.fspath(model_path)
        if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 0):
            raise ArgumentError(f"expected n_ctx as a count of tokens (0 or None: the model's), found {n_ctx!r}")
        if seed is not None and seed < 0 and seed != RANDOM_SEED:
            raise ArgumentError(f"expected a seed of 0 or more (or {RANDOM_SEED} for a random one), found {seed}")
        if n_threads is not None:
            if threads is not None:
                raise ArgumentError(f"expected threads or n_threads (the same setting), found both: threads="
                                    f"{threads!r}, n_threads={n_threads!r}")
            threads = n_threads
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch < 1:
            raise ArgumentError(f"expected n_batch as a count of tokens of 1 or more, found {n_batch!r}")
        if pooling_type != -1:
            if pooling is not None or pooling_type not in POOLING:
                raise ArgumentError(f"expected pooling_type -1 (the file's), 1 (mean), 2 (cls), 3 (last) or 4 (rank), and "
                                    f"not with pooling=, found pooling_type={pooling_type!r}")
            pooling = POOLING[pooling_type]
        self.model_path = path
        self.model = Model.from_file(path, threads=AUTO if threads is None else threads)
        self.tokenizer = Tokenizer.from_file(path)
        #: Most tokens a request (prompt and reply) may hold.
        self.n_ctx = _Count(self.model.n_ctx if not n_ctx else min(n_ctx, self.model.n_ctx))
        #: llama-cpp-python's n_batch, kept for scripts that read it (minillama's prompt passes have their size).
        self.n_batch = min(n_batch, self.n_ctx)
        #: llama-server's --context-shift for every request run here (Request.context_shift): a full context
        #: drops old positions and goes on, where the model can (Model.can_shift); off: the reply stops there.
        self.context_shift = False
        self.embedding = bool(embedding)
        self.seed = seed
        self.model_name = model_name or os.path.basename(path)
        self.verbose = verbose
        self.pooling = self._pooling(pooling)
        if self.pooling == "rank":
            self._check_rank()
        #: Requests' single-token steps that come at the same time share one pass (minillama/model/batch.py).
        self.batch_steps = batch_steps
        #: True when the file has no chat template and none was given: chat renders with CHATML_TEMPLATE.
        self.chat_template_fallback = chat_template is None and self.tokenizer.chat_template is None
        self.chat_format = chat_format
        chat_template = self._chat_format_template(chat_format, chat_template)
        #: The Jinja chat template chat uses instead of the file's (llama-server's --chat-template-file), or None.
        self.chat_template = chat_template
        self._template: ChatTemplate | None = None
        self._template_lock = threading.Lock()
        if chat_template is not None:
            self._chat_template()  # a template that does not compile fails here, not at the first chat
        # save_state/load_state: the session the last call without session= ran in, and the one the next such
        # call resumes (load_state)
        self._state_lock = threading.Lock()
        self._last_session: Session | None = None
        self._resume: Session | None = None
        #: The session of the last call without session= that finished, until another such call takes it.
        self._idle: Session | None = None
        self._own_runs: weakref.WeakSet[Generation] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"Llama({self.model_path!r}, n_ctx={self.n_ctx})"

    # -- llama-cpp-python's accessors ------------------------------------------------------------------------

    def n_vocab(self) -> int:
        """Tokens in the vocab (llama_n_vocab)."""
        return self.tokenizer.n_vocab

    def token_eos(self) -> int:
        """The end-of-sequence id (-1 when the vocab has none, llama.cpp's LLAMA_TOKEN_NULL)."""
        eos = self.tokenizer.eos_id
        return TOKEN_NULL if eos is None else eos

    def token_bos(self) -> int:
        """The beginning-of-sequence id (-1 when the vocab has none)."""
        bos = self.tokenizer.bos_id
        return TOKEN_NULL if bos is None else bos

    # -- tokens ----------------------------------------------------------------------------------------------

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False, *,
                 add_special: bool | None = None, parse_special: bool | None = None) -> list[int]:
        """llama.cpp's ids for text, as llama-cpp-python's tokenize (llama_tokenize): add_bos adds the vocab's
        bos/eos as the file says (llama.cpp's add_special), special matches control tokens written in the text
        (parse_special; both names accepted). Bytes are tokenized as they are, invalid UTF-8 included."""
        add = add_bos if add_special is None else add_special
        parse = special if parse_special is None else parse_special
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8", "surrogateescape")
        elif not isinstance(text, str):
            raise ArgumentTypeError(f"expected text as str or bytes, found {type(text).__name__}")
        return self.tokenizer.encode(text, add_special=add, parse_special=parse)

    def detokenize(self, ids: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of ids as llama-cpp-python's detokenize gives them: each id's llama_token_to_piece (control
        tokens empty unless special) joined, less the leading space when the first id is bos. prev_tokens is
        accepted and unused, as llama-cpp-python's own tokenizer does."""
        out = b"".join(self.tokenizer.token_to_piece(i, special=special) for i in ids)
        bos = self.tokenizer.bos_id
        return out[1:] if ids and bos is not None and ids[0] == bos and out[:1] == b" " else out

    def session(self) -> Session:
        """A sequence of its own on the model (a slot): pass it as session= to reuse its KV cache across calls."""
        return self.model.session(self.n_ctx, batched=self.batch_steps)

    # -- state -----------------------------------------------------------------------------------------------

    def save_state(self, session: Session | None = None) -> LlamaState:
        """session's KV cache and ids, or those of the session the last call without session= ran in (an empty
        state before any call), as llama-cpp-python's save_state keeps its context's."""
        if session is None:
            with self._state_lock:
                session = self._last_session or self.session()
        return LlamaState.of(session.export_prefix(), self.seed, self.tokenizer.n_vocab)

    def load_state(self, state: LlamaState, session: Session | None = None) -> Session:
        """Restore state (from save_state, on this model) into session, or into a new session that the next call
        without session= runs in (its prompt's shared prefix then comes from the cache); the session returned."""
        if not isinstance(state, LlamaState):
            raise ArgumentTypeError(f"expected a LlamaState from save_state, found {type(state).__name__}")
        target = session or self.session()
        target.import_prefix(state.prefix())
        if session is None:
            with self._state_lock:
                self._resume = target
        return target

    # -- completions -----------------------------------------------------------------------------------------

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                          stop: str | Sequence[str] | None = None, stream: bool = False, logprobs: int | None = None,
                          seed: int | None = None, repeat_penalty: float = 1.0, presence_penalty: float = 0.0,
                          frequency_penalty: float = 0.0, logit_bias: Mapping[int, float] | None = None,
                          response_format: Mapping[str, Any] | None = None, echo: bool = False, *,
                          repeat_last_n: int = 64, model: str | None = None, session: Session | None = None,
                          stream_options: Mapping[str, Any] | None = None, grammar: LlamaGrammar | str | None = None,
                          **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's text_completion for prompt (a str, encoded with bos and control tokens matched, or ids), or
        with stream=True an iterator of text_completion chunks (the last one carries finish_reason).

        max_tokens None or <= 0: until the context is full. logprobs=N (0..5): each token's log-probability and the
        N best, in the completions API's shape. echo puts the prompt text before the reply (its tokens get no
        logprobs). grammar: a LlamaGrammar or GBNF text the reply follows. llama-cpp-python's sampler keywords
        minillama lacks are accepted at their neutral values (NEUTRAL_CALL_KEYWORDS); any other keyword is an
        ArgumentTypeError naming it.
        """
        _check_keywords("create_completion", kwargs, frozenset(), NEUTRAL_CALL_KEYWORDS)
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise ArgumentError(f"expected logprobs between 0 and {MAX_LOGPROBS}, found {logprobs}")
        ids = self._prompt_ids(prompt)
        sampling = self._sampling(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                                  repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  logit_bias=logit_bias, n_probs=0 if logprobs is None else max(logprobs, 1))
        run = self.run(self._request(ids, max_tokens, sampling, stop, response_format, grammar), session)
        head = {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": model or self.model_name}
        prefix = (prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)) if echo else ""
        want = logprobs if logprobs is not None else None
        if stream:
            return Stream(self._completion_chunks(run, head, prefix, want, stream_options), run)
        text = prefix + "".join(run)
        self._finished(run)
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
                               reasoning_effort: str | None = None, grammar: LlamaGrammar | str | None = None,
                               reasoning_budget_tokens: int = -1,
                               reasoning_budget_message: str | None = None,
                               **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's chat.completion for messages, rendered with the GGUF's chat template (in its sandbox), or with
        stream=True an iterator of chat.completion.chunk dicts (a first one with the role, the last one with
        finish_reason). Defaults as llama-cpp-python's. logprobs=True, top_logprobs=N (0..20): the chat API's
        logprobs.content list. A message's content
        may be OpenAI's list of parts: text parts are joined by newlines (as llama.cpp's server joins them), any
        other part is an ArgumentError (the model takes text only).

        tools (OpenAI's function tools), tool_choice ("auto", "none", "required" or {"type": "function",
        "function": {"name": ...}}) and parallel_tool_calls: the reply's calls come as message.tool_calls with
        finish_reason "tool_calls", parsed in the format of the template's family (minillama.toolcalls); with
        "required" or a named function the reply is constrained to a call whose arguments follow the function's
        schema; a template without tool support gets llama.cpp's generic JSON format (always constrained). Messages
        may hold an assistant's tool_calls and "tool" results. reasoning_format ("auto", the default, "deepseek"
        or "none"): thinking (<think>...</think>) goes to message.reasoning_content. chat_template_kwargs are
        template variables (e.g. {"enable_thinking": False}), as llama.cpp's server takes them; reasoning_effort
        (one of REASONING_EFFORTS) is the template variable gpt-oss templates read. reasoning_budget_tokens: at
        most this many tokens of thinking (0: none; -1, the default: unbounded), then reasoning_budget_message (if any)
        and the end tag are written, as llama.cpp's --reasoning-budget does. grammar: a LlamaGrammar or
        GBNF text the reply follows. Any other keyword is an ArgumentTypeError naming it (llama-cpp-python's
        sampler keywords at their neutral values aside).
        """
        _check_keywords("create_chat_completion", kwargs, frozenset(), NEUTRAL_CALL_KEYWORDS,
                        hint="; template variables go in chat_template_kwargs={...}")
        if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
            raise ArgumentError(f"expected reasoning_effort {', '.join(REASONING_EFFORTS)}, found "
                                f"{reasoning_effort!r:.60}")
        if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ArgumentError(f"expected top_logprobs between 0 and {MAX_TOP_LOGPROBS}, found {top_logprobs}")
        if top_logprobs and not logprobs:
            raise ArgumentError("top_logprobs needs logprobs=True")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise ArgumentTypeError(f"expected chat_template_kwargs as a dict, found {type(chat_template_kwargs).__name__}")
        extra = dict(chat_template_kwargs or {})
        if reasoning_effort is not None:
            extra["reasoning_effort"] = reasoning_effort
        plan, ids, source = self._chat_setup(messages, tools, tool_choice, parallel_tool_calls, reasoning_format, extra)
        plan_grammar = plan.constraint_grammar()
        lazy = plan_grammar is None and bool(plan.lazy_triggers()) and response_format is None and grammar is None
        budget = self._reasoning_budget(reasoning_budget_tokens, reasoning_budget_message, plan, source, messages,
                                        extra, lazy)
        if plan_grammar is not None and (response_format is not None or grammar is not None):
            what = "response_format" if response_format is not None else "grammar"
            raise ArgumentError(f"expected either {what} or tools that constrain the reply, found both")
        think_open = opened_thinking(self.tokenizer.decode(ids[-4:])) if thinks(source) else ""
        sampling = self._sampling(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                                  repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  logit_bias=logit_bias, n_probs=max(top_logprobs or 0, 1) if logprobs else 0)
        request = self._request(ids, max_tokens, sampling, stop, response_format, grammar)
        if plan_grammar is not None:
            request = replace(request, constraint=JsonConstraint(self.tokenizer, None, lark=plan_grammar))
        elif lazy:
            request = replace(request, constraint=LazyConstraint(self.tokenizer, plan.lazy_triggers()))
        if budget is not None:
            request = replace(request, reasoning_budget=budget)
        run = self.run(request, session)
        head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()),
                "model": model or self.model_name}
        want = (top_logprobs or 0) if logprobs else None
        splitter = StreamSplitter(plan, think_open)
        if stream:
            return Stream(self._chat_chunks(run, head, want, stream_options, splitter), run)
        _, parsed = splitter.finish("".join(run))
        self._finished(run)
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
                          parallel_tool_calls: bool = False,
                          chat_template_kwargs: Mapping[str, Any] | None = None) -> int:
        """The prompt's length in tokens for create_chat_completion with these messages and tools, without running
        the model (Anthropic's count_tokens)."""
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise ArgumentTypeError(f"expected chat_template_kwargs as a dict, found {type(chat_template_kwargs).__name__}")
        return len(self._chat_setup(messages, tools, tool_choice, parallel_tool_calls, "auto",
                                    dict(chat_template_kwargs or {}))[1])

    def _reasoning_budget(self, tokens: int | None, message: str | None, plan: Plan, source: str | None,
                          messages: Sequence[Mapping[str, Any]], extra: dict[str, Any],
                          lazy: bool = False) -> ReasoningBudget | None:
        """A chat call's reasoning budget (None when the template does not think, or when unbounded and no lazy
        tool-call constraint needs it to wait out the thinking, as llama.cpp's): the family's tags, and the ids of
        the template's generation prompt (what rendering with add_generation_prompt adds: llama.cpp's
        generation_prompt) for the count to see first."""
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
            raise ArgumentTypeError(f"expected reasoning_budget_tokens as an int, found {tokens!r:.60}")
        if message is not None and not isinstance(message, str):
            raise ArgumentTypeError(f"expected reasoning_budget_message as a str, found {message!r:.60}")
        tokens = -1 if tokens is None else tokens
        ReasoningBudget(tokens, (), ())  # checked, also when it is not used
        if (tokens == -1 and not lazy) or not thinks(source):
            return None
        from .reasoning_budget import make_budget

        if plan.tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            messages = plan.messages(messages)
        flat = [_flat_message(m, i) for i, m in enumerate(messages)]
        template = self._chat_template()
        assert template is not None
        without, with_prompt = (template.render(flat, add_generation_prompt=g, **extra) for g in (False, True))
        n = 0
        while n < min(len(without), len(with_prompt)) and without[n] == with_prompt[n]:
            n += 1
        return make_budget(self.tokenizer, plan.family, tokens, message or "", with_prompt[n:])

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
        as llama-server encodes them. With pooling "rank" there are no embeddings (UnsupportedError): rank scores."""
        if self.pooling == "rank":
            raise UnsupportedError("pooling 'rank' (a reranker's) gives relevance scores, not embeddings: expected "
                                   "Llama.rank (the server's /rerank), or another pooling (mean, cls, last) to embed")
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

    # -- reranking -------------------------------------------------------------------------------------------

    def rank(self, query: str, documents: Sequence[str]) -> list[float]:
        """Each document's relevance to query, in the documents' order: llama.cpp's rank pooling of the pair's
        prompt (rerank_ids): the last position's final hidden state through the file's rank head (cls.output), a
        softmax over its outputs for a Qwen3 reranker, and the first value, as llama-server's /rerank scores it.
        A model without a rank head scores with its hidden state's first value, as llama.cpp does (meaningless:
        load a reranker)."""
        if not isinstance(query, str):
            raise ArgumentTypeError(f"expected query as a str, found {type(query).__name__}")
        if isinstance(documents, str | bytes) or not isinstance(documents, Sequence):
            raise ArgumentTypeError(f"expected documents as a list of str, found {type(documents).__name__}")
        bad = next((d for d in documents if not isinstance(d, str)), None)
        if bad is not None:
            raise ArgumentTypeError(f"expected documents as a list of str, found a {type(bad).__name__} in it")
        return [self.rank_ids(self.rerank_ids(query, d)) for d in documents]

    def rank_ids(self, ids: Sequence[int]) -> float:
        """The relevance score of one prompt given as ids (see rank)."""
        ids = list(ids)
        if len(ids) > self.n_ctx:
            from .errors import ContextLengthError

            raise ContextLengthError(f"a rerank prompt has {len(ids)} tokens but the context holds {self.n_ctx}")
        return float(self.model.rank(ids)[0])

    def rerank_ids(self, query: str, document: str) -> list[int]:
        """The prompt llama-server scores for a (query, document) pair (format_prompt_rerank): the file's rerank
        prompt (tokenizer.chat_template.rerank) with {query} then {document} put in, encoded with control tokens
        matched and no bos; without one, bos (when the vocab adds it), the query, eos (when it adds eos), sep
        (when it adds sep), the document, eos (when it adds eos), each text encoded as plain text."""
        tok, vocab = self.tokenizer, self.tokenizer.vocab
        template = vocab.metadata.get(RERANK_TEMPLATE_KEY)
        if isinstance(template, str):
            prompt = template.replace("{query}", query).replace("{document}", document)
            return tok.encode(prompt, add_special=False, parse_special=True)
        special = vocab.special
        eos = special.get("eos") if special.get("eos") is not None else special.get("sep")

        def plain(text: str) -> list[int]:
            return tok.encode(text, add_special=False, parse_special=False)

        ids = [special["bos"]] if vocab.add_bos and special.get("bos") is not None else []
        ids += plain(query)
        ids += [eos] if vocab.add_eos and eos is not None else []
        ids += [special["sep"]] if vocab.add_sep and special.get("sep") is not None else []
        ids += plain(document)
        ids += [eos] if vocab.add_eos and eos is not None else []
        return ids

    def _check_rank(self) -> None:
        """UnsupportedError where llama.cpp refuses rank pooling on this vocab (common_init_from_params): no bos
        token, or neither an eos nor a sep token nor a rerank prompt to join the query and the document with."""
        special, metadata = self.tokenizer.vocab.special, self.tokenizer.vocab.metadata
        if special.get("bos") is None:
            raise UnsupportedError(f"{self.model_path}: expected a vocab with a bos token for pooling 'rank' "
                                   "(reranking), found none (llama.cpp refuses it too)")
        if special.get("eos") is None and special.get("sep") is None and RERANK_TEMPLATE_KEY not in metadata:
            raise UnsupportedError(f"{self.model_path}: expected an eos or sep token, or a rerank prompt "
                                   f"({RERANK_TEMPLATE_KEY}), for pooling 'rank' (reranking), found none (llama.cpp "
                                   "refuses it too)")

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
        """The template chat renders with: chat_template, else the file's, else llama.cpp's ChatML."""
        with self._template_lock:
            if self._template is None:
                source = CHATML_TEMPLATE if self.chat_template_fallback else self.chat_template
                self._template = self.tokenizer.build_chat_template(source)
            return self._template

    def _chat_format_template(self, chat_format: str | None, chat_template: str | None) -> str | None:
        """The chat_template to use given llama-cpp-python's chat_format: chat_template unchanged when the name
        is that of the template in use, CHATML_TEMPLATE for "chatml" otherwise; ArgumentError for any other."""
        if chat_format is None:
            return chat_template
        source = chat_template if chat_template is not None else self.tokenizer.chat_template
        if source is None and chat_format == "chatml":
            return chat_template  # the fallback is ChatML already
        own = [name for name, mark in CHAT_FORMATS.items() if source is not None and mark in source]
        if chat_format in own:
            return chat_template
        if chat_format == "chatml":
            self.chat_template_fallback = False
            return CHATML_TEMPLATE
        raise ArgumentError(f"chat_format {chat_format!r} is not the format of this file's chat template: expected "
                            f"None, 'chatml' (llama.cpp's ChatML) or {', '.join(map(repr, own)) or 'no other name'} "
                            "(minillama renders the GGUF's own template; chat_template= takes another)")

    def _chat_prompt(self, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]) -> list[int]:
        """messages rendered with the file's chat template (add_generation_prompt) and encoded."""
        if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not all(
                isinstance(m, Mapping) and "role" in m for m in messages):
            raise ArgumentTypeError("expected messages as a list of {'role': ..., 'content': ...} dicts")
        if not messages:
            raise ArgumentError("expected at least one message, found none")
        messages = [_flat_message(m, i) for i, m in enumerate(messages)]
        template = self._chat_template()
        assert template is not None  # the file's, the one given, or ChatML
        return chat_prompt(self.tokenizer, template, messages, **kwargs)[0]

    def _sampling(self, seed: int | None, **settings: Any) -> SamplingParams:
        """A call's SamplingParams: its settings, its seed or else the Llama's."""
        return SamplingParams(seed=self.seed if seed is None else seed, **settings)

    def _request(self, ids: list[int], max_tokens: int | None, sampling: SamplingParams,
                 stop: str | Sequence[str] | None, response_format: Mapping[str, Any] | None,
                 grammar: LlamaGrammar | str | None = None) -> Request:
        """A call's Request: max_tokens None or <= 0 meaning until the context is full, a response_format's JSON
        constraint or a grammar's (not both)."""
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise ArgumentTypeError(f"expected max_tokens as an int or None, found {max_tokens!r}")
        limit = self.n_ctx if max_tokens is None or max_tokens <= 0 else max_tokens
        request = Request(ids, limit, sampling, stop=stop or ())  # stop checked before the grammar is built
        if grammar is not None:
            if response_format is not None:
                raise ArgumentError("expected either grammar or response_format, found both")
            return replace(request, constraint=_grammar(grammar).constraint(self.tokenizer))
        return replace(request, constraint=json_constraint(self.tokenizer, response_format))

    def run(self, request: Request, session: Session | None = None) -> Generation:
        """The Generation of request in a session: the one given, else the one load_state prepared, else the last
        ended call's (its cached prefix reused), else a new one (kept for save_state and the next call)."""
        own = session is None
        if session is None:
            with self._state_lock:
                session = self._resume or self._idle or self.session()
                if session is self._idle:
                    self._idle = None
                    if self._last_session is session:  # running again: save_state must not read it meanwhile
                        self._last_session = None
                self._resume = None
        if self.context_shift and not request.context_shift:
            request = replace(request, context_shift=True)
        gen = Generation(session, self.tokenizer, request)
        if hasattr(session, "generation"):
            session.generation = gen  # a server slot's: its stop string (Anthropic's stop_sequence)
        if own:
            self._own_runs.add(gen)
        return gen

    def _finished(self, run: Generation) -> None:
        """run has ended, by itself or closed early: its session (when the call made it) is what save_state() saves
        and what the next call reuses (its cache holds every id fed so far), as llama-cpp-python keeps its context."""
        if run in self._own_runs:
            with self._state_lock:
                self._last_session = self._idle = run.model  # type: ignore[assignment]

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
            self._finished(run)
            ids = run.reply
            lp = self._completion_logprobs(run, offsets, ids, want, len(prefix), done) \
                if want is not None and len(ids) > done else None
            yield chunk("", lp, _finish_reason(run))
            if stream_options and stream_options.get("include_usage"):
                yield {**head, "choices": [], "usage": _usage(run)}
        finally:
            run.close()  # a client gone: end the generation now
            self._finished(run)  # its cache stays for the next call

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
            self._finished(run)
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
            self._finished(run)



def _check_keywords(where: str, kwargs: Mapping[str, Any], ignored: frozenset[str], neutral: Mapping[str, Any],
                    hint: str = "") -> None:
    """ArgumentTypeError naming a keyword where takes in no form, UnsupportedError naming one of neutral given
    another value than its neutral one; those in ignored pass whatever their value."""
    for name, value in kwargs.items():
        if name in ignored:
            continue
        if name in neutral:
            want = neutral[name]
            if want is not _ANY and not (value is want or (want is not None and value == want)):
                raise UnsupportedError(f"{where}({name}={value!r:.60}) is not supported by minillama: expected "
                                       f"{name}={want!r} (its default) or no {name}")
            continue
        extra = "; functions/function_call are tools/tool_choice now" if name in ("functions", "function_call") \
            else hint
        raise ArgumentTypeError(f"{where}() got an unknown keyword argument {name!r}: expected one of its "
                                f"parameters (docs/model.md lists those of llama-cpp-python it accepts){extra}")
