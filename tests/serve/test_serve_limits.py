"""`minillama serve`'s limits, run on a real server (a subprocess on a loopback port, as tests/serve/test_serve.py runs
it): slots freed when generation ends whatever the client reads, a client that reads nothing cut off, the
chat-template worker holding none of the server's sockets, header and body timeouts, bounded embeddings and
/tokenize, the Host/Origin checks, and the playground's config kept inside its <script>.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.serve import Server, error_object, wait_idle, write_tiny_chat_model

from minillama.tokenizer import default_vocab_path

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install -e \".[serve]\"")
pytest.importorskip("gguf")

@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return write_tiny_chat_model(tmp_path_factory.mktemp("serve_limits") / "tiny-chat.gguf")


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Iterator[Server]:
    s = Server(tiny_path, "--parallel", "2", "--header-timeout", "1", "--timeout", "2",
               "--embedding-max-inputs", "40", "--embedding-max-tokens", "100000")
    yield s
    s.stop()


def raw(server: Server, rcvbuf: int | None = None) -> socket.socket:
    """A connected socket to the server (rcvbuf: a small receive buffer set before connecting)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect((server.host, server.port))
    return sock


def post(path: str, body: dict, host: str = "127.0.0.1") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Read until the server closes (EOF or reset): (closed within seconds, what was read)."""
    sock.settimeout(0.2)
    got = bytearray()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, bytes(got)
        if not chunk:
            return True, bytes(got)
        got += chunk
    return False, bytes(got)


#: A long streamed chat reply with 20 alternatives per token: ~7 MB of events, more than the sockets' buffers hold
#: (loopback's send buffer grows to 4 MiB).
LONG_STREAM = {"messages": [{"role": "user", "content": "A very long story"}], "max_tokens": 4000, "stream": True,
               "logprobs": True, "top_logprobs": 20, "logit_bias": {"999": -100}, "temperature": 0}


# ---------------------------------------------------------------------------------------------------------------------
# item 4: a streaming client that stops reading
# ---------------------------------------------------------------------------------------------------------------------

def test_two_clients_that_stop_reading_do_not_keep_a_third_from_being_served(tiny_path: Path) -> None:
    """--parallel 2, two streaming clients with a 4 KiB receive buffer that never read: once their replies are
    generated their slots are free (the rest waits in the server), so a third request is answered and /health
    shows both slots idle while the two connections are still open and unread."""
    s = Server(tiny_path, "--parallel", "2")
    stalled = []
    try:
        for _ in range(2):
            sock = raw(s, rcvbuf=4096)
            sock.sendall(post("/v1/chat/completions", LONG_STREAM))
            stalled.append(sock)
        deadline = time.monotonic() + 30
        while s.request("GET", "/health")[1]["slots_processing"] < 2:
            assert time.monotonic() < deadline, "the two streams never took their slots"
            time.sleep(0.05)
        start = time.monotonic()
        conn = raw(s)
        conn.sendall(post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0}))
        conn.settimeout(120)
        head = conn.recv(65536)
        waited = time.monotonic() - start
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        conn.close()
        # alone, each reply takes a few seconds here: the third waited for generation, not for the readers
        assert waited < 90, waited
        slots = wait_idle(s, 60)
        assert not any(x["is_processing"] for x in slots), slots
        _, health = s.request("GET", "/health")
        assert health["slots_idle"] == 2 and health["requests_waiting"] == 0, health
        for sock in stalled:  # still connected, still unread: the server holds what they did not take
            sock.settimeout(0)
            assert sock.recv(16, socket.MSG_PEEK)
    finally:
        for sock in stalled:
            sock.close()
        s.stop()


def test_a_client_that_reads_nothing_is_cut_off_after_the_timeout(server: Server) -> None:
    """--timeout 2: a streaming client that takes nothing for 2 s once the buffers are full is disconnected;
    reading afterwards ends (EOF or reset) before the reply's `data: [DONE]`."""
    wait_idle(server, 30)
    sock = raw(server, rcvbuf=4096)
    try:
        sock.sendall(post("/v1/chat/completions", LONG_STREAM))
        deadline = time.monotonic() + 10
        while server.request("GET", "/health")[1]["slots_processing"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        wait_idle(server, 90)  # generation over (or, where the slot waits for the reader, 90 s gone)
        time.sleep(2 + 2)  # the timeout and a margin
        closed, got = closed_within(sock, 30)
        assert closed and b"data: [DONE]" not in got, (closed, len(got))
    finally:
        sock.close()


# ---------------------------------------------------------------------------------------------------------------------
# item 5: the chat-template worker holds none of the server's descriptors
# ---------------------------------------------------------------------------------------------------------------------

def _sockets(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_chat_template_worker_holds_no_server_socket(tiny_path: Path) -> None:
    """After a chat request (the template renders in a forked worker), the worker holds none of the server's
    sockets, and a killed server's port refuses connections at once."""
    s = Server(tiny_path)
    try:
        conn = raw(s)  # a kept-alive connection, open while the worker forks
        conn.sendall(post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                   "max_tokens": 2}))
        assert conn.recv(65536).startswith(b"HTTP/1.1 200")
        workers = _children(s.pid)
        assert workers, "no chat-template worker was started"
        server_sockets = _sockets(s.pid)
        for pid in workers:
            shared = _sockets(pid) & server_sockets
            assert not shared, f"the worker {pid} holds the server's sockets {shared}"
        os.kill(s.pid, signal.SIGKILL)
        s.proc.wait(10)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((s.host, s.port), timeout=2).close()
        conn.close()
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------------------------------------
# item 8: header and body timeouts
# ---------------------------------------------------------------------------------------------------------------------

