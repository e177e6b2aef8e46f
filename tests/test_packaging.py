"""Packaging: what pip sees in pyproject.toml, and (slow) a fresh editable install as the
README gives it: no deprecation warnings, the console script, py.typed seen by mypy."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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
