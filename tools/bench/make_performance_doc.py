"""Write docs/performance.md from the saved benchmark results in tools/bench/results/*.json.

    python tools/bench/make_performance_doc.py            # rewrite docs/performance.md
    python tools/bench/make_performance_doc.py --check    # exit 1 when docs/performance.md is not what it writes
    python tools/bench/BENCH.py ... | python tools/bench/make_performance_doc.py record NAME \\
        --title "..." --command "python tools/bench/BENCH.py ..." --conditions "2 threads, load average 1.2"

The page is never edited by hand: it holds the current figures of each benchmark and the commands that reproduce
them, so a new run replaces a results file and the page is written again (tests/project/test_doc_examples.py checks that the page
equals this script's output and stays within MAX_LINES). History -- which run moved which figure -- belongs in
CHANGELOG.md.

A results file is one section of the page: {"order", "title", "command": [lines], "conditions", "blocks"}, each
block one of {"text": paragraph}, {"table": {"columns": [...], "rows": [[...]]}}, {"output": verbatim text}
or {"perf_ratio": {backend: perf_ratio.py's output}}.
`record` turns a benchmark's printed output into such a file: `perf_ratio.py` output is kept per backend (a native
run and a pure run share one table, a row a scenario), `bench_model.py` output the table of ratios against llama.cpp plus its exactness lines, anything else
is kept verbatim.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "tools" / "bench" / "results"
DOC = REPO / "docs" / "performance.md"
MAX_LINES = 250

HEAD = """\
# Performance

The current figures of every benchmark in `tools/bench/` and of `../shared/tools/perf_ratio.py`, each with the
command that reproduces it. Unless a section says otherwise: a 2-core x86-64 machine with AVX2, shared with other
jobs (each section gives the load average it ran at), 2 threads per engine, the native backend (the default). A ratio
is the peer's time over minillama's (or minillama's rate over the peer's): above 1, minillama is faster. Single runs
on a shared machine move by up to 30%, the one-pass rows most; compare ratios measured in the same minutes.

This page is written by `python tools/bench/make_performance_doc.py` from `tools/bench/results/*.json`; to update
a figure, run its command and record the output (`make_performance_doc.py record`), never edit the page by hand.
What changed the figures over time is in [CHANGELOG.md](../CHANGELOG.md).
"""

_PERF_RATIO = re.compile(r"^(?P<name>.+?)\s+(?P<ours>[\d.]+) ms\s+(?P<peer>[\d.]+) ms\s+x\s*(?P<ratio>[\d.]+)"
                         r"\s+goal x(?P<goal>[\d.]+)\s+(?P<status>ok|SHORT)\s*$")
_BENCH_MODEL = re.compile(r"^(?P<model>\S+)\s+(?P<engine>minillama|llama\.cpp)\s+(?P<prompt>\d+)\s+(?P<pp>[\d.]+)"
                          r"\s+(?P<tg>[\d.]+)\s+(?P<load>[\d.]+)\s+(?P<rss>\d+) MB\s+(?P<loadavg>[\d.]+)\s*$")


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def render_table(table: dict) -> list[str]:
    """A markdown table: the header, the rule, one line per row."""
    cols = table["columns"]
    out = ["| " + " | ".join(_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in table["rows"]:
        if len(row) != len(cols):
            raise ValueError(f"a row of {len(row)} cells under {len(cols)} columns: {row}")
        out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return out


def render_section(result: dict) -> list[str]:
    """One results file as a section: title, conditions, blocks, then the command that reproduces it."""
    out = [f"## {result['title']}", ""]
    if result.get("conditions"):
        out += [result["conditions"], ""]
    for block in result["blocks"]:
        if "text" in block:
            out += [block["text"], ""]
        elif "table" in block:
            out += [*render_table(block["table"]), ""]
        elif "perf_ratio" in block:
            out += [*render_table(perf_ratio_table(block["perf_ratio"])), ""]
        elif "output" in block:
            out += ["```", *block["output"].rstrip("\n").split("\n"), "```", ""]
        else:
            raise ValueError(f"a block must hold text, table or output: {sorted(block)}")
    out += ["To reproduce:", "", "```", *result["command"], "```", ""]
    return out


def load_results(folder: Path = RESULTS) -> list[dict]:
    """Every results file, in their "order"."""
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    return sorted(results, key=lambda r: (r["order"], r["title"]))


def render(results: list[dict]) -> str:
    """The whole page."""
    lines = HEAD.rstrip("\n").split("\n") + [""]
    for result in results:
        lines += render_section(result)
    text = "\n".join(lines).rstrip("\n") + "\n"
    n = text.count("\n")
    if n > MAX_LINES:
        raise ValueError(f"docs/performance.md would be {n} lines, more than {MAX_LINES}: shorten a results file")
    return text


def _perf_ratio_rows(output: str) -> dict[str, list[str]]:
    """perf_ratio.py's printed scenario lines: {scenario: [ms pair, ratio and goal]}."""
    rows = {}
    for line in output.strip("\n").split("\n"):
        m = _PERF_RATIO.match(line.strip())
        if m:
            short = ", short" if m["status"] == "SHORT" else ""
            rows[m["name"]] = [f"{m['ours']} / {m['peer']} ms", f"{m['ratio']}x (>= {m['goal']}x{short})"]
    return rows


