"""The CLI reference documents every verb and every flag the parser takes."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from castore.cli import build_parser

# Where the CLI reference lives (its verb table: one row per verb, `castore VERB ...` first).
CLI_REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
_EVERY_VERB = {"-h", "--help", "--store"}  # documented once for all verbs, above the table


def _verb_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(verbs.choices)


def _usage_cells() -> dict[str, str]:
    """Each verb's usage as its row of the reference's table shows it (`castore VERB ...`)."""
    cells: dict[str, str] = {}
    for match in re.finditer(r"^\| `(castore ([a-z]+)[^`]*)` \|", CLI_REFERENCE.read_text(), re.M):
        cells[match.group(2)] = match.group(1)
    return cells


def test_the_reference_has_a_row_for_every_verb() -> None:
    """Every verb the parser knows has its row, and the store option is documented."""
    assert sorted(_verb_parsers()) == sorted(_usage_cells())
    assert "--store PATH" in CLI_REFERENCE.read_text()


@pytest.mark.parametrize("verb", sorted(_verb_parsers()))
def test_every_flag_of_a_verb_is_in_its_row(verb: str) -> None:
    """Each option a verb takes appears in its usage in the CLI reference."""
    usage = _usage_cells().get(verb, "")
    flags = {
        option
        for action in _verb_parsers()[verb]._actions
        for option in action.option_strings
        if option not in _EVERY_VERB
    }
    missing = sorted(f for f in flags if not re.search(rf"{re.escape(f)}(?![\w-])", usage))
    assert [] == missing, usage


@pytest.mark.parametrize("verb", sorted(_verb_parsers()))
def test_every_flag_of_a_verb_has_help_text(verb: str) -> None:
    """`castore VERB --help` says what each of its options does."""
    silent = [
        action.option_strings
        for action in _verb_parsers()[verb]._actions
        if action.option_strings and not action.help
    ]
    assert [] == silent
