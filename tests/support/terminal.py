"""`minillama chat` driven through a pseudo-terminal (pexpect): type, wait for the screen, read /tokens."""

from __future__ import annotations

import ast
import os
import re
import signal
import sys
import time

import pytest

from support import REPO

pexpect = pytest.importorskip("pexpect", reason="pexpect (the test extra) drives the chat through a terminal")

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|[\r\x08]")
PROMPT_READY = "\x1b[?2004h"  # prompt-toolkit turns bracketed paste on each time it shows the prompt
CPR_REQUEST = "\x1b[6n"  # prompt-toolkit asks where the cursor is; a real terminal answers
TIMEOUT = 30.0


def terminal_env() -> dict[str, str]:
    """The environment `minillama chat` runs in under the pseudo-terminal: this checkout first, UTF-8, no colour."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(PYTHONIOENCODING="utf-8", PYTHONUTF8="1", NO_COLOR="1", TERM="xterm")
    env.pop("PROMPT_TOOLKIT_NO_CPR", None)
    return env


def clean(text: str) -> str:
    """Terminal output without escape sequences, carriage returns and backspaces."""
    return ANSI.sub("", text)


class Term:
    """`python -m minillama chat ...` in a pseudo-terminal: type, and wait for what appears on screen."""

    def __init__(self, *args: str) -> None:
        # preexec_fn: Ctrl-C as at a user's terminal, even when these tests run as a background job (where the shell
        # starts them with SIGINT ignored, and a program keeps a disposition it inherits as ignored)
        self.child = pexpect.spawn(sys.executable, ["-m", "minillama", "chat", *args], env=terminal_env(), cwd=str(REPO),
                                   encoding="utf-8", codec_errors="replace", dimensions=(40, 160),
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.raw = ""
        self.mark = 0
        self.eof = False

    def _pump(self, timeout: float) -> None:
        """Read what the program wrote (answering cursor position requests as a terminal does)."""
        try:
            data = self.child.read_nonblocking(1 << 16, timeout=timeout)
        except pexpect.TIMEOUT:
            return
        except pexpect.EOF:
            self.eof = True
            return
        for _ in range(data.count(CPR_REQUEST)):
            self.child.send("\x1b[1;1R")
        self.raw += data

    def wait(self, pred, what: str, timeout: float = TIMEOUT) -> str:
        """Read until pred(raw output since the last send) holds; return that output, cleaned."""
        deadline = time.monotonic() + timeout
        while not pred(self.raw[self.mark:]):
            if self.eof or time.monotonic() > deadline:
                pytest.fail(f"waited for {what}; the screen since the last input shows:\n"
                            f"{clean(self.raw[self.mark:])[-3000:]}", pytrace=False)
            self._pump(0.2)
        return clean(self.raw[self.mark:])

    def send_line(self, text: str) -> None:
        self.mark = len(self.raw)
        self.child.sendline(text)

    def command(self, text: str) -> str:
        """Type a line and return what was printed before the next prompt."""
        self.send_line(text)
        self.wait(lambda s: PROMPT_READY in s, f"the prompt after {text!r}")
        seg = self.raw[self.mark:]
        return clean(seg[: seg.index(PROMPT_READY)])

    def ctrl_d(self) -> int:
        """Press Ctrl-D at the prompt and return the exit status."""
        self.mark = len(self.raw)
        self.child.sendcontrol("d")
        self.wait(lambda s: self.eof, "the program to exit")
        self.child.close()
        assert self.child.signalstatus is None
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def tokens_ids(out: str) -> list[int]:
    """The id list printed by /tokens."""
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            return ast.literal_eval(line)
    raise AssertionError(f"no id list in /tokens output:\n{out}")
