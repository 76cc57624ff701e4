"""`minillama chat`: driven for real through a pseudo-terminal (pexpect), piped, and its chat-template
rendering. The streamed reply is checked against Tokenizer.decode of the ids /tokens reports (decode is
what the conformance tests check against llama.cpp); the ChatML text is written by hand from the template.

The real-model tests use the GGUF that MINILLAMA_TEST_GGUF points to (SmolLM2-135M-Instruct.Q4_1.gguf);
they skip when it is unset or missing. Nothing is downloaded.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.paths import real_gguf as _real_gguf
from support.terminal import PROMPT_READY, Term, clean, terminal_env, tokens_ids

from minillama.chat import (
    ChatSession,
    ChatTemplate,
    Settings,
    SimpleFormat,
    chat_documents,
    format_for,
    format_without_bos,
    template_of,
)
from minillama.errors import ContextLengthError
from minillama.ngram import NGramModel
from minillama.tokenizer import Tokenizer, default_vocab_path

pexpect = pytest.importorskip("pexpect", reason="pexpect (the test extra) drives the chat through a terminal")





def _smollm2_gguf() -> Path:
    """The real model, for tests whose expected text is SmolLM2's ChatML rendering (written by hand from it)."""
    path = _real_gguf()
    template = Tokenizer.from_file(path).vocab.metadata.get("tokenizer.chat_template", "")
    if "<|im_start|>" not in template or "SmolLM" not in template:
        pytest.skip(f"MINILLAMA_TEST_GGUF={path} has another chat template than SmolLM2's ChatML, which this "
                    "test's expected text is")
    return path


@pytest.fixture
def term_factory():
    terms: list[Term] = []

    def make(*args: str) -> Term:
        t = Term(*args)
        terms.append(t)
        return t

    yield make
    for t in terms:
        t.close()


# --- through a pseudo-terminal ---------------------------------------------------------------


def test_session_default_vocab(term_factory) -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    t = term_factory("--seed", "7", "--max-tokens", "60")
    intro = t.wait(lambda s: PROMPT_READY in s, "the first prompt")
    assert "No chat template" in intro and "placeholder" in intro

    reply = t.command("Tell me about the herd")
    ids_out = t.command("/tokens")
    ids = tokens_ids(ids_out)
    assert 0 < len(ids) <= 60 and f"last reply: {len(ids)} tokens" in ids_out
    assert len(re.findall(r"^\s+\d+  '", ids_out, re.M)) == len(ids)  # one line per token with its piece
    text = tok.decode(ids)
    assert text.strip() and text in reply, f"streamed reply {reply!r} does not hold decode(ids) {text!r}"
    # with seed 7 the placeholder writes "\nAssistant: Part eleven...": the reply ends before it
    assert "Assistant:" not in reply and "User:" not in reply, reply

    stats = t.command("/stats")
    assert re.search(r"last reply: \d+ tokens, prompt \d+ tokens", stats), stats
    # prompt processing and generation apart, as llama.cpp's llama_perf_context_print
    assert re.search(r"prompt eval time = +[\d.]+ ms / +\d+ tokens", stats) and re.search(r"eval time = .* runs", stats)
    assert re.search(r"conversation: 1 turn, \d+ tokens in context", stats), stats
    t.command("And then?")
    assert "conversation: 2 turns" in t.command("/stats")

    assert "/reset" in t.command("/help") and "/tokens" in t.command("/help")
    assert "forgotten" in t.command("/reset")
    assert "No reply yet" in t.command("/stats") and "No reply yet" in t.command("/tokens")
    assert "Unknown command /nope" in t.command("/nope")
    assert t.ctrl_d() == 0


def test_ctrl_c_stops_a_long_reply(term_factory) -> None:
    t = term_factory("--seed", "3", "--ignore-eos", "--max-tokens", "10000000")
    t.wait(lambda s: PROMPT_READY in s, "the first prompt")
    t.send_line("Write forever")
    # a reply that would take minutes: wait until a good part of it has streamed, then press Ctrl-C
    t.wait(lambda s: len(clean(s)) > 2000, "the reply to stream")
    t.mark = len(t.raw)
    t.child.sendintr()
    t.wait(lambda s: "[stopped]" in s and PROMPT_READY in s[s.index("[stopped]"):], "[stopped] and the prompt")
    stats = t.command("/stats")
    assert "stopped by Ctrl-C" in stats and "conversation: 1 turn," in stats, stats
    n = int(re.search(r"last reply: (\d+) tokens", stats).group(1))
    assert 100 < n < 10_000_000
    # the REPL still works after the interruption
    assert "/stats" in t.command("/help")
    assert t.ctrl_d() == 0


