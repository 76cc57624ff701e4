"""A forked worker process that runs untrusted computations under hard time and memory limits.

Inside one process, a check can only run between the steps of a computation: one C call (a `str.join`, a
`%*s` width, a loop in Jinja2's runtime) can allocate gigabytes or run for minutes before the next check. A
separate process can be stopped whatever it is doing. LimitedWorker forks once, on first use, and serves
requests over two pipes; each request has

* a wall-clock deadline: the parent waits for the reply no longer, then kills the worker (SIGKILL) and forks
  a fresh one for the next request;
* a memory cap: RLIMIT_AS is set to the worker's address-space size when the request starts plus the cap,
  so an allocation past it fails (MemoryError) instead of using the machine's memory;
* a CPU-time limit (RLIMIT_CPU), which ends the request even when the parent is gone.

The request is pickled by the parent (its own data); the reply is a kind and UTF-8 text, so nothing the
worker sends is unpickled. A worker whose heap grew past a quarter of the cap is replaced after its reply,
an idle worker exits when its parent dies, and a process forked from the parent forgets the parent's worker.
The worker keeps none of the parent's other descriptors (a server's sockets): each is pointed at /dev/null.
Where fork or resource limits do not exist (Windows), `available()` is False and callers run in-process.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

try:
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

#: handler(request) -> (kind, text), run in the worker; these kinds come from the parent instead:
TIMEOUT = "timeout"  # no reply before the deadline: the worker was killed
DIED = "died"  # the worker ended without a reply (text: how, e.g. "killed by SIGXCPU")

GRACE_SECONDS = 0.25  # the parent waits this much past a request's deadline (the worker's own checks go first)
_HEADER = struct.Struct("<8sBQ")  # reply: kind (ASCII, at most 8 bytes), retire flag, payload length
_LENGTH = struct.Struct("<Q")  # request: payload length
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_live: weakref.WeakSet[LimitedWorker] = weakref.WeakSet()


def available() -> bool:
    """Whether requests can run in a limited worker process on this system (fork and rlimits)."""
    return hasattr(os, "fork") and resource is not None


def _address_space() -> int | None:
    """This process's virtual memory size in bytes (None where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes | None:
    """n bytes from fd, or None when the deadline passes first (EOFError at the end of the pipe)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LimitedWorker:
    """One worker process running handler(request) under a deadline, a memory cap and a CPU-time limit."""

    def __init__(self, handler: Callable[[Any], tuple[str, str]], memory: int) -> None:
        self.handler, self.memory = handler, memory
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._to_worker = self._from_worker = -1
        _live.add(self)

    # -- the parent's side ----------------------------------------------------------------------------------

    def call(self, request: Any, seconds: float, reply_limit: int) -> tuple[str, str]:
        """handler(request) run in the worker within `seconds` (plus GRACE_SECONDS) of wall clock: its
        (kind, text), or (TIMEOUT, "") / (DIED, how) from here. A reply over reply_limit bytes counts as DIED."""
        data = pickle.dumps((request, seconds), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            for attempt in (1, 2):
                if self._pid is None:
                    try:
                        self._spawn()
                    except OSError as exc:  # no more processes or memory for one
                        return DIED, f"could not start: {exc}"
                try:
                    _write_all(self._to_worker, _LENGTH.pack(len(data)) + data)
                    break
                except BrokenPipeError:  # it died while idle (OOM killer, kill): once more with a new one
                    why = self._stop()
                    if attempt == 2:
                        return DIED, why
            try:
                return self._reply(time.monotonic() + seconds + GRACE_SECONDS, reply_limit)
            except EOFError:
                return DIED, self._stop()
            except BaseException:  # Ctrl-C while waiting: the worker's state is unknown, so it goes
                self._stop()
                raise

    def _reply(self, deadline: float, reply_limit: int) -> tuple[str, str]:
        header = _read_exact(self._from_worker, _HEADER.size, deadline)
        if header is None:
            self._stop()
            return TIMEOUT, ""
        kind, retire, length = _HEADER.unpack(header)
        if length > reply_limit:
            return DIED, self._stop(f"a reply of {length:,} bytes, more than {reply_limit:,}")
        payload = _read_exact(self._from_worker, length, deadline)
        if payload is None:
            self._stop()
            return TIMEOUT, ""
        if retire:
            self._stop()
        return kind.rstrip(b"\0").decode("ascii", "replace"), payload.decode("utf-8", "surrogatepass")

    def _spawn(self) -> None:
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            status = 0
            try:
                os.close(request_w)
                os.close(reply_r)
                _drop_inherited({request_r, reply_w})
                self._serve(request_r, reply_w, parent)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        os.close(request_r)
        os.close(reply_w)
        self._pid, self._to_worker, self._from_worker = pid, request_w, reply_r

    def _stop(self, why: str | None = None) -> str:
        """Kill and reap the worker; say how it ended (why, or its exit status)."""
        pid, self._pid = self._pid, None
        for fd in (self._to_worker, self._from_worker):
            if fd >= 0:
                os.close(fd)
        self._to_worker = self._from_worker = -1
        if pid is None:
            return why or "no worker"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return why or "already reaped"
        if why:
            return why
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.waitstatus_to_exitcode(status)}"

    def close(self) -> None:
        """End the worker now (the next call forks a new one)."""
        with self._lock:
            self._stop()

    def _forget(self) -> None:
        """In a forked child: drop the parent's worker (its pipes closed here only; the worker is not ours)."""
        for fd in (self._to_worker, self._from_worker):
            if fd >= 0:
                os.close(fd)
        self._pid, self._to_worker, self._from_worker = None, -1, -1
        self._lock = threading.Lock()

    # -- the worker's side ----------------------------------------------------------------------------------

    def _serve(self, requests: int, replies: int, parent: int) -> None:
        """Answer requests until the pipe closes or the parent dies."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business: it kills us if needed
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU ends the worker without a core file
        as_soft, as_hard = resource.getrlimit(resource.RLIMIT_AS)
        cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        start_size = _address_space()
        while True:
            if not select.select([requests], [], [], 1.0)[0]:
                if os.getppid() != parent:
                    return
                continue
            try:
                data = _read_exact(requests, _LENGTH.unpack(_read_exact(requests, _LENGTH.size))[0])
            except EOFError:  # the parent closed the pipe: done
                return
            request, seconds = pickle.loads(data)
            _limit(resource.RLIMIT_CPU, int(sum(os.times()[:2]) + seconds) + 2, cpu_hard)
            size = _address_space()
            if size is not None:
                _limit(resource.RLIMIT_AS, size + self.memory + 8 * len(data), as_hard)
            try:
                kind, text = self.handler(request)
            except MemoryError:
                kind, text = "error", "out of memory"
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (as_soft, as_hard))
            del request, data
            payload = text.encode("utf-8", "surrogatepass")
            now = _address_space()
            retire = start_size is not None and now is not None and now - start_size > self.memory // 4
            _write_all(replies, _HEADER.pack(kind.encode("ascii"), retire, len(payload)) + payload)
            if retire:
                return


def _drop_inherited(keep: set[int]) -> None:
    """In the worker: every descriptor inherited from the parent but stdin/out/err and keep made /dev/null.

    A fork inherits the parent's sockets, a server's listening one and its clients' among them; a worker holding
    them keeps a closed connection from ending (no FIN reaches the client) and a killed server's port accepting.
    Each is replaced by /dev/null rather than closed, so its number stays taken: a Python object of the parent's
    that still names it can close it without closing a file the worker opened since."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            fds = [int(name) for name in os.listdir(listing)]
            break
        except (OSError, ValueError):
            continue
    else:  # no listing: every number up to the limit
        fds = list(range(3, min(os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024, 1 << 16)))
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            if fd <= 2 or fd == null or fd in keep:
                continue
            try:
                os.fstat(fd)  # still open (the listing's own descriptor is closed by now)
            except OSError:
                continue
            os.dup2(null, fd)
    finally:
        os.close(null)


def _limit(which: int, soft: int, hard: int) -> None:
    """Set a soft resource limit, never above the hard one."""
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _forget_all() -> None:
    for worker in list(_live):
        worker._forget()


def _close_all() -> None:
    for worker in list(_live):
        worker.close()


if available():
    os.register_at_fork(after_in_child=_forget_all)
    atexit.register(_close_all)
