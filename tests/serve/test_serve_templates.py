"""`minillama serve` and chat templates: a model without one chats in ChatML as llama-server does (and the log
says so), --chat-template-file replaces the file's (a bad file is a one-line error at startup), reasoning_effort
reaches the template, /v1/models reports the vocab's size.

Expected prompts are the templates rendered by hand: llama.cpp's ChatML (common/chat.cpp, CHATML_TEMPLATE_SRC)
and the test's own template; their token counts are Tokenizer.encode's, which the tokenizer tests check against
llama.cpp.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.serve import Server, write_tiny_chat_model

from minillama.tokenizer import Tokenizer

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("openai", reason="the test extra is not installed: pip install -e \".[test]\"")
pytest.importorskip("gguf")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"

TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if reasoning_effort is defined %}effort={{ reasoning_effort }}\n{% endif %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
RENDERED = "[system] Be brief.\n[user] Hi!\n[assistant] "
RENDERED_HIGH = "[system] Be brief.\n[user] Hi!\neffort=high\n[assistant] "


def _count(tok: Tokenizer, text: str) -> int:
    return len(tok.encode(text, add_special=True, parse_special=True))


def test_a_model_without_a_chat_template_chats_in_chatml(tmp_path: Path) -> None:
    path = write_tiny_chat_model(tmp_path / "bare.gguf", template=None)
    tok = Tokenizer.from_file(path)
    s = Server(path)
    try:
        r = s.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens == _count(tok, CHATML)
        assert any("no chat template" in line and "ChatML" in line for line in s.log), "".join(s.log)
        status, body = s.request("GET", "/v1/models")
        assert status == 200 and body["data"][0]["meta"]["n_vocab"] == tok.n_vocab
    finally:
        s.stop()


def test_chat_template_file_and_reasoning_effort(tmp_path: Path) -> None:
    path = write_tiny_chat_model(tmp_path / "m.gguf")
    tok = Tokenizer.from_file(path)
    (tmp_path / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    s = Server(path, "--chat-template-file", str(tmp_path / "t.jinja"))
    try:
        client = s.client()
        r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens == _count(tok, RENDERED)
        r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, temperature=0,
                                           reasoning_effort="high")
        assert r.usage.prompt_tokens == _count(tok, RENDERED_HIGH)
        status, body = s.request("POST", "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "max"})
        assert status == 400 and "reasoning_effort" in body["error"]["message"], body
    finally:
        s.stop()


@pytest.mark.parametrize("content, want", [(None, "cannot read --chat-template-file"),
                                           ("{% for m in messages %}", "--chat-template-file"),
                                           ("", "expected a Jinja chat template in --chat-template-file")])
def test_a_bad_chat_template_file_is_a_one_line_error(tmp_path: Path, content: str | None, want: str) -> None:
    path = write_tiny_chat_model(tmp_path / "m.gguf", n_ctx=64)
    template = tmp_path / "t.jinja"
    if content is not None:
        template.write_text(content, encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "minillama", "serve", "--model", str(path), "--port", "0",
                        "--chat-template-file", str(template)], capture_output=True, text=True, cwd=REPO,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 2 and p.stderr.startswith("minillama: error: ") and want in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