def test_real_model_session(term_factory) -> None:
    """A short session on SmolLM2 (BPE, ChatML template): the prompt is the template's rendering."""
    gguf = _real_gguf()
    tok = Tokenizer.from_file(gguf)
    t = term_factory("--model", str(gguf), "--seed", "1", "--max-tokens", "40")
    intro = t.wait(lambda s: PROMPT_READY in s, "the first prompt")
    fmt = format_for(tok)
    if isinstance(fmt, ChatTemplate):  # SmolLM2 has one; the Gemma 3 GGUF we know has none
        assert "chat template: from the file" in intro and "No chat template" not in intro
    else:
        assert "No chat template" in intro
    message = "What do llamas eat?"
    reply = t.command(message)
    ids = tokens_ids(t.command("/tokens"))
    assert 0 < len(ids) <= 40
    assert tok.decode(ids) in reply
    stats = t.command("/stats")
    rendered = format_without_bos(fmt.render([{"role": "user", "content": message}]), fmt, tok)
    prompt_ids = tok.encode(rendered, add_special=True, parse_special=True)
    assert f"prompt {len(prompt_ids)} tokens" in stats, stats
    if "stopped by end-of-generation" in stats:
        assert tok.is_eog(ids[-1])  # <|im_end|> for SmolLM2, <end_of_turn> for Gemma 3
    assert t.ctrl_d() == 0


# --- piped (no terminal) ---------------------------------------------------------------------


def run_chat(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillama", "chat", *args], input=stdin.encode(),
                          capture_output=True, env=terminal_env(), cwd=str(REPO), timeout=120)


def test_piped_input() -> None:
    proc = run_chat("--seed", "2", "--max-tokens", "30", stdin="hello\n/tokens\n/stats\n")
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0 and not err, err
    assert "No chat template" in out and "> hello\n" in out
    ids = tokens_ids(out)
    assert Tokenizer.from_file(default_vocab_path()).decode(ids) in out
    assert "conversation: 1 turn," in out
    # the same seed, the same reply
    assert tokens_ids(run_chat("--seed", "2", "--max-tokens", "30", stdin="hello\n/tokens\n").stdout.decode()) == ids


