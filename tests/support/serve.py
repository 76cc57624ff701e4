"""`minillama serve` for the tests: a tiny chat model over the built-in vocab, the server in a subprocess on a
free loopback port, and the checks the server's test files share (tests/test_serve*.py)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from minillama.tokenizer import default_vocab_path

from . import REPO
from .paths import SHARED

#: The tiny model's context.
N_CTX = 4096
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def write_tiny_chat_model(path: Path, n_ctx: int = N_CTX, template: str | None = TEMPLATE,
                          fim: dict[str, int] | None = None) -> Path:
    """A one-block llama with random weights over the built-in vocab (1,000 tokens), with a chat template (None:
    none); fim: its fill-in-the-middle token ids by kind (pre, suf, mid, rep, sep), written as
    tokenizer.ggml.fim_*_token_id."""
    import gguf

    from .tiny_llama import add_default_vocab

    d, f, n_head, n_head_kv = 32, 48, 4, 2
    hd = d // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(n_ctx)
    w.add_embedding_length(d)
    w.add_feed_forward_length(f)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    n_vocab = add_default_vocab(w)
    if template is not None:
        w.add_chat_template(template)
    for kind, token in (fim or {}).items():
        w.add_uint32(f"tokenizer.ggml.fim_{kind}_token_id", token)
    shapes = {"token_embd.weight": (n_vocab, d), "output_norm.weight": (d,), "blk.0.attn_norm.weight": (d,),
              "blk.0.attn_q.weight": (d, d), "blk.0.attn_k.weight": (n_head_kv * hd, d),
              "blk.0.attn_v.weight": (n_head_kv * hd, d), "blk.0.attn_output.weight": (d, d),
              "blk.0.ffn_norm.weight": (d,), "blk.0.ffn_gate.weight": (f, d), "blk.0.ffn_up.weight": (f, d),
              "blk.0.ffn_down.weight": (d, f)}
    rng = np.random.default_rng(7)
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * (1.0 if name == "token_embd.weight" else 0.3))
                     .astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Server:
    """`minillama serve` in a subprocess on a free loopback port; .url, .pid, .stop()."""

    def __init__(self, model: Path | str, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "minillama", "serve", "--model", str(model),
                                      "--port", "0", *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=env, cwd=REPO)
        self.log: list[str] = []
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on (http://\S+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1).removeprefix("http://"), int(m.group(2))
                self.url = f"{m.group(1)}:{m.group(2)}"
                break
        else:
            self.stop()
            raise AssertionError("the server did not start in 120 s: " + "".join(self.log))
        if not hasattr(self, "url"):
            self.stop()
            raise AssertionError("the server exited: " + "".join(self.log) + self.proc.stderr.read())
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, **kw) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                             timeout=120, **kw)

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                headers: dict | None = None) -> tuple[int, dict | str]:
        """One raw HTTP request: (status, the JSON body or the text)."""
        return http_request(self.host, self.port, method, path, body, headers)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def second_vocab() -> Path:
    """The playground's second vocab: GPT-2's from ../shared when there, else the built-in one."""
    gpt2 = SHARED / "vocab" / "ggml-vocab-gpt-2.gguf" if SHARED is not None else None
    return gpt2 if gpt2 is not None and gpt2.is_file() else Path(default_vocab_path())


def wait_idle(server: Server, timeout: float = 10.0) -> list[dict]:
    """/slots once no slot is processing (or the last answer after timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        _, slots = server.request("GET", "/slots")
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            return slots
        time.sleep(0.05)


def error_object(status: int, body: dict, param: str | None = None) -> dict:
    """body's OpenAI error object (exactly its four keys, param as given)."""
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == param, body
    return body["error"]


def http_request(host: str, port: int, method: str, path: str, body: Any = None, headers: dict | None = None,
                 timeout: float = 120) -> tuple[int, Any]:
    """One raw HTTP request to host:port, body as JSON unless bytes: (status, the JSON answer or its text)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text
