"""Readable failures: a mismatch report of the first differing cases instead of pytest's repr of them all; and
the run's skips counted by cause, one line each."""

from __future__ import annotations

import re
from collections import Counter

import pytest


def fail_if_any(bad, message: str) -> None:
    """Fail with a readable report (not pytest's repr of the whole mismatch list) when ``bad`` is non-empty."""
    if bad:
        pytest.fail(message, pytrace=False)


def mismatch_report(what: str, bad: list, total: int, ref: str) -> str:
    """How many of total cases of `what` differ from ref, and the first five as (text, got, want)."""
    lines = [f"{what}: {len(bad)} of {total} differ from {ref}; first ones:"]
    for text, got, want in bad[:5]:
        lines.append(f"  text={str(text)[:120]!r}\n    got  {str(got)[:200]}\n    want {str(want)[:200]}")
    return "\n".join(lines)


def assert_all_equal(what: str, cases, got, want, ref: str, text=lambda case: case) -> None:
    """Fail with a mismatch_report unless got(case) == want(case) for every case."""
    bad = [(text(c), g, w) for c in cases if (g := got(c)) != (w := want(c))]
    fail_if_any(bad, mismatch_report(what, bad, len(cases), ref))


def piece_mismatches(tok, oracle) -> list[tuple]:
    """(token, what minillama gave, llama.cpp's) for every id and special flag where token_to_piece differs."""
    return [(f"<token {i}>", f"token_to_piece(special={special}) {got!r}", want)
            for i in range(oracle.n_vocab) for special in (True, False)
            if (got := tok.token_to_piece(i, special=special)) != (want := oracle.piece(i, special))]


# Skip reasons that name one cause in several wordings (each test file words its own): one line for each.
_SAME_CAUSE = [
    (re.compile(r"\$?MINILLAMA_TEST_GGUF\b.*(not set|does not exist|no such file)", re.S),
     "MINILLAMA_TEST_GGUF is not set to a model file (the README's Run a model fetches one)"),
]


def skip_cause(reason: str) -> str:
    """The cause a skip reason names: the reason without pytest's 'Skipped: ', wordings of one cause made one."""
    reason = reason.removeprefix("Skipped: ").strip()
    for pattern, cause in _SAME_CAUSE:
        if pattern.search(reason):
            return cause
    return reason


def skip_summary(reasons: list[str]) -> list[str]:
    """'N tests: cause' for each cause of skipping, the most frequent first (ties in order of first appearance)."""
    counts = Counter(skip_cause(r) for r in reasons)
    return [f"{n} test{'s' if n != 1 else ''}: {cause}" for cause, n in counts.most_common()]
