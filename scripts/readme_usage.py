"""Print the usage line of every minillama command, as docs/cli.md's "Command line" block shows them.

Usage: python scripts/readme_usage.py [--write]   (--write: replace the block in docs/cli.md; tests/cli/test_cli_help_and_errors.py
checks docs/cli.md against the same lines)
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

from minillama.cli import build_parser


def usage_lines() -> list[str]:
    """One line per command (nested actions too), argparse's usage without 'usage: ' and '[-h] '."""
    lines: list[str] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and parser.prog != "minillama":
            for p in subs[0].choices.values():
                walk(p)
            return
        if not subs:
            text = parser.format_usage().removeprefix("usage: ")
            lines.append(re.sub(r"\s+", " ", text).replace(" [-h]", "").strip())
            return
        for p in subs[0].choices.values():
            walk(p)

    walk(build_parser())
    return lines


USAGE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"  # the page that holds the usage block
BLOCK = re.compile(r"(^#{1,2} Command line\n\n```\n)(.*?)(```\n)", re.S | re.M)


def wrapped(line: str, width: int = 110) -> str:
    """A usage line wrapped at width, continuation lines indented under the first option."""
    head = " ".join(line.split(" ")[:3 if line.startswith("minillama ngram ") else 2]) + " "
    return textwrap.fill(line, width, subsequent_indent=" " * len(head), break_long_words=False,
                         break_on_hyphens=False)


def readme_block(text: str) -> str:
    """The command block of docs/cli.md."""
    m = BLOCK.search(text)
    if m is None:
        raise SystemExit("docs/cli.md has no '# Command line' block")
    return m.group(2)


if __name__ == "__main__":
    block = "".join(wrapped(line) + "\n" for line in usage_lines())
    if "--write" in sys.argv[1:]:
        text = USAGE_PAGE.read_text(encoding="utf-8")
        USAGE_PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + block + m.group(3), text, count=1), encoding="utf-8")
    else:
        print(block, end="")
