"""The documentation site covers the public API, and the README stays a short front page."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
# Each public module and the page of the site whose `::: module.NAME` directives render it.
API_PAGES = {
    "castore": REFERENCE / "api.md",
    "castore.aio": REFERENCE / "aio.md",
    "castore.langgraph": REFERENCE / "langgraph.md",
}
README_MAX_LINES = 250  # issue 24: what it is, the two commands, one example, promises, links


@pytest.mark.parametrize("module", sorted(API_PAGES))
def test_every_public_name_has_its_entry_in_the_api_reference(module: str) -> None:
    """Each name a public module exports (its __all__) is rendered on its reference page
    from its docstring, so a new export cannot go undocumented."""
    if module == "castore.langgraph":
        pytest.importorskip("langgraph")
    exported = set(importlib.import_module(module).__all__) - {"__version__"}
    page = API_PAGES[module].read_text(encoding="utf-8")
    documented = set(re.findall(rf"^::: {re.escape(module)}\.(\w+)$", page, re.M))
    assert [] == sorted(exported - documented)


def test_the_readme_is_short() -> None:
    """The README is a front page (at most ~250 lines); the user documentation is the site."""
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"
