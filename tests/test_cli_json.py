"""`--json` on every verb that reports something: one parseable document per line, with the
fields the CLI reference (docs/reference/cli.md) documents. CLI tests: castore.cli.main(argv)
in-process."""

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
from castore.cli.watch import alert_json
from castore.watch.alerts import Alert


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
    expected = {
        "type": "init",
        "store": str(tmp_path / "s"),
        "format": castore.format.codec.FORMAT_VERSION,
    }
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
        "type": "resolve",
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
        "type": "gc",
        "dry_run": dry_run,
        "removed": [f"objects/{stray[:2]}/{stray}"],
        "bytes_freed": size,
        "kept_pending": 0,
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
    assert "demo" == row["type"]
    assert 1 == row["applied"]["charge"]
    assert set(row["applied"].values()) == {1}
    assert castore.Store.open(tmp_path / "d").verify("demo-order-1").length == row["snapshots"]


CLI_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"


def _types(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    """The `type` of each line `castore ARGV --json` prints (every line must have one)."""
    _, out, _ = cli(capsys, *argv, "--json")
    rows = json_lines(out)
    assert all(isinstance(row.get("type"), str) for row in rows), rows
    return [row["type"] for row in rows]


def test_every_json_line_of_every_verb_has_a_type(
    tmp_path: Path, store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each verb's --json lines carry a "type" (the verb's name for one object; per kind of
    line in a stream, totals last as "summary"), each type is in the CLI reference's table, and
    the old keys are kept (status's summary is still under "summary")."""
    root = str(store.root)
    make_unresolved(store)
    make_finished(store, "kept")
    stream = {
        "status": ["task", "task", "summary"],
        "log": ["snapshot"] * len(store.history(TASK)),
        "fsck": None,  # findings, then the summary
        "upgrade": None,
    }
    seen = {
        "init": _types(capsys, "init", str(tmp_path / "new")),
        "status": _types(capsys, "--store", root, "status"),
        "brief": _types(capsys, "--store", root, "brief", TASK),
        "log": _types(capsys, "--store", root, "log", TASK),
        "show": _types(capsys, "--store", root, "show", f"{TASK}@1"),
        "fork": _types(capsys, "--store", root, "fork", f"{TASK}@1", "forked"),
        "resolve": _types(capsys, "--store", root, "resolve", TASK, "charge", "--confirmed", "r"),
        "forget": _types(capsys, "--store", root, "forget", "kept", "--why", "done"),
        "fsck": _types(capsys, "fsck", root, "--quarantine"),
        "gc": _types(capsys, "gc", root),
        "upgrade": _types(capsys, "upgrade", root),
        "doctor": _types(capsys, "doctor", str(tmp_path)),
    }
    for verb, types in seen.items():
        expected = stream.get(verb, [verb])
        if expected is None:
            assert "summary" == types[-1], (verb, types)
        else:
            assert expected == types, verb
    assert {"finding", "quarantine"} >= set(seen["fsck"][:-1])
    assert "quarantine" in seen["fsck"]
    table = CLI_PAGE.read_text().split("## JSON output", 1)[1].split("## Exit codes", 1)[0]
    for kind in {kind for types in seen.values() for kind in types} | {"alert", "demo"}:
        assert f"`{kind}`" in table, kind
    _, out, _ = cli(capsys, "--store", root, "status", "--json")
    assert {"tasks", "open", "unresolved", "broken"} == set(json_lines(out)[-1]["summary"])


def test_a_damaged_slot_and_an_alert_have_their_types(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log --json` of a damaged chain types its damaged slot; watch's JSON (stdout and a
    hook's stdin) types each alert."""
    make_finished(store, "kept")
    slot = Path(store.layout.slot_path("kept", 1))
    os.chmod(slot, 0o644)
    slot.write_bytes(slot.read_bytes()[:20])
    assert ["snapshot", "damaged_slot", "snapshot"] == _types(
        capsys, "--store", str(store.root), "log", "kept"
    )
    alert = Alert("unresolved", "raised", "t", "charge", "cas-1", "ask the service", 1.5)
    assert {"type": "alert", **alert.to_dict()} == json.loads(alert_json(alert))
