"""`import castore` and `castore --help` start fast (issue 26): the package's public names
are loaded on first use, and the CLI's parser loads no verb's library code."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import castore

INIT = Path(castore.__file__)
# What a read of the store needs; none of it is needed to import castore or to print --help.
HEAVY = ("castore.store", "castore.run.run", "castore.chain.objects", "attr", "cattrs", "msgspec")
# Standard modules only watch --exec needs: about 10 ms of every command's start.
ONE_VERBS = ("logging", "subprocess")


def _loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=INIT.parent.parent,
    ).stdout
    return set(out.split())


def test_import_castore_loads_none_of_the_library() -> None:
    loaded = _loaded_after("import castore")
    assert [] == [name for name in HEAVY if name in loaded]


def test_help_loads_no_verbs_library_code() -> None:
    loaded = _loaded_after("from castore.cli import build_parser\nbuild_parser().format_help()")
    assert [] == [name for name in (*HEAVY, *ONE_VERBS) if name in loaded]
    assert "castore.cli.inspect" in loaded  # the probe did build every verb's parser


def test_a_public_name_loads_its_module() -> None:
    loaded = _loaded_after("import castore\ncastore.Store")
    assert "castore.store" in loaded


def _type_checking_names() -> dict[str, str]:
    """name -> module of the imports under `if TYPE_CHECKING:` in castore/__init__.py."""
    found: dict[str, str] = {}
    for node in ast.parse(INIT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for child in node.body:
                assert isinstance(child, ast.ImportFrom)
                assert child.module
                found.update({alias.name: child.module for alias in child.names})
    return found


def test_the_names_mypy_sees_are_the_names_loaded() -> None:
    """The TYPE_CHECKING block (what mypy and mkdocstrings read) and the table __getattr__
    uses say the same, and together they are __all__."""
    assert _type_checking_names() == castore._WHERE
    assert {*castore._WHERE, "__version__"} == set(castore.__all__)


@pytest.mark.parametrize("name", sorted(castore._WHERE))
def test_each_public_name_is_its_modules_object(name: str) -> None:
    module = importlib.import_module(castore._WHERE[name])
    assert getattr(castore, name) is getattr(module, name)
    assert name in dir(castore)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Stor'"):
        _ = castore.Stor  # type: ignore[attr-defined]
    assert not hasattr(castore, "Stor")
