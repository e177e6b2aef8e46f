"""The `castore` command line: verbs, store lookup precedence, JSON output and exit codes.

Called in-process through castore.cli.main(argv) (argparse's own SystemExit is caught and
counted as the exit status), and once through the installed console script.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Entry, cli, flip_bit, rewrite, wait_for

import castore
from castore.cli.demo import castore_command

PLAN = castore.Plan.build("cli", "price", castore.effect("charge", "price"), "email")
NEITHER = castore.Service("payments")  # neither deduplicates nor can be asked: UNRESOLVED
TASK = "order/1"


def assert_one_error_line(err: str) -> None:
    """Exactly one line on stderr, starting with 'castore: error:'."""
    assert 1 == len(err.splitlines()), err
    assert err.startswith("castore: error: "), err


def status_rows(out: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """`status --json` output: its task rows, and the summary object on its last line."""
    lines = [json.loads(line) for line in out.splitlines()]
    assert ({"summary", "type"}, "summary") == (set(lines[-1]), lines[-1]["type"]), lines[-1]
    assert ["task"] * (len(lines) - 1) == [line["type"] for line in lines[:-1]]
    return lines[:-1], lines[-1]["summary"]


def status_tasks(out: str) -> list[str]:
    """The task ids of `status --json` output, in order."""
    return [row["task"] for row in status_rows(out)[0]]


def make_unresolved(store: castore.Store, task: str = TASK) -> str:
    """A task whose charge is UNRESOLVED (sent, answer lost, service can't be asked); its key."""
    with store.open_task(task, PLAN) as run:
        run.commit_step("price", 4200)
        with pytest.raises(ConnectionError), run.effect("charge", NEITHER):
            raise ConnectionError("connection dropped after the request was sent")
    with store.open_task(task, PLAN) as run:
        action = run.settle(NEITHER)
    assert castore.Action.ESCALATE == action.action
    key = action.key
    assert key is not None
    return key


def make_finished(store: castore.Store, task: str) -> None:
    plan = castore.Plan.build("plain", "a", "b")
    with store.open_task(task, plan) as run:
        for step in run.pending():
            run.commit_step(step, {"step": step})


# --------------------------------------------------------------------------- init and --version


def test_console_script_prints_its_version() -> None:
    """The installed `castore --version` prints 'castore <version>' and exits 0."""
    script = Path(sys.executable).parent / "castore"
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (0, f"castore {castore.__version__}\n", "") == (
        result.returncode,
        result.stdout,
        result.stderr,
    )


@pytest.mark.parametrize("lines", [3, 400])
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path, lines: int) -> None:
    """`castore status | head`: when stdout's reader has gone, whether the output fits the
    buffer (flushed at the end) or not (flushed while printing), castore stops with 141 (128 +
    SIGPIPE) and no traceback."""
    store = castore.Store.init(tmp_path / "store")
    plan = castore.Plan.build("p", "a")
    for number in range(lines):
        store.start(f"t{number}", plan).close()
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read
    script = Path(sys.executable).parent / "castore"
    try:
        result = subprocess.run(
            [str(script), "--store", store.root, "status"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (141, "") == (result.returncode, result.stderr)


def test_a_reader_that_goes_away_midway_through_unbuffered_output_ends_it(tmp_path: Path) -> None:
    """`castore status --json | head -1` with stdout unbuffered (PYTHONUNBUFFERED): output
    past the pipe's buffer, a reader that takes one line and goes while castore is blocked
    writing. A short write of unbuffered stdout is not reported, so status writes its lines a
    few KiB at a time: the next write fails, and castore stops with 141, as when buffered."""
    store = castore.Store.init(tmp_path / "store")
    plan = castore.Plan.build("p", "a")
    for number in range(400):  # about 140 KB of JSON lines: more than a pipe holds
        store.start(f"t{number}", plan).close()
    script = Path(sys.executable).parent / "castore"
    with subprocess.Popen(
        [str(script), "--store", store.root, "status", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        wait_for(lambda: select.select([process.stdout], [], [], 0.05)[0], what="output")
        time.sleep(0.5)  # castore fills the pipe and blocks in its write
        assert process.stdout.readline().startswith(b'{"')
        process.stdout.close()
        assert (141, b"") == (process.wait(timeout=120), process.stderr.read())


@pytest.mark.parametrize("verb", [("status",), ("status", "--json"), ("status", "caf*")])
def test_output_its_encoding_cannot_hold_is_one_line_exit_2(
    tmp_path: Path, verb: tuple[str, ...]
) -> None:
    """A task id the output's encoding cannot write (PYTHONIOENCODING=ascii): exit 2 and one
    line that says which character and how to run instead, never a traceback; with UTF-8 the
    same command prints it."""
    store = castore.Store.init(tmp_path / "store")
    with store.start("café/1", castore.Plan.build("p", "a")) as run:
        run.commit_step("a", 1)
    command = [sys.executable, "-m", "castore", "--store", store.root, *verb]
    ascii_run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert 2 == ascii_run.returncode, ascii_run.stderr
    assert_one_error_line(ascii_run.stderr)
    assert "'\\xe9' cannot be written in the ascii encoding" in ascii_run.stderr
    assert "PYTHONIOENCODING=utf-8" in ascii_run.stderr
    utf8_run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    assert (0, "") == (utf8_run.returncode, utf8_run.stderr)
    assert "café/1" in utf8_run.stdout


def test_init_creates_a_store_and_refuses_an_existing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`init PATH` creates an empty store; again exits 2 with a one-line error."""
    path = tmp_path / "s"
    code, out, err = cli(capsys, "init", str(path))
    assert (0, "") == (code, err)
    assert "initialised empty castore store" in out
    assert [] == castore.Store.open(path).tasks()
    code, out, err = cli(capsys, "init", str(path))
    assert (2, "") == (code, out)
    assert_one_error_line(err)


def test_store_precedence_flag_then_env_then_dot_castore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store is found by PATH, else --store, else $CASTORE_STORE, else ./.castore."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CASTORE_STORE", str(tmp_path / "env"))
    assert 0 == cli(capsys, "--store", str(tmp_path / "flag"), "init", str(tmp_path / "pos"))[0]
    assert (True, False, False) == tuple(
        (tmp_path / name).exists() for name in ("pos", "flag", "env")
    )
    assert 0 == cli(capsys, "--store", str(tmp_path / "flag"), "init")[0]
    assert (True, False) == ((tmp_path / "flag").exists(), (tmp_path / "env").exists())
    assert 0 == cli(capsys, "init")[0]
    assert (True, False) == ((tmp_path / "env").exists(), (tmp_path / ".castore").exists())
    monkeypatch.delenv("CASTORE_STORE")
    assert 0 == cli(capsys, "init")[0]
    assert True is (tmp_path / ".castore").exists()
    # status reads the store the same way: each store holds a different task.
    make_finished(castore.Store.open(tmp_path / "flag"), "in-flag")
    make_finished(castore.Store.open(tmp_path / "env"), "in-env")
    make_finished(castore.Store.open(tmp_path / ".castore"), "in-dot")
    monkeypatch.setenv("CASTORE_STORE", str(tmp_path / "env"))
    assert ["in-env"] == status_tasks(cli(capsys, "status", "--json")[1])
    out = cli(capsys, "--store", str(tmp_path / "flag"), "status", "--json")[1]
    assert ["in-flag"] == status_tasks(out)
    monkeypatch.delenv("CASTORE_STORE")
    assert ["in-dot"] == status_tasks(cli(capsys, "status", "--json")[1])


@pytest.mark.parametrize(
    "verb", [["status"], ["log", "t"], ["show", "t@0"], ["fsck"], ["gc", "--dry-run"]]
)
def test_store_option_works_after_the_verb_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    """`castore VERB --store X` reads store X, as `castore --store X VERB` does; given in both
    places, the one after the verb wins."""
    store = castore.Store.init(tmp_path / "s")
    make_finished(store, "t")

    def run(*argv: str) -> tuple[int, str, str]:
        code, out, err = cli(capsys, *argv)
        return code, re.sub(r" in [0-9.]+s:", " in Ns:", out), err  # fsck's timing

    before = run("--store", store.root, *verb)
    assert (0, "") == (before[0], before[2]), before
    assert before == run(*verb, "--store", store.root)
    assert before == run("--store", str(tmp_path / "nowhere"), *verb, "--store", store.root)


@pytest.mark.parametrize(
    ("argv", "help_of"),
    [
        (["status", "--bogus"], "castore status"),
        (["--store", "x", "log", "t", "--nope"], "castore log"),
        (["log"], "castore log"),
        (["--bogus"], "castore"),
    ],
)
def test_an_argument_error_names_the_verbs_help_once(
    capsys: pytest.CaptureFixture[str], argv: list[str], help_of: str
) -> None:
    """A bad argument exits 2 with one error line that says `castore: ` once and points at
    the help of the verb it came with."""
    code, out, err = cli(capsys, *argv)
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert 1 == err.count("castore:"), err
    assert err.rstrip().endswith(f"(see `{help_of} --help`)"), err


def test_missing_store_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A verb pointed at a directory that is not a store exits 2 with one error line."""
    code, out, err = cli(capsys, "--store", str(tmp_path / "nowhere"), "status")
    assert (2, "") == (code, out)
    assert_one_error_line(err)


def test_argument_errors_exit_2_with_one_error_line(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resolve with neither --confirmed nor --not-done exits 2 with one 'castore: error:' line."""
    code, out, err = cli(capsys, "--store", str(store.root), "resolve", TASK, "charge")
    assert (2, "") == (code, out)
    assert_one_error_line(err)


# --------------------------------------------------------------------------- status


def test_status_on_an_empty_store(store: castore.Store, capsys: pytest.CaptureFixture[str]) -> None:
    """`status` of an empty store says there are no tasks and exits 0; --json prints only a
    summary of zero tasks."""
    assert (0, f"no tasks in {store.root}\n", "") == cli(
        capsys, "--store", str(store.root), "status"
    )
    code, out, err = cli(capsys, "--store", str(store.root), "status", "--json")
    assert (0, "") == (code, err)
    assert ([], {"tasks": 0, "open": 0, "unresolved": 0, "broken": 0}) == status_rows(out)


def test_status_json_is_one_object_per_task_line(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --json`: one JSON object a line with task, seq, step, next_action, effects,
    then a summary object counting them."""
    make_finished(store, "a-done")
    key = make_unresolved(store, "b-stuck")
    code, out, err = cli(capsys, "--store", str(store.root), "status", "--json")
    assert (6, "") == (code, err)
    rows, counts = status_rows(out)
    assert {"tasks": 2, "open": 1, "unresolved": 1, "broken": 0} == counts
    assert ["a-done", "b-stuck"] == [row["task"] for row in rows]
    for row in rows:
        assert set() == {"task", "seq", "step", "next_action", "effects"} - set(row)
    done, stuck = rows
    assert (2, None, "done", []) == (
        done["seq"],
        done["step"],
        done["next_action"],
        done["effects"],
    )
    assert (3, "charge", "escalate") == (stuck["seq"], stuck["step"], stuck["next_action"])
    assert [("charge", "UNRESOLVED", key, "escalate")] == [
        (e["step"], e["state"], e["key"], e["next_action"]) for e in stuck["effects"]
    ]
    code, out, _ = cli(capsys, "--store", str(store.root), "status", "a-done", "--json")
    assert (0, ["a-done"]) == (code, status_tasks(out))


def test_status_exits_6_while_an_effect_is_unresolved(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` names the UNRESOLVED effect and its key and exits 6."""
    key = make_unresolved(store)
    code, out, err = cli(capsys, "--store", str(store.root), "status")
    assert (6, "") == (code, err)
    assert "effect charge: UNRESOLVED" in out
    assert key in out
    assert 6 == cli(capsys, "--store", str(store.root), "status", TASK)[0]


def make_open(store: castore.Store, task: str) -> None:
    """A task whose charge is SUBMITTED with no answer yet: open, but not UNRESOLVED."""
    with store.open_task(task, PLAN) as run:
        run.commit_step("price", 1)
        with pytest.raises(ConnectionError), run.effect("charge", castore.Service("pay")):
            raise ConnectionError("no answer")


@pytest.mark.parametrize(
    ("argv", "shown", "code"),
    [
        ([], ["order-1", "order-2", "order-3", "other"], 6),
        (["order-*"], ["order-1", "order-2", "order-3"], 6),
        (["order-[12]"], ["order-1", "order-2"], 0),
        (["--open"], ["order-2", "order-3"], 6),
        (["--unresolved"], ["order-3"], 6),
        (["order-?", "--open"], ["order-2", "order-3"], 6),
        (["oth*", "--unresolved"], [], 0),
        (["order-1"], ["order-1"], 0),
    ],
)
def test_status_filters_by_glob_open_and_unresolved(
    store: castore.Store,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    shown: list[str],
    code: int,
) -> None:
    """`status [GLOB] [--open] [--unresolved]` lists only the matching tasks (fnmatch on the
    id), ends with a count line (a summary object in --json) and exits by what it shows."""
    make_finished(store, "order-1")
    make_open(store, "order-2")
    make_unresolved(store, "order-3")
    make_finished(store, "other")
    result = cli(capsys, "--store", store.root, "status", *argv, "--json")
    rows, counts = status_rows(result[1])
    assert (code, shown, "") == (result[0], [row["task"] for row in rows], result[2])
    unresolved = sum(1 for t in shown if t == "order-3")
    opened = sum(1 for t in shown if t in ("order-2", "order-3"))
    expected = {"tasks": len(shown), "open": opened, "unresolved": unresolved, "broken": 0}
    assert expected == counts
    code_text, out, _ = cli(capsys, "--store", store.root, "status", *argv)
    lines = out.splitlines()
    assert code == code_text
    assert shown == [line.split()[0] for line in lines[:-1] if not line.startswith(" ")]
    if shown:
        tasks = f"{len(shown)} task{'' if len(shown) == 1 else 's'}"
        assert (
            f"{tasks}: {opened} with open effects, {unresolved} unresolved, 0 broken" == (lines[-1])
        )
    else:
        assert [f"no matching tasks in {store.root}"] == lines


@pytest.mark.parametrize(
    ("slot", "flags"), [(2, ()), (1, ("--verify",))], ids=["head", "below-head-verify"]
)
def test_status_shows_a_broken_task_whatever_the_filter(
    store: castore.Store, capsys: pytest.CaptureFixture[str], slot: int, flags: tuple[str, ...]
) -> None:
    """A task whose HEAD does not verify (or, with --verify, any snapshot of its chain) is
    listed by --open and --unresolved (its effects cannot be known), counted as broken, and
    status exits 3."""
    make_finished(store, "fine")
    make_finished(store, "hurt")  # seq 0 start, 1 step a, 2 step b (HEAD)
    rewrite(Path(store.layout.slot_path("hurt", slot)), flip_bit)
    code, out, err = cli(capsys, "--store", store.root, "status", "--open", "--json", *flags)
    rows, counts = status_rows(out)
    assert (3, ["hurt"], "") == (code, [row["task"] for row in rows], err)
    assert {"tasks": 1, "open": 0, "unresolved": 0, "broken": 1} == counts


@pytest.mark.parametrize("task", ["", "a\nb"])
def test_status_of_an_invalid_task_id_is_a_usage_error(
    store: castore.Store, capsys: pytest.CaptureFixture[str], task: str
) -> None:
    """`status ''` (and any other invalid id) exits 2 with one error line, as `log ''` does,
    rather than listing every task."""
    make_finished(store, "t")
    code, out, err = cli(capsys, "--store", store.root, "status", task)
    assert (2, "") == (code, out)
    assert_one_error_line(err)


# --------------------------------------------------------------------------- resolve


def test_resolve_confirmed_advances_the_task(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`resolve TASK EFFECT --confirmed RCPT` exits 0; status then shows the task moved on."""
    make_unresolved(store)
    code, out, err = cli(
        capsys, "--store", str(store.root), "resolve", TASK, "charge", "--confirmed", "rcpt-1",
        "--who", "alice", "--reason", "the payment console shows it",
    )  # fmt: skip
    assert (0, "") == (code, err)
    assert "CONFIRMED (receipt rcpt-1)" in out
    code, out, _ = cli(capsys, "--store", str(store.root), "status", "--json")
    assert 0 == code
    (row,) = status_rows(out)[0]
    assert ("email", "run", []) == (row["step"], row["next_action"], row["effects"])
    head = store.history(TASK)[0][1]
    assert ("rcpt-1", "alice", "the payment console shows it") == (
        head.transition.receipt,
        head.transition.who,
        head.transition.why,
    )
    with store.open_task(TASK, PLAN) as run:
        assert "rcpt-1" == run.receipt("charge")
        assert "email" == run.next_step


def test_resolve_not_done_needs_a_reason(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`resolve --not-done` without --reason exits 2, one error line, and changes nothing."""
    make_unresolved(store)
    before = store.history(TASK)
    code, out, err = cli(
        capsys, "--store", str(store.root), "resolve", TASK, "charge", "--not-done"
    )
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert before == store.history(TASK)
    assert 6 == cli(capsys, "--store", str(store.root), "status")[0]


def test_resolve_not_done_with_a_reason_reopens_the_effect(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`resolve --not-done --reason` exits 0 and the effect's next action is submit."""
    make_unresolved(store)
    code, _, err = cli(
        capsys, "--store", str(store.root), "resolve", TASK, "charge", "--not-done",
        "--reason", "not in the payment console",
    )  # fmt: skip
    assert (0, "") == (code, err)
    code, out, _ = cli(capsys, "--store", str(store.root), "status", "--json")
    assert 0 == code
    assert [("charge", "NOT_DONE", "submit")] == [
        (e["step"], e["state"], e["next_action"]) for e in status_rows(out)[0][0]["effects"]
    ]


def test_resolve_of_an_unknown_task_exits_2_and_leaves_the_store_unchanged(
    store: castore.Store,
    capsys: pytest.CaptureFixture[str],
    tree_snapshot: Callable[[str | os.PathLike[str]], dict[str, Entry]],
) -> None:
    """`resolve` of a task the store lacks exits 2, writes nothing, and `status` still works."""
    make_finished(store, "real")
    before = tree_snapshot(store.root)
    code, out, err = cli(
        capsys, "--store", str(store.root), "resolve", "nope", "charge", "--confirmed", "r"
    )
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert before == tree_snapshot(store.root)
    assert ["real"] == store.tasks()
    code, out, err = cli(capsys, "--store", str(store.root), "status", "--json")
    assert (0, "") == (code, err)
    assert ["real"] == status_tasks(out)


# --------------------------------------------------------------------------- log and show


def test_log_lists_the_chain_newest_first(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log TASK` prints one line per snapshot, newest first, with seq and transition."""
    make_unresolved(store)
    history = store.history(TASK)
    code, out, err = cli(capsys, "--store", str(store.root), "log", TASK)
    assert (0, "") == (code, err)
    lines = out.splitlines()
    assert [s.seq for _, s in history] == [int(line.split()[0]) for line in lines]
    assert [3, 2, 1, 0] == [int(line.split()[0]) for line in lines]
    assert [i[:12] for i, _ in history] == [line.split()[3] for line in lines]
    assert "effect charge SUBMITTED->UNRESOLVED" in lines[0]
    assert "start" in lines[-1]


@pytest.mark.parametrize("count", [1, 3, 4, 10])
def test_log_n_prints_the_newest_n_snapshots(
    store: castore.Store, capsys: pytest.CaptureFixture[str], count: int
) -> None:
    """`log -n N TASK` prints only the newest N snapshots (all of them if there are fewer)."""
    make_unresolved(store)
    code, out, err = cli(capsys, "--store", store.root, "log", "-n", str(count), TASK)
    assert (0, "") == (code, err)
    assert [3, 2, 1, 0][:count] == [int(line.split()[0]) for line in out.splitlines()]
    code, out, _ = cli(capsys, "--store", store.root, "log", TASK, "-n", str(count), "--json")
    assert [3, 2, 1, 0][:count] == [json.loads(line)["seq"] for line in out.splitlines()]


@pytest.mark.parametrize("count", ["0", "-1", "x"])
def test_log_n_needs_a_positive_count(
    store: castore.Store, capsys: pytest.CaptureFixture[str], count: str
) -> None:
    """`log -n 0` (or a negative or non-number) is a usage error."""
    make_unresolved(store)
    code, out, err = cli(capsys, "--store", store.root, "log", TASK, "-n", count)
    assert (2, "") == (code, out)
    assert_one_error_line(err)


def test_log_json_is_one_snapshot_per_line(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log TASK --json` prints one JSON object per snapshot with its id and seq."""
    make_unresolved(store)
    history = store.history(TASK)
    code, out, err = cli(capsys, "--store", str(store.root), "log", TASK, "--json")
    assert (0, "") == (code, err)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(i, s.seq) for i, s in history] == [(row["id"], row["seq"]) for row in rows]
    assert "UNRESOLVED" == rows[0]["transition"]["effect_to"]


def test_log_of_an_unknown_task_is_a_usage_error(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log` of a task the store does not have exits 2 with one error line."""
    code, out, err = cli(capsys, "--store", str(store.root), "log", "no-such-task")
    assert (2, "") == (code, out)
    assert_one_error_line(err)


def test_show_by_id_and_by_task_at_seq(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show ID` and `show TASK@SEQ` print the same decoded snapshot."""
    make_unresolved(store)
    snapshot_id = next(i for i, s in store.history(TASK) if s.seq == 2)
    code, by_id, err = cli(capsys, "--store", str(store.root), "show", snapshot_id)
    assert (0, "") == (code, err)
    first, _, body = by_id.partition("\n")
    assert first.startswith(f"snapshot {snapshot_id} (")
    value = json.loads(body)
    assert (2, TASK) == (value["seq"], value["task"])
    assert (0, by_id, "") == cli(capsys, "--store", str(store.root), "show", f"{TASK}@2")


def test_show_json(store: castore.Store, capsys: pytest.CaptureFixture[str]) -> None:
    """`show --json` prints one object with id, kind, size and the decoded value."""
    make_unresolved(store)
    snapshot_id = store.history(TASK)[0][0]
    code, out, err = cli(capsys, "--store", str(store.root), "show", f"{TASK}@3", "--json")
    assert (0, "") == (code, err)
    row = json.loads(out)
    assert (snapshot_id, "snapshot", 3) == (row["id"], row["kind"], row["value"]["seq"])
    assert Path(store.objects.path(snapshot_id)).stat().st_size == row["size"]
    plan_id = store.put_plan(PLAN)
    row = json.loads(cli(capsys, "--store", str(store.root), "show", plan_id, "--json")[1])
    assert (plan_id, "plan") == (row["id"], row["kind"])


@pytest.mark.parametrize(
    "ref", ["not-an-id", "ABCDEF", f"{TASK}@x", f"{TASK}@99", f"{TASK}@³", f"{TASK}@{10**20}"]
)
def test_show_of_a_bad_reference_is_a_usage_error(
    store: castore.Store, capsys: pytest.CaptureFixture[str], ref: str
) -> None:
    """`show` of a malformed id, a bad @SEQ or a missing SEQ exits 2 with one error line."""
    make_unresolved(store)
    code, out, err = cli(capsys, "--store", str(store.root), "show", ref)
    assert (2, "") == (code, out)
    assert_one_error_line(err)


# --------------------------------------------------------------------------- corruption


def test_log_of_a_corrupted_chain_exits_3(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flipped bit in a snapshot makes `log` exit 3 with one error line, the damaged slot
    named in its place among the intact ones; `show` of the damaged object exits 3."""
    make_unresolved(store)
    snapshot_id = store.history(TASK)[2][0]  # seq 1
    rewrite(Path(store.layout.slot_path(TASK, 1)), flip_bit)
    code, out, err = cli(capsys, "--store", str(store.root), "log", TASK)
    assert 3 == code
    assert (
        "slot 1: damaged: its bytes match no stored object (run `castore fsck`)"
        == (out.splitlines()[2])
    )
    assert_one_error_line(err)
    code, out, err = cli(capsys, "--store", str(store.root), "show", snapshot_id)
    assert (3, "") == (code, out)
    assert_one_error_line(err)


def test_show_of_an_absent_object_exits_2(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show` of a well-formed id the store does not hold exits 2 (a wrong id, not damage)
    with one error line."""
    code, out, err = cli(capsys, "--store", str(store.root), "show", "0" * 64)
    assert (2, "") == (code, out)
    assert_one_error_line(err)


# --------------------------------------------------------------------------- demo


def test_demo_exits_0_and_shows_one_charge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo PATH` kills and resumes a worker, exits 0 and shows the charge applied once."""
    code, out, err = cli(capsys, "demo", str(tmp_path / "demo"))
    assert (0, "") == (code, err), out
    lines = [line.strip() for line in out.splitlines()]
    assert "service ledger: charge applied 1 time" in lines
    assert "OK: the charge was made once, nothing was lost." in lines
    hint = f"Look around: {castore_command()} --store {tmp_path / 'demo'} log demo-order-1"
    assert hint == lines[-1]
    store = castore.Store.open(tmp_path / "demo")
    assert ["demo-order-1"] == store.tasks()
    assert True is store.status("demo-order-1").finished


def _run_as_typed(command: str, cwd: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        ["/bin/sh", "-c", f"{command} --version"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("where", ["elsewhere", "above-the-venv", "on-path", "no-script"])
def test_demo_hint_is_a_command_that_works_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The demo's closing hint names castore so that the shell finds it from where the user
    is: `castore` only when PATH leads to this installation's script, else that script's path
    (relative below the working directory), else `python -m castore`; each runs as typed."""
    scripts = Path(sysconfig.get_path("scripts"))
    path = "/usr/bin:/bin"
    cwd = tmp_path
    if where == "above-the-venv":
        cwd = scripts.parent.parent
    elif where == "on-path":
        path = f"{scripts}:{path}"
    elif where == "no-script":
        monkeypatch.setattr(sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PATH", path)
    command = castore_command()
    expected = {
        "elsewhere": shlex.quote(str(scripts / "castore")),
        "above-the-venv": shlex.quote(os.path.join(scripts.parent.name, scripts.name, "castore")),
        "on-path": "castore",
        "no-script": f"{shlex.quote(sys.executable)} -m castore",
    }[where]
    assert expected == command
    done = _run_as_typed(command, cwd, path)
    assert (0, f"castore {castore.__version__}\n") == (done.returncode, done.stdout), done.stderr


def test_status_prints_a_key_with_a_line_separator_on_one_line(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An idempotency key holding U+2028 is printed escaped: the effect stays one line and
    the summary is still the last line."""
    with store.open_task(TASK, PLAN) as run:
        run.commit_step("price", 1)
        effect = run.effect("charge", castore.Service("pay"), key="k-1\u2028error: forged")
        with pytest.raises(ConnectionError), effect:
            raise ConnectionError("no answer")
    code, out, _ = cli(capsys, "--store", store.root, "status")
    lines = out.splitlines()  # splits at U+2028 too
    assert (0, 3) == (code, len(lines))
    assert repr("k-1\u2028error: forged") in lines[1]
    assert "1 task: 1 with open effects, 0 unresolved, 0 broken" == lines[2]
