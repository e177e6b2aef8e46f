"""`castore show` by an abbreviated id, and `log`/`show` of a chain with a damaged slot.

CLI tests: call castore.cli.main(argv) in-process, assert exit codes, lines and --json.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from helpers import cli, rewrite
from test_cli import TASK, assert_one_error_line, make_unresolved

import castore
from castore.cli.lookup import MIN_PREFIX
from castore.format import codec
from castore.format.digest import hash_bytes


def two_blobs_sharing_a_prefix() -> tuple[int, int, str]:
    """Two small ints whose blob objects' ids share their first MIN_PREFIX digits."""
    seen: dict[str, int] = {}
    for number in itertools.count():
        prefix = hash_bytes(codec.frame("blob", codec.encode_value(number)))[:MIN_PREFIX]
        if prefix in seen:
            return seen[prefix], number, prefix
        seen[prefix] = number
    raise AssertionError("unreachable")


def test_show_accepts_the_ids_log_prints(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each 12-digit id `log` prints, and its first MIN_PREFIX digits, show the same object
    as the full id."""
    make_unresolved(store)
    code, out, _ = cli(capsys, "--store", store.root, "log", TASK)
    assert 0 == code
    for (full_id, _), line in zip(store.history(TASK), out.splitlines(), strict=True):
        short = line.split()[3]
        assert full_id[:12] == short
        full = cli(capsys, "--store", store.root, "show", full_id, "--json")
        assert (0, "") == (full[0], full[2])
        assert full == cli(capsys, "--store", store.root, "show", short, "--json")
        assert full == cli(capsys, "--store", store.root, "show", full_id[:MIN_PREFIX], "--json")
        assert full_id == json.loads(full[1])["id"]


def test_an_ambiguous_prefix_is_a_usage_error_naming_the_candidates(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prefix two objects share exits 2 with one line naming both; one digit more that
    tells them apart shows the right one."""
    first, second, prefix = two_blobs_sharing_a_prefix()
    ids = [store.put_blob(first).blob, store.put_blob(second).blob]
    code, out, err = cli(capsys, "--store", store.root, "show", prefix)
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert "ambiguous" in err
    for object_id in ids:
        assert f"{object_id[:16]} (blob)" in err
    common = next(i for i, (a, b) in enumerate(zip(*ids, strict=True)) if a != b)
    for object_id, value in zip(ids, (first, second), strict=True):
        row = json.loads(
            cli(capsys, "--store", store.root, "show", object_id[: common + 1], "--json")[1]
        )
        assert (object_id, value) == (row["id"], row["value"])


@pytest.mark.parametrize("ref", ["abc", "abcde", "ABCDEF12", "abcdefg"])
def test_a_short_or_non_hex_prefix_is_a_usage_error(
    store: castore.Store, capsys: pytest.CaptureFixture[str], ref: str
) -> None:
    """Fewer than MIN_PREFIX digits, upper case or a non-hex character exits 2, one line."""
    make_unresolved(store)
    code, out, err = cli(capsys, "--store", store.root, "show", ref)
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert f"at least {MIN_PREFIX}" in err


def test_a_prefix_no_object_has_is_a_usage_error(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A well-formed prefix of no object exits 2: 'no object with that prefix'."""
    make_unresolved(store)
    taken = {name[:2] for name in (i for i, _ in store.history(TASK))}
    free = next(f"{n:02x}" for n in range(256) if f"{n:02x}" not in taken)
    code, out, err = cli(capsys, "--store", store.root, "show", free + "0000")
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert "no object with that prefix" in err


# --------------------------------------------------------------------------- one bad slot

LONG = castore.Plan.build("long", *(f"s{n}" for n in range(9)))


def make_long(store: castore.Store, task: str = "long") -> list[str]:
    """A finished task of 10 snapshots (seq 0 to 9); their ids, oldest first."""
    with store.open_task(task, LONG) as run:
        for step in run.pending():
            run.commit_step(step, {"step": step})
    return [i for i, _ in reversed(store.history(task))]


def truncate(path: Path) -> None:
    rewrite(path, lambda data: data[: len(data) // 2])


def test_log_shows_every_intact_slot_around_a_truncated_one(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log` of a chain whose slot 7 is truncated prints slots 9 to 0 in order, slot 7 as
    what is wrong with it, then one error line, and exits 3."""
    ids = make_long(store)
    truncate(Path(store.layout.slot_path("long", 7)))
    code, out, err = cli(capsys, "--store", store.root, "log", "long")
    assert 3 == code
    lines = out.splitlines()
    assert 10 == len(lines)
    assert lines[2].startswith("slot 7: body truncated: ")
    assert lines[2].endswith(" (run `castore fsck`)")
    others = [line for index, line in enumerate(lines) if index != 2]
    assert [9, 8, 6, 5, 4, 3, 2, 1, 0] == [int(line.split()[0]) for line in others]
    assert [ids[s][:12] for s in (9, 8, 6, 5, 4, 3, 2, 1, 0)] == [
        line.split()[3] for line in others
    ]
    assert_one_error_line(err)
    assert "castore fsck --task long" in err
    code, out, _ = cli(capsys, "--store", store.root, "log", "long", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert (3, list(range(9, -1, -1))) == (code, [row["seq"] for row in rows])
    assert ("truncated" in rows[2]["problem"], rows[2]["path"]) == (
        True,
        store.layout.slot_path("long", 7),
    )
    assert [ids[s] for s in (9, 8, 6, 5, 4, 3, 2, 1, 0)] == [
        row["id"] for row in rows if "problem" not in row
    ]


def test_show_of_an_intact_slot_works_in_a_damaged_chain(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show TASK@3` prints slot 3's snapshot (exit 0) though slot 7 is truncated, with one
    warning line naming what is broken; `show TASK@7` exits 3 with one error line."""
    ids = make_long(store)
    before = cli(capsys, "--store", store.root, "show", ids[3])
    truncate(Path(store.layout.slot_path("long", 7)))
    code, out, err = cli(capsys, "--store", store.root, "show", "long@3")
    assert (0, before[1]) == (code, out)
    assert 1 == len(err.splitlines()), err
    assert err.startswith("castore: warning: task 'long': chain does not verify: "), err
    code, out, err = cli(capsys, "--store", store.root, "show", "long@7")
    assert (3, "") == (code, out)
    assert_one_error_line(err)
    assert "slot 7" in err
    for beyond in ("long@12", f"long@{10**20}"):
        code, out, err = cli(capsys, "--store", store.root, "show", beyond)
        assert (2, "") == (code, out)
        assert_one_error_line(err)


def test_log_names_a_missing_middle_slot(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deleted slot 4 is a line "slot 4: missing" between the intact slots, exit 3; slot 5,
    whose parent slot is gone, is still shown."""
    make_long(store)
    Path(store.layout.slot_path("long", 4)).unlink()
    code, out, _ = cli(capsys, "--store", store.root, "log", "long")
    lines = out.splitlines()
    assert (3, 10) == (code, len(lines))
    assert "slot 4: missing (run `castore fsck`)" == lines[5]
    assert 5 == int(lines[4].split()[0])
    assert 0 == cli(capsys, "--store", store.root, "show", "long@5")[0]


def test_log_names_a_slot_that_is_not_where_it_claims_to_be(
    store: castore.Store, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """In a broken chain (slot 8 truncated), slot 5 replaced by slot 3's snapshot is named
    as holding the wrong one, and slot 2 replaced by the seq-2 snapshot of another store's
    task of the same id as having a parent that is not slot 1."""
    ids = make_long(store)
    other = castore.Store.init(tmp_path / "other")
    with other.open_task("long", LONG) as run:
        for step in run.pending():
            run.commit_step(step, {"other": step})
    foreign = other.history("long")[-3][0]  # seq 2
    planted = Path(store.objects.path(foreign))
    planted.parent.mkdir(exist_ok=True)
    planted.write_bytes(Path(other.objects.path(foreign)).read_bytes())
    for seq, object_id in ((5, ids[3]), (2, foreign)):
        slot = Path(store.layout.slot_path("long", seq))
        slot.unlink()
        os.link(store.objects.path(object_id), slot)
    truncate(Path(store.layout.slot_path("long", 8)))
    code, out, _ = cli(capsys, "--store", store.root, "log", "long")
    lines = out.splitlines()
    assert 3 == code
    assert "slot 5: holds snapshot 3 of task 'long' (run `castore fsck`)" == lines[4]
    parent = other.history("long")[-2][0]
    assert (
        f"slot 2: its parent is {parent}, slot 1 holds {ids[1]} (run `castore fsck`)" == (lines[7])
    )
    assert [9, 7, 6, 4, 3, 1, 0] == [
        int(line.split()[0]) for line in lines if not line.startswith("slot ")
    ]


def test_log_names_a_long_gap_once(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty slot planted at 99999 is one line, the gap from HEAD to it another, then the
    intact chain: the reader does not walk the gap slot by slot."""
    make_long(store)
    Path(store.layout.slot_path("long", 99999)).write_bytes(b"")
    code, out, _ = cli(capsys, "--store", store.root, "log", "long")
    lines = out.splitlines()
    assert (3, 12) == (code, len(lines))
    assert [
        "slot 99999: file is empty (run `castore fsck`)",
        "slot 10: missing (and so are slots 11 to 99998) (run `castore fsck`)",
    ] == lines[:2]
    assert list(range(9, -1, -1)) == [int(line.split()[0]) for line in lines[2:]]


def test_an_ambiguity_error_prints_a_planted_header_escaped(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file planted under an object's name whose header's kind holds a carriage return is
    named escaped in the ambiguity error, which stays one line."""
    object_id = store.put_blob({"n": 1}).blob
    planted = object_id[:MIN_PREFIX] + "f" * (64 - MIN_PREFIX)
    if planted == object_id:
        planted = object_id[:MIN_PREFIX] + "e" * (64 - MIN_PREFIX)
    Path(store.layout.object_path(planted)).write_bytes(b"castore 1 bl\rob 2\n{}")
    code, out, err = cli(capsys, "--store", store.root, "show", object_id[:MIN_PREFIX])
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert f"{planted[:16]} ('bl\\rob')" in err
