"""The package's import structure, read from the source (ast) rather than from a running interpreter: what
docs/design.md states about who may import whom."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minillama"


def module_name(path: Path) -> str:
    """minillama/tokenizer/__init__.py -> 'minillama.tokenizer', minillama/cli.py -> 'minillama.cli'."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The minillama modules path imports, anywhere in it (inside functions and TYPE_CHECKING blocks too):
    for `from X import name`, X.name when that is a module of the package, else X."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
    return {m for m in found if m == "minillama" or m.startswith("minillama.")}


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
IMPORTS = {name: imports_of(path) for name, path in MODULES.items()}


def test_inspection_and_cli_use_the_tokenizers_public_face() -> None:
    """inspect and the CLI import minillama.tokenizer itself (and the public train module), never its tables,
    formats, decode internals or vocab module (issue 22: they reached past the public face)."""
    public = {"minillama.tokenizer", "minillama.tokenizer.train"}
    for user in ("minillama.inspection", "minillama.cli"):
        inside = {m for m in IMPORTS[user] if m.startswith("minillama.tokenizer")}
        assert inside <= public, f"{user} imports tokenizer internals: {sorted(inside - public)}"
