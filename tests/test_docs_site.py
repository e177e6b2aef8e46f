"""The documentation site covers the public API, and the README stays a short front page."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

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


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", ROOT / "tools" / "mkdocs_hooks.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_nests_lists_as_github_does() -> None:
    """An item indented to its parent's text (GitHub's rule: 2 spaces under `- `, 3 under
    `1. `) is re-indented 4 spaces per level for Python-Markdown, continuation lines with it;
    a list ends at a blank line followed by an unindented paragraph; code fences are kept."""
    source = [
        "1. Store the object.",
        "   - **v1 store:** all of it,",
        "     so its name is durable.",
        "     - deeper",
        "   - **v2 store:** without",
        "2. Link it.",
        "",
        "Not in the list.",
        "```",
        "   - not a list item",
        "```",
    ]
    expected = [
        "1. Store the object.",
        "    - **v1 store:** all of it,",
        "        so its name is durable.",
        "        - deeper",
        "    - **v2 store:** without",
        "2. Link it.",
        "",
        "Not in the list.",
        "```",
        "   - not a list item",
        "```",
    ]
    assert expected == _hooks().nest_lists(source)


def test_the_site_shows_a_pipe_in_a_table_cells_code_span() -> None:
    """`\\|` in a table row's code span (GitHub's way to keep the cell whole) shows as `|`;
    outside tables and outside code spans the text is left as written."""
    hooks = _hooks()
    assert "| `castore log TASK|--thread NAME` | a\\|b |" == hooks.table_pipes(
        "| `castore log TASK\\|--thread NAME` | a\\|b |"
    )
    assert "text `a\\|b`" == hooks.table_pipes("text `a\\|b`")
