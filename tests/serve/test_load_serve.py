"""The server under load (tools/bench/load_serve.py at a small scale): chat, completions, embeddings and the agents'
requests (tools, tool results, reasoning budgets and formats, /v1/messages, /v1/responses) under a template that
thinks and calls tools, with one malformed request in ten: every good one a 200, every malformed one a 4xx with an
error object, no slot left busy, RSS flat, and a request still served beside clients that stopped reading."""

from __future__ import annotations

import pytest
from support import REPO
from support.paths import real_gguf


def test_load_with_tool_and_reasoning_requests(monkeypatch) -> None:
    pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
    monkeypatch.syspath_prepend(str(REPO / "tools" / "bench"))
    import load_serve

    kinds = len(load_serve.MALFORMED)
    argv = ["--model", str(real_gguf()), "--requests", str(10 * kinds), "--clients", "4", "--parallel", "2",
            "--chat-template-file", str(REPO / "tests" / "data" / "toolcall_templates" / "qwen3_thinking.jinja")]
    load_serve.main(argv)  # SystemExit(1) on any failure, with what failed printed
