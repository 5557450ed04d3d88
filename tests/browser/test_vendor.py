"""The vendored JS tokenizer: the committed copy in `public/vendor/` is exactly what package.json
pins (so `wrangler deploy` ships no stale or hand-edited library), it carries its licence, and
no page loads code from anywhere but this site."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "node_modules" / "@huggingface" / "tokenizers"
VENDOR = ROOT / "public" / "vendor"


def test_vendored_tokenizer_is_the_pinned_release() -> None:
    assert PACKAGE.is_dir(), "node_modules lacks @huggingface/tokenizers: run `npm install` (make setup-test does)"
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["@huggingface/tokenizers"]
    assert json.loads((PACKAGE / "package.json").read_text())["version"] == pinned
    assert (VENDOR / "tokenizers.min.mjs").read_bytes() == (PACKAGE / "dist" / "tokenizers.min.mjs").read_bytes(), (
        "public/vendor/tokenizers.min.mjs is not node_modules' copy: run `make vendor` and commit it"
    )
    assert (VENDOR / "tokenizers.LICENSE").read_bytes() == (PACKAGE / "LICENSE").read_bytes()


def test_pages_load_nothing_from_other_sites() -> None:
    library = (VENDOR / "tokenizers.min.mjs").read_text()
    assert not re.search(r"\bimport\s*[({\"'*]|\bimport\(", library), "the vendored library must not import anything"
    for page in [*ROOT.joinpath("public").glob("*.html"), *ROOT.joinpath("public", "js").glob("*.mjs")]:
        text = page.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), f"{page.name} loads from another site"
        assert not re.search(r"""from\s+["'](https?:)?//""", text), f"{page.name} imports from another site"
