"""`minillama chat`: a terminal chat with a language model, the reply streamed token by token.

The conversation is rendered to text with the GGUF's own chat template (`tokenizer.chat_template`,
a Jinja2 template, rendered the way Hugging Face transformers' apply_chat_template does) or, when the
file has none, with a plain "User: ...\\nAssistant:" transcript; the text is encoded and handed to
minillama.generate. The REPL uses prompt-toolkit on a terminal and plain input() otherwise (piped input).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TextIO

from .chat_template import ChatTemplate, without_bos
from .constrain import json_constraint
from .errors import ContextLengthError, MinillamaError
from .generate import (
    ChatFormat,
    Generation,
    GenerationStats,
    LanguageModel,
    chat_prompt,
    context_length,
    perf_lines,
)
from .ngram import DEFAULT_ORDER, NGramModel, read_paragraphs
from .request import RANDOM_SEED, Request, SamplingParams
from .tokenizer import Tokenizer

Message = Mapping[str, str]

HELP = """\
Type a message and press Enter; the reply streams as it is generated.
  /help     this list
  /reset    forget the conversation
  /tokens   the last reply's token ids and pieces
  /stats    the last reply's prompt and generation speeds (llama.cpp's timing lines), and the conversation's
  /exit     leave (as does Ctrl-D)
Ctrl-C stops a reply and returns to the prompt."""

PROMPT = "> "

# Control characters (but tab and newline) are shown as Unicode control pictures on a terminal, so generated
# text cannot send escape sequences to it.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)} | {0x7F: 0x2421}


# ---------------------------------------------------------------------------------------------
# Prompt formats


class SimpleFormat:
    """The fallback without a template: 'User: ...' and 'Assistant: ...' lines, ending with 'Assistant:'.

    A model that knows no end-of-turn token for it writes on into the next turn ("...\nUser: What is..."):
    a reply ends where a line of the transcript's own begins (turn_markers), the marker not shown.
    """

    turn_markers = ("\nUser:", "\nAssistant:", "\nSystem:")

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """One 'Role: content' line per message, then 'Assistant:' for the reply."""
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
        return text + ("Assistant:" if add_generation_prompt else "")


def template_of(tok: Tokenizer) -> ChatTemplate | None:
    """The template in the tokenizer's metadata (`tokenizer.chat_template`), or None when it has none."""
    return tok.build_chat_template()


def format_for(tok: Tokenizer) -> ChatFormat:
    """The tokenizer's chat template, or SimpleFormat when it has none (ChatTemplateError if it does not compile)."""
    return template_of(tok) or SimpleFormat()


def format_without_bos(text: str, fmt: ChatFormat, tok: Tokenizer) -> str:
    """Text fmt rendered, without a leading bos text when tok's encoding adds bos itself (never two bos)."""
    return without_bos(text, getattr(fmt, "bos_token", ""), tok.add_bos)


def chat_documents(fmt: ChatFormat, texts: Sequence[str]) -> list[str]:
    """Consecutive paragraphs as user/assistant exchanges rendered with fmt: text that shows the turn format."""
    return [fmt.render([{"role": "user", "content": a}, {"role": "assistant", "content": b}],
                       add_generation_prompt=False) for a, b in itertools.pairwise(texts)]


def train_chat_ngram(tok: Tokenizer, fmt: ChatFormat, paths: Iterable[str | os.PathLike[str]],
                     order: int = DEFAULT_ORDER) -> NGramModel:
    """An n-gram trained on the paragraphs of text files rendered as conversations (see chat_documents).

    Trained on plain paragraphs, the model has never seen 'Assistant:' (or '<|im_start|>assistant')
    and often ends the reply at once; trained this way it answers with a paragraph in the style of
    the text and ends it as the format does (the template's end-of-turn token, or eos).
    """
    rendered = [format_without_bos(d, fmt, tok) for d in chat_documents(fmt, read_paragraphs(paths))]
    return NGramModel.train(tok, rendered, order, parse_special=True)


#: A reply: the Generation of one turn (its text ends before the transcript's next turn, when the format has
#: turn markers).
Reply = Generation


# ---------------------------------------------------------------------------------------------
# The conversation


def Settings(max_tokens: int = 256, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,  # noqa: N802
             seed: int | None = None, stop_at_eog: bool = True) -> Request:
    """How replies are generated, as the chat's old settings were spelled: a Request with no prompt (min_p 0)."""
    return Request((), max_tokens, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                                  min_p=0.0), stop_at_eog=stop_at_eog)


