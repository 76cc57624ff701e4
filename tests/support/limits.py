"""Run a piece of Python in a fresh interpreter under an address-space limit and a timeout, as the hostile-input
tests need: a memory bomb or a hang shows as a failed run, never as a stuck or swapped test suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from support import REPO

MB = 1 << 20

_PRELUDE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
"""


def run_limited(code: str, mem_mb: int = 1024, timeout: float = 60.0, stdin: bytes | None = None,
                args: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run code with RLIMIT_AS = mem_mb MiB; the result's stdout/stderr are text. TimeoutExpired propagates."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    prog = _PRELUDE.format(limit=mem_mb * MB) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog, *(args or [])], input=stdin, capture_output=True,
                          env=env, timeout=timeout, cwd=str(REPO))
