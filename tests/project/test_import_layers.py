"""The package's import structure, read from the source (ast) rather than from a running interpreter: what
docs/design.md states about who may import whom."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "minillama"


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
            modules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
            found |= modules
            if len(modules) < len(node.names):  # names defined in base itself
                found.add(base)
    return {m for m in found if m == "minillama" or m.startswith("minillama.")}


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}

#: The layers of docs/design.md, lowest first: a module may import its own part and the parts of lower layers,
#: never a part of its own layer or above. Parts are minillama's top-level modules and packages.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("minillama", "errors"),                                 # the package's __init__ is its version alone
    ("fileio", "limited_worker", "request", "palette"),     # request: SamplingParams and Request
    ("gguffile", "chat_template", "_native"),
    ("backend",),                                            # MINILLAMA_BACKEND: the C core or the Python path
    ("tokenizer", "quants", "sampling"),                     # quants: ggml's block formats and their traits
    ("constrain", "embedding", "reasoning_budget"),          # JSON output's grammar; token_embd rows; thinking budget
    ("model", "generate", "dataset", "bench", "inspection", "toolcalls"),  # model: the forward pass
    ("ngram", "api"),                                        # api: the OpenAI shapes over model + generate
    ("chat", "serve"),
    ("cli",),
    ("__main__",),
)
LAYER = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def part(module: str) -> str:
    """The part a module belongs to: 'minillama.tokenizer.encoders.bpe' -> 'tokenizer', 'minillama' -> 'minillama'."""
    return module.split(".")[1] if "." in module else module
IMPORTS = {name: imports_of(path) for name, path in MODULES.items()}


def test_every_part_has_a_layer() -> None:
    """A new top-level module or package gets its place in docs/design.md (and in LAYERS) before it is used."""
    assert not {part(m) for m in MODULES} - set(LAYER), "parts missing from LAYERS / docs/design.md"


def test_no_part_shadows_a_package_it_imports() -> None:
    """No module or package of minillama is named like a top-level package the code imports (minillama/gguf/
    was named like the third-party gguf it reads files with)."""
    outside = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                outside |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                outside.add(node.module.split(".")[0])
    names = {m.rsplit(".", 1)[-1] for m in MODULES if m != "minillama"}
    assert not names & outside, sorted(names & outside)


def test_no_module_imports_its_own_layer_or_above() -> None:
    """Data flows one way (docs/design.md): the forward pass never imports the generation loop, the
    tokenizer never imports an application, the chat template never imports the tokenizer."""
    bad = [f"{m} imports {i}" for m, imps in IMPORTS.items() for i in imps
           if part(i) != part(m) and LAYER[part(i)] >= LAYER[part(m)]]
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    """No module reaches itself through the imports (module-level, function-level and TYPE_CHECKING alike;
    a package counts as its __init__), so each can be read, tested and replaced from the bottom up."""
    graph = {m: {i for i in imps if i in MODULES and i != m} for m, imps in IMPORTS.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_tokenizer_inside_flows_one_way() -> None:
    """Inside minillama.tokenizer: format readers and encoders never import each other (a reader knows files,
    an encoder knows merging), and no module below the facade imports the facade (tokenizer/__init__, which
    re-exports, or tokenizer/facade, the Tokenizer class); train, which builds a Tokenizer to check what it
    trained, sits above it."""
    face = {"minillama.tokenizer", "minillama.tokenizer.facade"}
    bad = []
    for m, imps in IMPORTS.items():
        if not m.startswith("minillama.tokenizer.") or m == "minillama.tokenizer.train":
            continue
        for i in imps:
            if i in face:
                bad.append(f"{m} imports the facade ({i})")
            for a, b in (("formats", "encoders"), ("encoders", "formats")):
                if m.startswith(f"minillama.tokenizer.{a}") and i.startswith(f"minillama.tokenizer.{b}"):
                    bad.append(f"{m} imports {i}")
    assert not bad, "\n".join(bad)


def test_inspection_and_cli_use_the_tokenizers_public_face() -> None:
    """inspect and the CLI import minillama.tokenizer itself (and the public train module), never its tables,
    formats, decode internals or vocab module (they reached past the public face)."""
    public = {"minillama.tokenizer", "minillama.tokenizer.train"}
    for user in ("minillama.inspection", "minillama.cli"):
        inside = {m for m in IMPORTS[user] if m.startswith("minillama.tokenizer")}
        assert inside <= public, f"{user} imports tokenizer internals: {sorted(inside - public)}"


def test_no_test_module_imports_another() -> None:
    """Test modules share code through tests/support/ only: importing a test module runs its module-level
    setup and couples two test files by their private names (_t5_gguf, Term, _hf_bert_from_gguf)."""
    tests = Path(__file__).resolve().parents[1]
    names = {p.stem for p in tests.glob("**/test_*.py")} | {"helpers", "conftest"}
    bad = []
    for path in sorted(tests.glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(tests)} imports {m}" for m in found if m.split(".")[0] in names]
    assert not bad, "\n".join(bad)


NATIVE = PACKAGE / "_native"


def test_only_binding_files_know_python() -> None:
    """In the native core only the bindings (module.c, bind*.c, bind.h) include Python.h, or bind.h which
    includes it: every algorithm is plain C, testable and reusable without CPython."""
    binding = re.compile(r"module\.c|bind(_\w+)?\.[ch]")
    includes = re.compile(r'^\s*#\s*include\s*[<"](Python\.h|bind\.h)[>"]', re.MULTILINE)
    sources = sorted(NATIVE.glob("*.[ch]"))
    assert any(p.name == "model.c" for p in sources)  # the sources were found
    bad = [f"{p.name} includes {m.group(1)}" for p in sources if not binding.fullmatch(p.name)
           for m in includes.finditer(p.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)


def test_module_c_is_module_init_and_each_area_has_its_binding() -> None:
    """module.c creates the module and asks each area's binding file to add its types and functions; it binds
    nothing itself."""
    areas = ["tokenizer", "quants", "model", "text", "sample"]
    assert {f"bind_{area}.c" for area in areas} <= {p.name for p in NATIVE.iterdir()}
    module = (NATIVE / "module.c").read_text(encoding="utf-8")
    assert not re.findall(r"PyTypeObject|PyArg_Parse\w*|Py_BEGIN_ALLOW_THREADS", module)
    assert re.findall(r"\badd_(\w+)\(m\)", module) == areas


def test_no_native_source_over_1000_lines() -> None:
    """Each C source and header of the native core stays under 1,000 lines: a binding per area, an algorithm
    per file."""
    lines = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(NATIVE.glob("*.[ch]"))}
    assert lines.get("module.c"), "the sources were not found"
    assert not {name: n for name, n in lines.items() if n > 1000}, lines