class ChatSession:
    """A conversation: its messages, how to render them, and the last reply's generation and stats.

    settings: the Request each reply starts from (its prompt is ignored: each reply's is the conversation);
    each reply uses its sampling seed + its turn number, so a whole session repeats, and ends before its stop
    strings and, with a format that has turn markers (SimpleFormat), before the transcript's next turn.
    response_format (the server's; e.g. a json_schema): each reply is constrained to that JSON (a grammar of its
    own per reply)."""

    def __init__(self, tok: Tokenizer, model: LanguageModel, fmt: ChatFormat, settings: Request,
                 system: str | None = None, response_format: Mapping[str, Any] | None = None) -> None:
        self.tok, self.model, self.fmt, self.settings, self.system = tok, model, fmt, settings, system
        self.response_format = response_format
        json_constraint(tok, response_format)  # a bad schema fails now, not at the first reply
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (and its totals)."""
        self.messages: list[dict[str, str]] = [{"role": "system", "content": self.system}] if self.system else []
        self.dropped = 0  # exchanges the last reply's prompt left out to fit the model's context
        self.last: Reply | None = None
        self.turns = 0
        self.generated_tokens = 0
        self.seconds = 0.0
        self.totals = GenerationStats()  # prompt and generation timings of every reply, summed

    def prompt_text(self) -> str:
        """The conversation rendered, without a leading bos text when encoding adds bos itself."""
        return format_without_bos(self.fmt.render(self.messages, add_generation_prompt=True), self.fmt, self.tok)

    def start_reply(self, user_text: str) -> Reply:
        """Add the user's message and start generating the reply (iterate the result for its text); with a
        format that has turn markers (SimpleFormat), the reply ends before the first one it writes, as it
        ends at an end-of-generation token (neither with stop_at_eog=False)."""
        self.messages.append({"role": "user", "content": user_text})
        s = self.settings
        seed = s.sampling.seed
        seed = seed if seed is None or seed == RANDOM_SEED else seed + self.turns
        try:
            ids = self.fit_context()
        except Exception:
            self.messages.pop()
            raise
        markers = getattr(self.fmt, "turn_markers", ()) if s.stop_at_eog else ()  # --ignore-eos: on to max_tokens
        request = replace(s, prompt=ids, sampling=replace(s.sampling, seed=seed),
                          constraint=json_constraint(self.tok, self.response_format) or s.constraint)
        if markers:  # the transcript's next turn ends the reply ("next_turn"), as a stop string of the user's
            request = replace(request, stop=(*s.stop, *markers), stop_reason="next_turn")
        reply = Generation(self.model, self.tok, request)
        self.last = reply
        return reply

    def fit_context(self) -> list[int]:
        """The conversation's prompt ids, its oldest exchanges dropped until the prompt and a reply of
        max_tokens fit the model's context (the system message and the new message are kept): chat_prompt,
        the renderer the API uses too.

        Exchanges go whole (a user message with the reply to it), so the roles still alternate as chat
        templates require. When the new message alone leaves no room at all, ContextLengthError.
        """
        ids, self.dropped = chat_prompt(self.tok, self.fmt, self.messages, reply_room=self.settings.max_tokens,
                                        n_ctx=context_length(self.model))
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        del self.messages[first:first + 2 * self.dropped]
        return ids

    def finish_reply(self, gen: Reply) -> None:
        """Record the reply (as far as it got) in the conversation and the totals."""
        self.messages.append({"role": "assistant", "content": gen.text.strip()})
        self.turns += 1
        self.generated_tokens += gen.stats.generated_tokens
        self.seconds += gen.stats.seconds
        t, st = self.totals, gen.stats
        t.prompt_tokens += st.prompt_tokens
        t.prompt_evaluated += st.prompt_evaluated
        t.prompt_seconds += st.prompt_seconds
        t.generated_tokens += st.eval_runs  # summed steps: eval_runs/eval_seconds stay per step
        t.seconds += st.seconds

    def tokens_report(self) -> str:
        """The last reply's ids and, one per line, each id with its piece."""
        gen = self.last
        if gen is None:
            return "No reply yet."
        shown = len(gen.reply)
        ids = gen.ids[:shown] + ([gen.eog_id] if gen.eog_id is not None else [])
        lines = [f"last reply: {len(ids)} tokens", "[" + ", ".join(map(str, ids)) + "]"]
        for n, i in enumerate(ids):
            piece = self.tok.token_to_piece(i, special=True).decode("utf-8", "backslashreplace")
            note = "  (end of generation)" if n == shown else ""  # the eog id that stopped the reply
            lines.append(f"{i:>8}  {piece!r}{note}")
        if shown < len(gen.ids):
            lines.append(f"then {len(gen.ids) - shown} tokens that began the next turn (not shown): "
                         f"{gen.ids[shown:]}")
        return "\n".join(lines)

    def stats_report(self) -> str:
        """Tokens per second and token counts of the last reply and of the conversation."""
        gen = self.last
        if gen is None:
            return "No reply yet."
        st = gen.stats
        why = {"eog": f"end-of-generation token {gen.eog_id}", "max_tokens": "--max-tokens",
               "context": "the model's full context", "stopped": "Ctrl-C",
               "next_turn": "the transcript's next turn"}.get(st.stop_reason, st.stop_reason or "running")
        t = self.totals
        eval_rate = t.generated_tokens / t.eval_seconds if t.eval_seconds > 0 else 0.0
        in_context = st.prompt_tokens + len(gen.ids)
        return "\n".join([
            f"last reply: {st.generated_tokens} tokens, prompt {st.prompt_tokens} tokens, stopped by {why}, "
            f"seed {st.seed}", *perf_lines(st),
            f"conversation: {self.turns} turn{'' if self.turns == 1 else 's'}, {in_context} tokens in context, "
            f"{self.generated_tokens} tokens generated in {self.seconds:.3f} s (prompt {t.prompt_tokens_per_second:.1f} "
            f"tokens/s, generation {eval_rate:.1f} tokens/s)"])


