"""`--json` on every verb that reports something: one parseable document per line, with the
fields the README documents. CLI tests: castore.cli.main(argv) in-process."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import cli
from test_cli import TASK, make_finished, make_unresolved

import castore
from castore.cli import build_parser


def json_lines(out: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in out.splitlines()]
    assert all(isinstance(row, dict) for row in rows), rows
    return rows


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(verbs.choices)


@pytest.mark.parametrize("verb", sorted(verb_parsers()))
def test_every_verb_takes_json(verb: str) -> None:
    """Every verb (each reports something) accepts --json."""
    options = {o for action in verb_parsers()[verb]._actions for o in action.option_strings}
    assert "--json" in options


def test_init_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`init --json` prints one object naming the store and its format version."""
    code, out, err = cli(capsys, "init", str(tmp_path / "s"), "--json")
    assert (0, "") == (code, err)
    expected = {"store": str(tmp_path / "s"), "format": castore.codec.FORMAT_VERSION}
    assert [expected] == json_lines(out)
    assert [] == castore.Store.open(tmp_path / "s").tasks()


@pytest.mark.parametrize("confirmed", [True, False])
def test_resolve_json(
    store: castore.Store, capsys: pytest.CaptureFixture[str], confirmed: bool
) -> None:
    """`resolve --json` prints one object: task, effect, the state recorded, the receipt
    and the id of the new snapshot, which is the task's HEAD."""
    make_unresolved(store)
    decision = ["--confirmed", "rc-9"] if confirmed else ["--not-done", "--reason", "not sent"]
    code, out, err = cli(
        capsys, "--store", store.root, "resolve", TASK, "charge", *decision, "--json"
    )
    assert (0, "") == (code, err)
    (row,) = json_lines(out)
    head_id, head = store.history(TASK)[0]
    assert {
        "task": TASK,
        "effect": "charge",
        "state": "CONFIRMED" if confirmed else "NOT_DONE",
        "receipt": "rc-9" if confirmed else None,
        "snapshot": head_id,
    } == row
    assert row["state"] == head.transition.effect_to.value


@pytest.mark.parametrize("dry_run", [True, False])
def test_gc_json(store: castore.Store, capsys: pytest.CaptureFixture[str], dry_run: bool) -> None:
    """`gc --json` prints one object listing what was (or would be) removed, bytes freed,
    what was kept for being young, and tasks it could not read."""
    make_finished(store, "kept")
    stray = store.put_blob({"unreferenced": True}).blob
    old = Path(store.objects.path(stray))
    os.utime(old, (1, 1))
    young = store.put_blob({"young": True}).blob
    size = old.stat().st_size
    flags = ["--grace", "1d", *(["--dry-run"] if dry_run else [])]
    code, out, err = cli(capsys, "--store", store.root, "gc", *flags, "--json")
    assert (0, "") == (code, err)
    (row,) = json_lines(out)
    kept_young = row.pop("kept_young")
    assert {
        "dry_run": dry_run,
        "removed": [f"objects/{stray[:2]}/{stray}"],
        "bytes_freed": size,
        "unreadable_tasks": [],
        "unreadable_objects": {},
        "forgotten": [],
        "names_restored": [],
    } == row
    assert True is (isinstance(kept_young, int) and kept_young >= 1)  # the young blob at least
    assert (dry_run, True) == (old.exists(), Path(store.objects.path(young)).exists())


def test_demo_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --json` prints no narration, only one object with the evidence: one charge."""
    code, out, err = cli(capsys, "demo", str(tmp_path / "d"), "--json")
    assert (0, "") == (code, err)
    (row,) = json_lines(out)
    assert (str(tmp_path / "d"), "demo-order-1", True) == (row["store"], row["task"], row["ok"])
    assert 1 == row["applied"]["charge"]
    assert set(row["applied"].values()) == {1}
    assert castore.Store.open(tmp_path / "d").verify("demo-order-1").length == row["snapshots"]
