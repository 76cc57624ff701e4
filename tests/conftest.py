"""The test suite's fixtures; the plain helpers they use live in tests/support/ (test modules import from
there, never from each other)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tests/ on sys.path makes `import support` work under any import mode and any working directory.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from support.fixtures import HFBpe, train_hf_bpe, write_gpt2_gguf
from support.paths import release_tokenizers, require_shared
from support.report import skip_summary


@pytest.fixture(scope="session")
def shared() -> Path:
    """The shared/ directory (skips when absent)."""
    return require_shared()


@pytest.fixture(scope="module", autouse=True)
def _release_tokenizers_after_module():
    """Drop cached tokenizers after each module so that big vocabs don't pile up in memory."""
    yield
    release_tokenizers()


@pytest.fixture(scope="session")
def hf_bpe(tmp_path_factory) -> HFBpe:
    """Small HF-trained byte-level BPE converted to a GGUF (model gpt2, pre gpt-2) in a temp dir."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gguf")
    hf = train_hf_bpe()
    path = tmp_path_factory.mktemp("hf_bpe") / "hf-bpe-small.gguf"
    write_gpt2_gguf(path, hf)
    return HFBpe(hf, path)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """xdist groups (used by --dist loadgroup): files whose tests bound wall time or memory peaks mark themselves
    `pytestmark = pytest.mark.xdist_group("bounds")`, so one worker runs them one after another, never two side by
    side (.ci/run: -n 2 --dist loadgroup); every other file's tests are a group of their own, so that a worker runs
    a file whole and its module-scoped fixtures (vocabs, trained tokenizers, servers) are built once, not twice."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(str(item.path)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The skipped tests counted by cause, one line each ("N tests: why"), instead of a line per test (-rs)."""
    reports = terminalreporter.stats.get("skipped", [])
    reasons = [r.longrepr[2] for r in reports if isinstance(r.longrepr, tuple) and len(r.longrepr) == 3]
    if reasons:
        terminalreporter.write_sep("=", "skipped, by cause")
        for line in skip_summary(reasons):
            terminalreporter.write_line(line)
