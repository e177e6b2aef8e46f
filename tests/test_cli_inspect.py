"""`castore show` by an abbreviated id, and `log`/`show` of a chain with a damaged slot.

CLI tests: call castore.cli.main(argv) in-process, assert exit codes, lines and --json.
"""

from __future__ import annotations

import itertools
import json

import pytest
from helpers import cli
from test_cli import TASK, assert_one_error_line, make_unresolved

import castore
from castore import codec
from castore.cli.lookup import MIN_PREFIX
from castore.digest import hash_bytes


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