def perf_ratio_table(outputs: dict[str, str]) -> dict:
    """perf_ratio.py's output on each backend ({"native": text, "pure": text}) as one table, a row a scenario."""
    per = {backend: _perf_ratio_rows(text) for backend, text in outputs.items()}
    names = list(dict.fromkeys(n for rows in per.values() for n in rows))
    cols = ["scenario"]
    for backend in per:
        cols += [f"{backend}: minillama / peer", f"{backend}: ratio (goal)"]
    return {"columns": cols, "rows": [[n, *(c for rows in per.values() for c in rows.get(n, ["", ""]))]
                                      for n in names]}


def bench_model_blocks(output: str) -> list[dict]:
    """bench_model.py's printed lines as ratios against llama.cpp, figures in brackets; exactness lines as text."""
    runs: dict[str, dict[str, dict]] = {}
    exact = []
    for line in output.strip("\n").split("\n"):
        m = _BENCH_MODEL.match(line.strip())
        if m:
            runs.setdefault(m["model"], {})[m["engine"]] = m.groupdict()
        elif line.startswith("exactness "):
            exact.append(line)
    rows = []
    for model, pair in runs.items():
        a, b = pair.get("minillama"), pair.get("llama.cpp")
        if not (a and b):
            continue

        def ratio(key: str, unit: str, a: dict = a, b: dict = b) -> str:
            return f"{float(a[key]) / float(b[key]):.2f}x ({a[key]} vs {b[key]}{unit})"

        rows.append([model, ratio("pp", " tok/s"), ratio("tg", ""), ratio("rss", " MB"), ratio("load", " s")])
    cols = ["model", "prompt vs llama.cpp", "generation vs llama.cpp", "peak RSS vs llama.cpp", "load time"]
    blocks: list[dict] = [{"table": {"columns": cols, "rows": rows}}]
    if exact:
        blocks.append({"output": "\n".join(exact)})
    return blocks


def record(name: str, output: str, title: str, command: str, conditions: str, order: int) -> Path:
    """Save a benchmark's printed output as results/NAME.json, converted where its format is known."""
    path = RESULTS / f"{name}.json"
    if any(_PERF_RATIO.match(line.strip()) for line in output.split("\n")):
        # one block holds each backend's output: this run replaces its backend's, the other's stays
        backend = "pure" if "MINILLAMA_BACKEND=pure" in output.split("\n")[0] else "native"
        old = json.loads(path.read_text(encoding="utf-8"))["blocks"] if path.exists() else []
        outputs = next((b["perf_ratio"] for b in old if "perf_ratio" in b), {})
        blocks = [{"perf_ratio": {**outputs, backend: output.strip("\n")}}]
    elif any(_BENCH_MODEL.match(line.strip()) for line in output.split("\n")):
        blocks = bench_model_blocks(output)
    else:
        blocks = [{"output": output}]
    commands = [command]
    if "perf_ratio" in blocks[0] and path.exists():  # the other backend's command stays with its output
        commands = list(dict.fromkeys([*json.loads(path.read_text(encoding="utf-8"))["command"], command]))
    result = {"order": order, "title": title, "command": commands, "conditions": conditions, "blocks": blocks}
    path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/performance.md differs; write nothing")
    rec = sub.add_parser("record", help="save a benchmark's output (stdin) as tools/bench/results/NAME.json")
    rec.add_argument("name")
    rec.add_argument("--title", required=True)
    rec.add_argument("--command", required=True, help="the command line that printed the output")
    rec.add_argument("--conditions", default="", help="machine, load average, threads: what the figures depend on")
    rec.add_argument("--order", type=int, default=100, help="the section's place on the page (smaller first)")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        path = record(args.name, sys.stdin.read(), args.title, args.command, args.conditions, args.order)
        print(f"wrote {path.relative_to(REPO)}; now run {Path(__file__).relative_to(REPO)} to rewrite the page")
        return 0
    text = render(load_results())
    if args.check:
        if DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC.relative_to(REPO)} is not what {Path(__file__).name} writes: run it", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(REPO)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