# ---------------------------------------------------------------------------------------------
# The REPL


def make_reader(stdin: TextIO, stdout: TextIO) -> Callable[[], str]:
    """A function reading one line: prompt-toolkit on a terminal, input() otherwise (EOFError at the end)."""
    if stdin.isatty() and stdout.isatty():
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory

        session: PromptSession[str] = PromptSession(history=InMemoryHistory())
        return lambda: session.prompt(PROMPT)

    if stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass

    def read_line() -> str:
        """input() with the prompt, echoing the line so a piped transcript reads like a session."""
        line = input(PROMPT)
        stdout.write(line + "\n")
        return line

    return read_line


def run_repl(session: ChatSession, read: Callable[[], str], out: TextIO) -> int:
    """Read messages and commands until Ctrl-D or /exit; stream each reply; return the exit status (0)."""
    safe = out.isatty()

    def say(text: str) -> None:
        """Write a line now."""
        out.write(text + "\n")
        out.flush()

    while True:
        try:
            line = read()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt
            continue
        except EOFError:  # Ctrl-D
            say("")
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            command = text.split()[0].lower()
            if command in ("/exit", "/quit"):
                return 0
            if command == "/help":
                say(HELP)
            elif command == "/reset":
                session.reset()
                say("Conversation forgotten.")
            elif command == "/tokens":
                say(session.tokens_report())
            elif command == "/stats":
                say(session.stats_report())
            else:
                say(f"Unknown command {command}; /help lists the commands.")
            continue
        _reply(session, text, out, safe)


def _reply(session: ChatSession, text: str, out: TextIO, safe: bool) -> None:
    """Generate and stream one reply; Ctrl-C stops it and keeps what was written."""
    gen: Reply | None = None
    try:
        try:
            gen = session.start_reply(text)
        except ContextLengthError as exc:
            out.write(f"error: {exc}\n")
            return
        except Exception as exc:  # e.g. a template's raise_exception()
            out.write(f"error: could not render the conversation: {exc}\n")
            return
        if session.dropped:
            n = session.dropped
            out.write(f"[the oldest {n} exchange{'' if n == 1 else 's'} forgotten to fit the model's context]\n")
        for chunk in gen:
            out.write(chunk.translate(_CONTROL_PICTURES) if safe else chunk)
            out.flush()
        if gen.stats.stop_reason == "max_tokens":  # cut, maybe mid-word: say so
            out.write(f" [cut at --max-tokens {session.settings.max_tokens}]")
        elif gen.stats.stop_reason == "context":
            out.write(f" [cut: the model's context of {context_length(session.model)} tokens is full]")
        out.write("\n")
    except MinillamaError as exc:  # the model failed on this reply: say so, keep the session
        out.write(f"\nerror: {exc}\n")
    except KeyboardInterrupt:
        if gen is not None:
            gen.close()
        out.write("\n[stopped]\n")
    finally:
        if gen is not None:
            session.finish_reply(gen)
        out.flush()


def banner(tok: Tokenizer, model_desc: str, fmt: ChatFormat, model_path: str) -> str:
    """What the session runs on, said plainly at start (including the absence of a chat template)."""
    lines = [f"minillama chat: tokenizer {model_path} ({tok.kind}, {tok.n_vocab} tokens)", f"model: {model_desc}"]
    if isinstance(fmt, ChatTemplate):
        lines.append("chat template: from the file (tokenizer.chat_template)")
    else:
        lines.append(f"No chat template in {model_path}: using a simple 'User: ...' / 'Assistant:' format.")
    lines.append("/help lists the commands; Ctrl-C stops a reply; Ctrl-D leaves.")
    return "\n".join(lines)


def main_loop(session: ChatSession, intro: str, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Print intro, then run the REPL on the given (default: standard) streams."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    reconfigure = getattr(stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="replace")  # a terminal that cannot show a character gets '?', not a traceback
    stdout.write(intro + "\n")
    stdout.flush()
    return run_repl(session, make_reader(stdin, stdout), stdout)