def test_ngram_train_then_chat(tmp_path: Path) -> None:
    text = tmp_path / "herd.txt"
    text.write_text("The herd walks along the ridge.\n\nThe herd rests by the river.\n\nLlamas hum.\n", "utf-8")
    out = tmp_path / "herd.ngram.npz"
    proc = subprocess.run([sys.executable, "-m", "minillama", "ngram", "train", "--order", "3", "--out", str(out),
                           str(text)], capture_output=True, env=terminal_env(), cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "3-gram" in proc.stdout.decode() and "3 paragraphs" in proc.stdout.decode()
    lm = NGramModel.load(out, Tokenizer.from_file(default_vocab_path()))
    assert lm.order == 3 and lm.n_sequences == 3
    proc = run_chat("--ngram", str(out), "--seed", "1", "--temperature", "0", stdin="hi\n")
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"3-gram placeholder from {out}" in proc.stdout.decode()


def test_chat_errors(tmp_path: Path) -> None:
    small = tmp_path / "five.npz"
    NGramModel(order=2, n_vocab=5).save(small)
    proc = run_chat("--ngram", str(small))
    assert proc.returncode == 2 and "vocab of 5 tokens" in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()
    junk = tmp_path / "junk.npz"
    junk.write_text("junk")
    proc = run_chat("--ngram", str(junk))
    assert proc.returncode == 2 and "expected a .npz" in proc.stderr.decode()
    proc = run_chat("--temperature", "-1")
    assert proc.returncode == 2 and "temperature" in proc.stderr.decode()


# --- chat templates --------------------------------------------------------------------------

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TWO_TURNS = [
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me about llamas."},
]


def test_smollm_template_two_turns() -> None:
    tok = Tokenizer.from_file(_smollm2_gguf())
    tpl = format_for(tok)
    assert isinstance(tpl, ChatTemplate)
    expected = (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi there!<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\nTell me about llamas.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tpl.render(TWO_TURNS, add_generation_prompt=True) == expected
    assert tpl.render(TWO_TURNS, add_generation_prompt=False) == expected[: -len("<|im_start|>assistant\n")]
    with_system = [{"role": "system", "content": "Be brief."}, *TWO_TURNS[:1]]
    assert tpl.render(with_system) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                       "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n")
    assert (tpl.bos_token, tpl.eos_token) == ("<|im_start|>", "<|im_end|>")
    # encoded with parse_special=True, the control tokens become single ids
    ids = tok.encode(expected, add_special=True, parse_special=True)
    start, end = tok.encode("<|im_start|>", False, True), tok.encode("<|im_end|>", False, True)
    assert len(start) == len(end) == 1
    assert ids.count(start[0]) == 5 and ids.count(end[0]) == 4 and ids[0] == start[0]


def test_session_prompt_with_template() -> None:
    tok = Tokenizer.from_file(_smollm2_gguf())
    session = ChatSession(tok, NGramModel(2, tok.n_vocab), format_for(tok), Settings(max_tokens=3, seed=0))
    gen = session.start_reply("Hi there!")
    list(gen)
    session.finish_reply(gen)
    assert gen.prompt_ids == tok.encode(
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"
        "<|im_start|>assistant\n", add_special=True, parse_special=True)
    assert session.messages[-1]["role"] == "assistant"


class _Echo:
    """A model with a small context whose every reply is one id, then eos."""

    def __init__(self, tok: Tokenizer, n_ctx: int) -> None:
        self.n_ctx, self.word, self.eos = n_ctx, tok.encode(" ok", add_special=False)[0], tok.eos_id
        self.calls = 0

    def next_token(self, ids, sampler) -> int:  # noqa: ANN001
        assert len(ids) <= self.n_ctx
        self.calls += 1
        return self.word if self.calls % 2 else self.eos


def _first_prompt_tokens(tok: Tokenizer, fmt) -> int:  # noqa: ANN001
    """Tokens of a one-message conversation: the unit the small test contexts are sized in."""
    return len(tok.encode(fmt.render([{"role": "user", "content": "hello number 1"}]), add_special=True,
                          parse_special=True))


def test_session_forgets_the_oldest_exchanges_to_fit_the_context() -> None:
    """Past the model's context, whole exchanges go, oldest first; the system message and the new one stay."""
    tok = Tokenizer.from_file(_smollm2_gguf())
    fmt = format_for(tok)
    one = _first_prompt_tokens(tok, fmt)
    model = _Echo(tok, n_ctx=one + 60)
    session = ChatSession(tok, model, fmt, Settings(max_tokens=4, seed=0), system="Be brief.")
    for turn in range(1, 9):
        gen = session.start_reply(f"hello number {turn}")
        list(gen)
        session.finish_reply(gen)
        # the prompt fits with room for max_tokens, and it is the conversation as kept, rendered
        assert len(gen.prompt_ids) + 4 <= model.n_ctx
        assert gen.prompt_ids == tok.encode(format_without_bos(fmt.render(session.messages[:-1]), fmt, tok),
                                            add_special=True, parse_special=True)
        assert session.messages[0] == {"role": "system", "content": "Be brief."}
        assert session.messages[-2] == {"role": "user", "content": f"hello number {turn}"}
        roles = [m["role"] for m in session.messages[1:]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)  # still alternating
    assert session.dropped >= 1 and len(session.messages) < 1 + 2 * 8
    kept = [m["content"] for m in session.messages if m["role"] == "user"]
    assert kept == [f"hello number {t}" for t in range(9 - len(kept), 9)]  # the newest ones


def test_session_message_longer_than_the_context() -> None:
    tok = Tokenizer.from_file(_smollm2_gguf())
    session = ChatSession(tok, _Echo(tok, n_ctx=40), format_for(tok), Settings(max_tokens=4, seed=0))
    with pytest.raises(ContextLengthError, match="context holds 40"):
        session.start_reply("word " * 100)
    assert session.messages == []  # the message that did not fit is not kept
    gen = session.start_reply("hi")  # the session goes on
    list(gen)
    assert gen.ids and gen.stats.stop_reason == "eog"


def test_repl_says_what_the_context_cost() -> None:
    """The REPL says when exchanges were forgotten and when a message cannot fit, and goes on after it."""
    import io

    from minillama.chat import run_repl

    tok = Tokenizer.from_file(_smollm2_gguf())
    fmt = format_for(tok)
    one = _first_prompt_tokens(tok, fmt)
    session = ChatSession(tok, _Echo(tok, n_ctx=one + 40), fmt, Settings(max_tokens=4, seed=0), system="Hi.")
    lines = iter([f"hello number {t}" for t in range(1, 7)] + ["word " * 200, "/exit"])
    out = io.StringIO()
    assert run_repl(session, lambda: next(lines), out) == 0
    text = out.getvalue()
    assert "forgotten to fit the model's context]" in text
    assert "error: the message takes" in text and f"the model's context holds {one + 40}" in text
    assert text.count("ok\n") == 6  # every reply before the error came through


def test_template_environment() -> None:
    """transformers' environment: trim/lstrip blocks, raise_exception, loop controls, tojson, bos/eos tokens."""
    source = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role: ' + m['role']) }}{% endif %}\n"
        "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "[{{ m['role'] }}] {{ m['content'] | tojson }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token if not add_generation_prompt }}"
    )
    tpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    msgs = [{"role": "user", "content": "café \"x\""}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "dropped"}]
    # '{{ bos_token }}' keeps its newline (trim_blocks trims only after {% %} tags); the indented tags vanish
    assert tpl.render(msgs) == '<s>\n[user] "café \\"x\\""\n[assistant] "ok"\n[assistant]'
    assert tpl.render(msgs[:1], add_generation_prompt=False) == '<s>\n[user] "café \\"x\\""\n</s>'
    from minillama.errors import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="refused the conversation: bad role: tool"):
        tpl.render([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="SecurityError"):  # sandboxed: no access to Python internals
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(ChatTemplateError, match="SecurityError"):  # immutable: the messages cannot be changed
        ChatTemplate("{{ messages.append(1) }}").render([])


def test_no_template_simple_format() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    assert template_of(tok) is None and isinstance(format_for(tok), SimpleFormat)
    assert SimpleFormat().render(TWO_TURNS) == (
        "User: Hi there!\nAssistant: Hello! How can I help?\nUser: Tell me about llamas.\nAssistant:")
    docs = chat_documents(SimpleFormat(), ["a", "b", "c"])
    assert docs == ["User: a\nAssistant: b\n", "User: b\nAssistant: c\n"]


# --- the plain transcript (no chat template) ---------------------------------------------------

class _Script:
    """A model that writes a fixed text, token by token (then the same text again)."""

    def __init__(self, tok: Tokenizer, text: str, then: list[int] | None = None) -> None:
        self.ids = tok.encode(text, add_special=False) + (then or [])
        self.calls = 0

    def next_token(self, ids, sampler) -> int:  # noqa: ANN001
        self.calls += 1
        return self.ids[(self.calls - 1) % len(self.ids)]


FRANCE = " Paris.\nUser: What is the capital of France?\nAssistant: Paris."


def test_transcript_reply_stops_at_the_next_turn() -> None:
    """Without a template, a model that writes on into "\nUser: ..." is stopped there; the
    marker is neither shown nor kept in the conversation, and no token after it is asked for."""
    tok = Tokenizer.from_file(default_vocab_path())
    model = _Script(tok, FRANCE)
    session = ChatSession(tok, model, SimpleFormat(), Settings(max_tokens=200, seed=0))
    gen = session.start_reply("What is the capital of France?")
    chunks = list(gen)
    session.finish_reply(gen)
    assert "".join(chunks) == gen.text == " Paris."
    assert gen.stats.stop_reason == "next_turn"
    assert model.calls < len(tok.encode(" Paris.\nUser: What", add_special=False))  # it stopped at the marker
    assert session.messages[-1] == {"role": "assistant", "content": "Paris."}
    assert tok.decode(gen.ids[:gen.reply_ids]) == " Paris."
    assert "the transcript's next turn" in session.stats_report()
    assert "began the next turn (not shown)" in session.tokens_report()


def test_transcript_marker_lookalikes_are_shown() -> None:
    """Text that only begins like a marker ("\nUs...") is held back, then shown whole."""
    tok = Tokenizer.from_file(default_vocab_path())
    text = " Paris.\nUsually so. User: not a new line\nUser"
    session = ChatSession(tok, _Script(tok, text, then=[tok.eos_id]), SimpleFormat(), Settings(seed=0))
    gen = session.start_reply("What is the capital of France?")
    assert "".join(gen) == text and gen.stats.stop_reason == "eog"


def test_repl_transcript_reply_ends_at_the_next_turn() -> None:
    import io

    from minillama.chat import run_repl

    tok = Tokenizer.from_file(default_vocab_path())
    session = ChatSession(tok, _Script(tok, FRANCE), SimpleFormat(), Settings(max_tokens=200, seed=0))
    lines = iter(["What is the capital of France?", "/exit"])
    out = io.StringIO()
    assert run_repl(session, lambda: next(lines), out) == 0
    assert out.getvalue() == " Paris.\n"
