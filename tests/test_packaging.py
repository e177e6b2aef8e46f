"""Packaging: what pip sees in pyproject.toml, and (slow) a fresh editable install as the
README gives it: no deprecation warnings, the console script, py.typed seen by mypy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import castore

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_a_backend_that_reads_it() -> None:
    """`project.license` is an SPDX string (a TOML table is deprecated and warns on every
    install), and the build requires a setuptools that understands it (77 or later)."""
    assert "Apache-2.0" == PYPROJECT["project"]["license"]
    assert ["setuptools>=77"] == PYPROJECT["build-system"]["requires"]


def test_python_m_castore_runs_the_cli() -> None:
    """`python -m castore` is the castore command (the demo's hint names it when the script
    is not installed): it prints the version and exits 0."""
    done = subprocess.run(
        [sys.executable, "-m", "castore", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (0, f"castore {castore.__version__}\n", "") == (
        done.returncode,
        done.stdout,
        done.stderr,
    )


def test_editable_install_is_a_plain_path_type_checkers_follow() -> None:
    """The packages' root is declared as the project root, so setuptools' editable install
    is a .pth path (mypy reads it) rather than an import-hook finder (mypy cannot)."""
    assert {"": "."} == PYPROJECT["tool"]["setuptools"]["package-dir"]
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["castore"]
    assert "py.typed" in data
    assert True is (ROOT / "castore" / "py.typed").is_file()
    # castore ui's templates ship too, each pattern naming files that exist.
    assert all(list((ROOT / "castore").glob(pattern)) for pattern in data)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
def test_the_readme_install_is_quiet_and_typed_for_a_users_mypy(tmp_path: Path) -> None:
    """A copy of the project installed into a fresh venv as the README says (with the pip
    CI upgrades to, which shows build warnings) prints no warning from the build backend,
    and mypy in that venv resolves `castore.Store.open` in a user's file outside the project
    (needs the package index)."""
    source = tmp_path / "castore-src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".castore",
            "build", "dist",
        ),
    )  # fmt: skip
    assert 0 == _run([sys.executable, "-m", "venv", ".venv"], source).returncode
    python = str(source / ".venv" / "bin" / "python")
    upgrade = _run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], source)
    assert 0 == upgrade.returncode, upgrade.stderr
    install = _run([python, "-m", "pip", "install", "--quiet", "-e", ".[dev,langgraph]"], source)
    assert 0 == install.returncode, install.stderr
    noisy = [
        line
        for line in (install.stdout + install.stderr).splitlines()
        if "BuildBackendWarning" in line or "eprecat" in line
    ]
    assert [] == noisy
    user = tmp_path / "user"
    user.mkdir()
    (user / "use_castore.py").write_text("import castore\n\nreveal_type(castore.Store.open)\n")
    checked = _run([str(source / ".venv" / "bin" / "mypy"), "use_castore.py"], user)
    assert 0 == checked.returncode, checked.stdout
    assert "-> castore.store.Store" in checked.stdout, checked.stdout
