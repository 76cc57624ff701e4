"""Write llama.cpp's ids for the derived vocabs of tests/derived_vocabs.py to tests/data/derived_expected.json.

Usage (from the repository root, with ../shared beside it and the oracle installed: pip install ".[oracle]"):
    python tools/make_derived_expected.py [RECIPE ...]      (names: remake only these entries)
Texts are stored as the hex of their bytes (they hold raw, non-UTF-8 bytes).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MINILLAMA_SHARED", ROOT.parent / "shared"))
sys.path[:0] = [str(ROOT / "tests"), str(SHARED / "tools")]

from llamacpp_oracle import Oracle  # noqa: E402
from support.derived_vocabs import RECIPES, build, texts_for  # noqa: E402


def main(only: list[str]) -> None:
    """Write every recipe's ids, or with names given only theirs (the other entries of the file kept)."""
    path = ROOT / "tests" / "data" / "derived_expected.json"
    out: dict[str, list[dict[str, object]]] = json.loads(path.read_text(encoding="utf-8")) if only else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in only or RECIPES:
            oracle = Oracle(str(build(name, SHARED / "vocab", Path(tmp))))
            rows = out[name] = []
            for text in texts_for(name):
                data = text.encode("utf-8", "surrogateescape")
                rows.append({"hex": data.hex(), "ids": oracle.tokenize(data, False, False),
                             "ids_special": oracle.tokenize(data, True, True)})
    path.write_text(json.dumps(out, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {path}: {sum(map(len, out.values()))} cases over {len(out)} vocabs")


if __name__ == "__main__":
    main(sys.argv[1:])
