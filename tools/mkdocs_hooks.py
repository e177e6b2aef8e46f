"""mkdocs hooks for the documentation site (mkdocs.yml `hooks:`), run at build time only.

The pages are written for GitHub's Markdown and read there too; two of its rules differ from
Python-Markdown's, which builds the site, and the hook bridges them without touching the files:

- A table cell's code span writes a literal pipe as `\\|` so that GitHub does not split the cell
  there; Python-Markdown already keeps a code span's pipes in one cell but would show the
  backslash, so the hook drops it.
- A nested list item is nested on GitHub when it starts at its parent's text (2 spaces under
  `- `, 3 under `1. `); Python-Markdown wants 4 spaces per level and otherwise flattens the
  list, which loses the structure of FORMAT.md's numbered procedures. The hook re-indents
  every line of a list to 4 spaces per level.
"""

from __future__ import annotations

import re
from typing import Any

_CODE_SPAN = re.compile(r"`[^`\n]*`")
_ITEM = re.compile(r"^( *)([-*+]|\d+[.)])( +)(\S.*)$")
_FENCE = re.compile(r"^ *(```|~~~)")


def _unescape_pipes(match: re.Match[str]) -> str:
    return match.group(0).replace("\\|", "|")


def table_pipes(line: str) -> str:
    """A table row with its code spans' `\\|` written as a plain `|`."""
    if line.startswith("|") and "\\|" in line:
        return _CODE_SPAN.sub(_unescape_pipes, line)
    return line


def nest_lists(lines: list[str]) -> list[str]:
    """The lines with every list item and continuation line indented 4 spaces per level,
    the levels read as GitHub reads them (an item is nested when it starts at or past the
    text of the item above it)."""
    out: list[str] = []
    texts: list[int] = []  # the source column where each open item's text starts
    fenced = blank_before = False
    for line in lines:
        fence = _FENCE.match(line) is not None
        fenced ^= fence
        if fenced or fence or not line.strip():
            out.append(line)
            blank_before = not (fenced or fence)
            continue
        indent = len(line) - len(line.lstrip(" "))
        item = _ITEM.match(line)
        if item and (indent == 0 or texts):
            while texts and texts[-1] > indent:
                texts.pop()
            if indent == 0:
                texts.clear()
            out.append(" " * 4 * len(texts) + line.lstrip(" "))
            texts.append(indent + len(item.group(2)) + len(item.group(3)))
        elif not texts or (indent == 0 and blank_before):
            texts.clear()
            out.append(line)
        elif indent == 0:
            out.append(line)  # a lazy continuation line of the item above
        else:
            if blank_before:
                while len(texts) > 1 and texts[-1] > indent:
                    texts.pop()
            out.append(" " * 4 * len(texts) + line.lstrip(" "))
        blank_before = False
    return out


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's Markdown as Python-Markdown needs it to render as GitHub does."""
    return "\n".join(table_pipes(line) for line in nest_lists(markdown.split("\n")))
