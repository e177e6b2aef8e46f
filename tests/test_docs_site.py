"""The documentation site covers the public API, and the README stays a short front page."""

from __future__ import annotations

import functools
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


# Each class whose reference lists its members, the members a user meets first, and the
# public members it leaves out on purpose: what fsck, gc and castore's own layers use, and
# the attributes its page tells in prose (they have no docstring of their own to render).
_STORE_LEFT_OUT = "unmarked seal_run medium layout objects root format_version"
_RUN_IN_PROSE = "task_id plan plan_id head head_id done"
_RUN_INTERNAL = (
    "chain_clock env_unverified outcome planned snapshot_at advance sealed_through_head "
    "seal_now now_ms live_env record_outcome carry_outcome objects allow_fields task_place "
    "run_id writes_v2 stale checked_result record_step grown_by frontier_step"
)
_ARUN_IN_PROSE = "task_id head next_step finished grows plan_digest position done receipt"
LISTED: dict[str, tuple[Path, tuple[str, ...], frozenset[str]]] = {
    "castore.Store": (
        REFERENCE / "api.md",
        ("open", "init", "open_task"),
        frozenset(_STORE_LEFT_OUT.split()),
    ),
    "castore.Run": (
        REFERENCE / "api.md",
        ("pending", "commit_step", "result"),
        frozenset(f"{_RUN_IN_PROSE} {_RUN_INTERNAL}".split()),
    ),
    "castore.aio.AsyncStore": (REFERENCE / "aio.md", ("open_task",), frozenset({"pool"})),
    "castore.aio.AsyncRun": (
        REFERENCE / "aio.md",
        ("result", "commit_step"),
        frozenset(f"{_ARUN_IN_PROSE} run pool stale claim release wait_in_flight".split()),
    ),
    "castore.aio.AsyncCall": (REFERENCE / "aio.md", ("confirm", "not_done"), frozenset({"pool"})),
}


def _listed_members(page: Path, name: str) -> list[str]:
    """The `members:` list of the `::: name` directive on `page`, in its order."""
    text = page.read_text(encoding="utf-8")
    found = re.search(rf"^::: {re.escape(name)}\n((?:    .*\n)*)", text, re.M)
    assert found is not None, f"{page.name} has no `::: {name}`"
    block = found.group(1)
    assert "      members:\n" in block, f"`::: {name}` on {page.name} lists no members"
    return re.findall(r"^        - (\w+)$", block.split("      members:\n", 1)[1], re.M)


@functools.cache
def _package() -> Any:
    griffe = pytest.importorskip("griffe")  # the docs extra's, as the site build's
    return griffe.load("castore", search_paths=[str(ROOT)], resolve_aliases=True)


def _public_members(name: str) -> set[str]:
    """What mkdocstrings would render of class `name` without a list: every member griffe
    finds (inherited ones and attributes set in __init__ too) not named with '_'."""
    found = _package()[name.removeprefix("castore.")]
    found = found.final_target if found.is_alias else found
    members = {**found.inherited_members, **found.members}
    return {member for member in members if not member.startswith("_")}


@pytest.mark.parametrize("name", sorted(LISTED))
def test_the_api_reference_renders_the_public_members_users_meet_first(name: str) -> None:
    """A class's reference lists its members, leading with the ones a user meets first, and
    renders exactly its public API: every public member is listed or left out on purpose,
    so an internal one (`Store.unmarked`, `Run.writes_v2`) is never rendered, and a new
    member is a decision."""
    page, leads, left_out = LISTED[name]
    listed = _listed_members(page, name)
    public = _public_members(name)
    assert list(leads) == listed[: len(leads)]
    assert ([], [], []) == (
        sorted(set(listed) - public),  # listed, but no such member
        sorted(set(listed) & left_out),
        sorted(public - left_out - set(listed)),  # neither listed nor left out
    )
    assert len(listed) == len(set(listed))


def test_the_home_page_names_object_storage_as_the_readme_does() -> None:
    """The site's home page says in its first paragraph that a store may be an S3 bucket
    prefix, and its "get a job done" row links the object-storage guide, as the README does."""
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    first = home.split("\n\n")[1]
    (row,) = [line for line in home.splitlines() if line.startswith("| get a job done |")]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (True, True, True, True) == (
        "(docs/howto/object-storage.md)" in readme.split("\n\n")[1],
        "S3 bucket prefix" in first,
        "(howto/object-storage.md)" in first,
        "(howto/object-storage.md)" in row,
    )


def _code_lines(text: str) -> list[str]:
    """The lines inside the fenced code blocks of a Markdown text."""
    return [line for _, lines in _code_blocks(text) for line in lines]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_command_line_is_spelled_castore_as_castores_own_hints_spell_it() -> None:
    """Every command block runs `castore ...` with the venv activated, as the hints castore
    prints say it, and the home page says once how to activate it; only the install
    one-liner, which makes the venv, calls its script by path (the README's, which .ci/run
    and test_readme pin as two commands)."""
    spelled = [
        f"{page.relative_to(ROOT)}: {line.strip()}"
        for page in _pages()
        for line in _code_lines(page.read_text(encoding="utf-8"))
        if re.search(r"(^|[\s;&|(])\.venv/bin/castore\b", line)
        and not line.startswith("python3 -m venv .venv && ")
    ]
    assert [] == spelled
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "python3 -m venv .venv && . .venv/bin/activate\n" in _code_lines(home)[0] + "\n"
    assert "in a new shell, run `. .venv/bin/activate` again" in home


# What a code block shows at 1,280 px without scrolling: 80 characters (measured in chromium:
# the content column between both sidebars leaves 656 px inside a block, at 8.18 px a
# character of the 13.6 px monospace font). Code and commands are kept within it; program
# output (text, json) and FORMAT.md's exact bytes and trees scroll, as they cannot wrap.
CODE_WIDTH = 80
WRAPPED = ("python", "py", "sh", "js")


def _code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced code block of a Markdown text."""
    blocks: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in text.splitlines():
        marker = re.match(r"\s*(```+|~~~+)(\S*)", line)
        if marker is not None and (fence is None or marker.group(1).startswith(fence)):
            if fence is None:
                fence = marker.group(1)
                blocks.append((marker.group(2), []))
            else:
                fence = None
        elif fence is not None:
            blocks[-1][1].append(line)
    return blocks


def test_code_blocks_fit_the_width_a_reader_sees() -> None:
    """No line of code or of a command in the README or the site is wider than a code block
    shows at 1,280 px, so no comment hides behind a scrollbar ("# starts the task, or
    resumes it" did). The README's first block is GitHub's, wider, and pinned (above)."""
    wide = [
        f"{page.relative_to(ROOT)}: {len(line)}: {line.strip()}"
        for page in _pages()
        for index, (language, lines) in enumerate(_code_blocks(page.read_text("utf-8")))
        if language in WRAPPED and not (page.name == "README.md" and index == 0)
        for line in lines
        if len(line) > CODE_WIDTH
    ]
    assert [] == wide
