"""mkdocs hooks for the documentation site (mkdocs.yml `hooks:`), run at build time only.

A table cell's code span writes a literal pipe as `\\|` so that GitHub does not split the cell
there; Python-Markdown already keeps a code span's pipes in one cell but would show the
backslash. The hook drops it inside code spans of table rows, so both renderings read `|`.
"""

from __future__ import annotations

import re
from typing import Any

_CODE_SPAN = re.compile(r"`[^`\n]*`")


def _unescape_pipes(match: re.Match[str]) -> str:
    return match.group(0).replace("\\|", "|")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Each table row's code spans with `\\|` in them, written with a plain `|`."""
    lines = markdown.split("\n")
    for index, line in enumerate(lines):
        if line.startswith("|") and "\\|" in line:
            lines[index] = _CODE_SPAN.sub(_unescape_pipes, line)
    return "\n".join(lines)