def test_half_a_header_and_a_slow_body_are_cut_off(server: Server) -> None:
    """--header-timeout 1: a connection that sends half a header, or nothing, or half a header after a first
    request on the same connection, is closed within 1 s (plus a margin); --timeout 2: a body that stops coming
    gets 408 with OpenAI's error object."""
    half = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
    sock = raw(server)
    sock.sendall(half)
    start = time.monotonic()
    closed, got = closed_within(sock, 6)
    assert closed and time.monotonic() - start < 4, (closed, got)
    sock.close()

    sock = raw(server)  # nothing at all
    assert closed_within(sock, 6)[0]
    sock.close()

    sock = raw(server)  # a first request answered, then half a header on the same connection
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.sendall(half)
    assert closed_within(sock, 6)[0]
    sock.close()

    sock = raw(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    start = time.monotonic()
    closed, got = closed_within(sock, 10)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got[:300]
    assert time.monotonic() - start < 8
    assert error_object(408, json.loads(body))["code"] == "request_timeout"
    sock.close()


# ---------------------------------------------------------------------------------------------------------------------
# item 6: bounded embeddings, stopped when the client leaves
# ---------------------------------------------------------------------------------------------------------------------

def test_embeddings_are_bounded(server: Server, tiny_path: Path) -> None:
    """--embedding-max-inputs 40 --embedding-max-tokens 100000: 41 inputs, or 40 inputs of 3,000 tokens, are a
    400 naming `input`; the server's defaults are OpenAI's (2,048 inputs)."""
    status, r = server.request("POST", "/v1/embeddings", {"input": ["a"] * 41})
    assert status == 400 and "at most 40 inputs" in error_object(status, r, "input")["message"], r
    long = "llamas and alpacas " * 500  # 3,002 tokens
    status, r = server.request("POST", "/v1/embeddings", {"input": [long] * 40})
    assert status == 400 and "at most 100,000 tokens" in error_object(status, r, "input")["message"], r
    status, r = server.request("POST", "/v1/embeddings", {"input": ["a llama", "an alpaca"]})
    assert status == 200 and [d["index"] for d in r["data"]] == [0, 1] and r["usage"]["prompt_tokens"] > 2
    s = Server(tiny_path)
    try:
        status, r = s.request("POST", "/v1/embeddings", {"input": ["a"] * 2049})
        assert status == 400 and "at most 2,048 inputs" in error_object(status, r, "input")["message"], r
    finally:
        s.stop()


def test_embeddings_stop_when_the_client_leaves(server: Server) -> None:
    """30 inputs of 3,000 tokens (a minute of work here): the client leaves after a second and the slot is free
    within a few seconds (the run stops between inputs), not after the whole request."""
    wait_idle(server, 30)
    sock = raw(server)
    sock.sendall(post("/v1/embeddings", {"input": ["llamas and alpacas " * 500] * 30}))
    deadline = time.monotonic() + 10
    while server.request("GET", "/health")[1]["slots_processing"] == 0:
        assert time.monotonic() < deadline, "the request never reached a slot"
        time.sleep(0.05)
    time.sleep(1)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    gone = time.monotonic()
    slots = wait_idle(server, 6)
    assert not any(x["is_processing"] for x in slots), (slots, time.monotonic() - gone)


# ---------------------------------------------------------------------------------------------------------------------
# item 7: /tokenize bounded
# ---------------------------------------------------------------------------------------------------------------------

def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_tokenize_with_pieces_is_bounded(server: Server) -> None:
    """/tokenize with pieces answers at most 131,072 tokens (400 naming with_pieces past it; the ids alone any
    number), and 8 such requests at once raise the server's peak RSS by far less than building their pieces
    would (about 70 MB each)."""
    from minillama.serve.app import TOKENIZE_MAX_PIECES

    content = "llamas, alpacas and vicuñas! " * 30000  # ~260,000 tokens, 900 KB
    status, r = server.request("POST", "/tokenize", {"content": content})
    assert status == 200 and len(r["tokens"]) > TOKENIZE_MAX_PIECES
    before = _peak_rss_kib(server.pid)
    results: list[tuple[int, object]] = []
    threads = [threading.Thread(target=lambda: results.append(server.request(
        "POST", "/tokenize", {"content": content, "with_pieces": True}))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 8
    for status, r in results:
        assert status == 400 and f"at most {TOKENIZE_MAX_PIECES:,} tokens" in error_object(status, r, "with_pieces")[
            "message"], (status, str(r)[:200])
    grew = (_peak_rss_kib(server.pid) - before) / 1024
    assert grew < 150, f"peak RSS grew {grew:.0f} MiB"
    status, r = server.request("POST", "/tokenize", {"content": "a llama", "with_pieces": True})
    assert status == 200 and all("piece" in t for t in r["tokens"])


# ---------------------------------------------------------------------------------------------------------------------
# item 14: Host and Origin
# ---------------------------------------------------------------------------------------------------------------------

def test_foreign_origin_and_host_are_refused(server: Server, tiny_path: Path) -> None:
    """A cross-site text/plain POST (what any web page can send without asking) and a Host that is not the
    server's (DNS rebinding) get 403 with OpenAI's error object, and nothing runs; the server's own names, its
    own origin (the playground's fetches) and clients without Origin (curl, SDKs) are served."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 200, "logit_bias": {"999": -100}}).encode()
    status, r = server.request("POST", "/v1/completions", body,
                               {"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert status == 403 and error_object(status, r)["code"] == "origin_not_allowed", r
    assert not any(x["is_processing"] for x in server.request("GET", "/slots")[1])
    status, r = server.request("POST", "/tokenize", {"content": "Hi"}, {"Host": f"evil.example:{server.port}"})
    assert status == 403 and error_object(status, r)["code"] == "host_not_allowed", r
    status, r = server.request("POST", "/tokenize", {"content": "Hi"}, {"Origin": "null"})
    assert status == 403, r
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", f"[::1]:{server.port}", "127.0.0.1"):
        status, r = server.request("POST", "/tokenize", {"content": "Hi"}, {"Host": host})
        assert status == 200, (host, r)
    own = f"http://127.0.0.1:{server.port}"
    status, r = server.request("POST", "/tokenize", {"content": "Hi"}, {"Origin": own})
    assert status == 200, r
    status, page = server.request("GET", "/")
    assert status == 200 and tiny_path.name in page and str(tiny_path.parent) not in page


def test_cors_origins_allowed_hosts_and_the_public_page(tiny_path: Path) -> None:
    """--cors-origins names the pages that may call the API from a browser (with CORS headers and a preflight
    answer), --allowed-hosts more names; with --api-key the public page still shows file names, not paths."""
    import http.client

    s = Server(tiny_path, "--cors-origins", "http://app.example:3000", "--allowed-hosts", "llama.lan",
               "--api-key", "sesame", "--vocab", str(default_vocab_path()))
    try:
        conn = http.client.HTTPConnection(s.host, s.port, timeout=60)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://app.example:3000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        r = conn.getresponse()
        r.read()
        assert r.status == 204 and r.getheader("access-control-allow-origin") == "http://app.example:3000"
        assert "POST" in r.getheader("access-control-allow-methods")
        assert "authorization" in r.getheader("access-control-allow-headers").lower()
        conn.request("POST", "/tokenize", body=json.dumps({"content": "Hi"}),
                     headers={"Origin": "http://app.example:3000", "Authorization": "Bearer sesame",
                              "Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("access-control-allow-origin") == "http://app.example:3000"
        r.read()
        conn.close()
        assert s.request("POST", "/tokenize", {"content": "Hi"}, {"Origin": "http://other.example:3000",
                                                                 "Authorization": "Bearer sesame"})[0] == 403
        assert s.request("GET", "/health", headers={"Host": f"llama.lan:{s.port}"})[0] == 200
        assert s.request("GET", "/health", headers={"Host": f"other.lan:{s.port}"})[0] == 403
        status, page = s.request("GET", "/")
        assert status == 200 and tiny_path.name in page and Path(default_vocab_path()).name in page
        assert str(tiny_path.parent) not in page and str(Path(default_vocab_path()).parent) not in page
        status, r = s.request("POST", "/tokenize", {"content": "Hi", "vocab": Path(default_vocab_path()).name},
                              {"Authorization": "Bearer sesame"})  # the page's names pick a vocab
        assert status == 200 and r["tokens"], r
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------------------------------------
# item 15: the playground's config stays inside its <script>
# ---------------------------------------------------------------------------------------------------------------------

HOSTILE = "v<!--<script>x</script>\u2028&.gguf"
HOSTILE_FILE = "v<!--<script>x\u2028&.gguf"  # a file name holds no "/"


def _page_config(page: str) -> dict:
    """The CONFIG object as an HTML parser hands the script to JavaScript: the text up to the first `</script`,
    which must hold no `<!--` or `<script` (they change how the rest is parsed) and no raw U+2028/9."""
    script = page.split("<script>", 1)[1]
    script = script[:script.lower().index("</script")]
    lower = script.lower()
    assert "<!--" not in lower and "<script" not in lower and "\u2028" not in script and "\u2029" not in script
    m = re.search(r"const CONFIG = (.*);\n", script)
    assert m, script[:300]
    return json.loads(m.group(1))


def test_playground_config_is_escaped(tiny_path: Path, tmp_path: Path) -> None:
    """A --vocab whose file name holds `<!--<script`, `</script>`, U+2028 and `&`: the page's script keeps the
    whole config, and the menu gets the name as it is."""
    from minillama.serve.app import playground_html

    assert _page_config(playground_html(["a.gguf", HOSTILE]))["vocabs"] == ["a.gguf", HOSTILE]
    vocab = tmp_path / HOSTILE_FILE
    shutil.copyfile(default_vocab_path(), vocab)
    s = Server(tiny_path, "--vocab", str(vocab))
    try:
        status, page = s.request("GET", "/")
        assert status == 200 and _page_config(page)["vocabs"] == [tiny_path.name, HOSTILE_FILE]
        status, r = s.request("POST", "/tokenize", {"content": "Hi", "vocab": HOSTILE_FILE})
        assert status == 200 and r["tokens"]
    finally:
        s.stop()
