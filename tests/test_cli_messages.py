"""CLI error lines say what a person at a shell can do: the store inside a project directory,
no library calls for a missing task, what gc took, a negative duration, an unclosed glob."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cli

import castore
from castore.cli.suggest import distance, nearest

PLAN = castore.Plan.build("p", "a", "b", "c")


def _one_line(err: str) -> str:
    assert 1 == len(err.splitlines()), err
    return err


@pytest.mark.parametrize(
    "argv",
    [["--store", "{project}", "status"], ["fsck", "{project}"], ["gc", "{project}"]],
    ids=["status", "fsck", "gc"],
)
def test_a_project_directory_holding_a_store_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A verb pointed at a directory whose ./.castore is a store says to give that path."""
    project = tmp_path / "project"
    castore.Store.init(project / ".castore")
    code, out, err = cli(capsys, *(word.format(project=project) for word in argv))
    assert (2, "") == (code, out)
    assert f"but {project}/.castore is one: give that path (--store {project}/.castore)" in (
        _one_line(err)
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "nosuch"],
        ["log", "nosuch"],
        ["brief", "nosuch"],
        ["resolve", "nosuch", "charge", "--confirmed", "r"],
    ],
    ids=["status", "log", "brief", "resolve"],
)
def test_no_task_names_the_cli_way_to_list_tasks(
    store: castore.Store, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """ "No task" tells a CLI user about `castore status` and --store, not `store.start(...)`."""
    code, out, err = cli(capsys, "--store", str(store.root), *argv)
    assert (2, "") == (code, out)
    assert f"no task 'nosuch' in {store.root}; `castore status` lists the tasks there" in (
        _one_line(err)
    )
    assert "store.start" not in err


def test_no_task_of_a_langgraph_shape_points_at_thread(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id spelled as a LangGraph task, not found, points at --thread."""
    code, _, err = cli(capsys, "--store", str(store.root), "log", "lg-trip-42_n_g0")
    assert 2 == code
    assert "(a LangGraph thread's tasks: --thread NAME)" in _one_line(err)


def test_show_of_a_snapshot_gc_reclaimed_says_so(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """After forget and gc, TASK@SEQ below the tombstone says gc reclaimed it; the tombstone
    itself shows without a warning that the chain is broken; beyond it, the HEAD is named."""
    with store.open_task("t", PLAN) as run:
        run.commit_step("a", 1)
        run.commit_step("b", 2)
    store.forget("t", who="ana@ops", why="done with it")
    root = str(store.root)
    assert 0 == cli(capsys, "gc", root, "--grace", "0")[0]
    code, out, err = cli(capsys, "--store", root, "show", "t@1")
    assert (2, "") == (code, out)
    assert "`castore gc` reclaimed its history below the tombstone (seq 3): snapshot 1" in (
        _one_line(err)
    )
    code, out, err = cli(capsys, "--store", root, "show", "t@3")
    assert (0, "") == (code, err)
    assert out.startswith("snapshot ")
    code, _, err = cli(capsys, "--store", root, "show", "t@9")
    assert 2 == code
    assert "task 't' has no snapshot 9 (its HEAD is snapshot 3)" in _one_line(err)


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "{root}", "--grace", "-1d"],
        ["gc", "{root}", "--grace=-1d"],
        ["watch", "{root}", "--stuck-after", "-5m"],
        ["fsck", "{root}", "--stuck-after", "-1h"],
    ],
    ids=["gc", "gc-equals", "watch", "fsck"],
)
def test_a_negative_duration_is_called_negative(
    store: castore.Store, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A negative duration is refused as negative, not as a missing argument."""
    code, out, err = cli(capsys, *(word.format(root=store.root) for word in argv))
    assert (2, "") == (code, out)
    assert "a duration cannot be negative" in _one_line(err)
    assert "expected one argument" not in err


def test_an_option_still_needs_its_value(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An option followed by another option (its value forgotten) is still that error."""
    code, _, err = cli(capsys, "gc", str(store.root), "--grace", "--dry-run")
    assert 2 == code
    assert "argument --grace: expected one argument" in _one_line(err)


@pytest.mark.parametrize("pattern", ["ord[", "ord[!", "o[]"])
def test_an_unclosed_glob_set_is_a_usage_error(
    store: castore.Store, capsys: pytest.CaptureFixture[str], pattern: str
) -> None:
    """`status 'ord['` says the '[' is never closed instead of silently listing nothing."""
    with store.open_task("ord[", PLAN) as run:  # fnmatch would match this one literally
        run.commit_step("a", 1)
    code, out, err = cli(capsys, "--store", str(store.root), "status", pattern, "--json")
    assert (2, "") == (code, out)
    assert "opens a set of characters that no ']' closes" in _one_line(err)


def test_closed_glob_sets_still_match(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """'[[]' matches a '[' itself and 'o-[12]' a set, as fnmatch does."""
    for task in ("ord[", "o-1", "o-3"):
        with store.open_task(task, PLAN) as run:
            run.commit_step("a", 1)
    for pattern, listed in [("ord[[]", "ord["), ("o-[12]", "o-1")]:
        code, out, _ = cli(capsys, "--store", str(store.root), "status", pattern)
        assert (0, listed) == (code, out.split()[0])
        assert "1 task:" in out


@pytest.mark.parametrize("verb", ["log", "status", "brief"])
def test_a_typoed_task_id_is_told_the_nearest_ids(
    store: castore.Store, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    """A task id one typo from a stored one ('tally-l' for 'tally-1') is answered with the
    nearest ids, as git does for a mistyped command; an id near nothing gets no guess."""
    for task in ("tally-1", "tally-20", "report-2026"):
        store.start(task, PLAN).close()
    code, out, err = cli(capsys, "--store", str(store.root), verb, "tally-l")
    assert (2, "") == (code, out)
    assert f"no task 'tally-l' in {store.root}; did you mean 'tally-1'?" in _one_line(err)
    code, _, err = cli(capsys, "--store", str(store.root), verb, "zzzzzz")
    assert (2, "did you mean" in err) == (code, False)


def test_a_swap_of_two_characters_is_one_edit() -> None:
    """Two neighbouring characters swapped ('tlaly-1') count as one typo, as in git."""
    assert (1, 2, ["tally-1"]) == (
        distance("tlaly-1", "tally-1"),
        distance("tlaly-1", "tally-2"),
        nearest("tlaly-1", ["tally-1", "tally-2"]),
    )
