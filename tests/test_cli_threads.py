"""`castore status --thread NAME [--ns NS]` and `castore log --thread ...`: a LangGraph
thread's tasks found by the encoded start of their ids, whatever their generation suffix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import cli

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint

import castore
from castore.cli.threads import thread_tasks
from castore.langgraph import CastoreSaver
from castore.langgraph.names import generation, task_base

SAVER_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "langgraph.md"


def _put(saver: CastoreSaver, thread: str) -> None:
    """One checkpoint of `thread` in the root namespace, as a graph's first step puts it."""
    checkpoint = empty_checkpoint()
    versions = {"messages": saver.get_next_version(None, None)}
    checkpoint["channel_values"] = {"messages": ["hello"]}
    checkpoint["channel_versions"] = versions
    target: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saver.put(target, checkpoint, {"source": "loop", "step": 0, "parents": {}}, versions)


def _task(store: castore.Store, task: str) -> None:
    with store.start(task, castore.Plan.grow("thread")) as run:
        run.append("event-0", {"n": 0})


def test_status_and_log_find_a_saver_thread_by_its_name(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """The thread a CastoreSaver wrote is found by its thread_id; a thread whose name the
    first one's starts with ('trip-4' for 'trip-42') is not taken for it."""
    with CastoreSaver(store) as saver:
        _put(saver, "trip-42")
        _put(saver, "trip-4")
    made = [task for task in store.tasks() if task.startswith("lg-ttrip-42_")]
    assert ["lg-ttrip-42_nt_g0"] == made
    assert "task\n`lg-ttrip-42_nt_g0`" in SAVER_PAGE.read_text()  # the id the docs give
    root = str(store.root)
    code, out, _ = cli(capsys, "--store", root, "status", "--thread", "trip-42", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert (0, made) == (code, [line["task"] for line in lines if "seq" in line])
    code, out, _ = cli(capsys, "--store", root, "log", "--thread", "trip-42", "--json")
    assert (0, {"lg-ttrip-42_nt_g0"}) == (
        code,
        {json.loads(line)["task"] for line in out.splitlines()},
    )
    by_id = cli(capsys, "--store", root, "log", "lg-ttrip-42_nt_g0")
    assert by_id == cli(capsys, "--store", root, "log", "--thread", "trip-42", "--ns", "")
    assert (0, "") == (by_id[0], by_id[2])


def test_a_namespace_is_told_from_one_its_name_starts(store: castore.Store) -> None:
    """--ns '' is the root graph's namespace only, not every namespace its encoding prefixes
    ('a', '_g', ...), and any generation suffix is accepted after the base."""
    root_ns = [generation(task_base("t-1", ""), 0), generation(task_base("t-1", ""), 3) + "_s2"]
    others = [generation(task_base("t-1", ns), 0) for ns in ("a", "_g", "a:b")]
    unrelated = [generation(task_base("t-10", ""), 0), "lg-other", "plain-task"]
    for task in [*root_ns, *others, *unrelated]:
        _task(store, task)
    tasks = store.tasks()
    assert sorted(root_ns) == thread_tasks(tasks, "t-1", "")
    assert [generation(task_base("t-1", "a"), 0)] == thread_tasks(tasks, "t-1", "a")
    assert [generation(task_base("t-1", "_g"), 0)] == thread_tasks(tasks, "t-1", "_g")
    assert sorted([*root_ns, *others]) == thread_tasks(tasks, "t-1")


def test_log_of_several_tasks_heads_each_and_errors_are_one_line(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A thread of two namespaces logs both, each under its task's heading; no match, a TASK
    and --thread together, and --ns alone are usage errors (exit 2) of one line."""
    first, second = (generation(task_base("t-1", ns), 0) for ns in ("", "sub"))
    _task(store, first)
    _task(store, second)
    root = str(store.root)
    code, out, _ = cli(capsys, "--store", root, "log", "--thread", "t-1")
    headings = [line for line in out.splitlines() if line.startswith("task ")]
    assert (0, [f"task {first}:", f"task {second}:"]) == (code, headings)
    for argv, message in [
        (["status", "--thread", "t-2"], "no task of LangGraph thread 't-2' in this store"),
        (["log", "--thread", "t-1", "--ns", "x"], "no task of LangGraph thread 't-1', namespace"),
        (["log", first, "--thread", "t-1"], "give a TASK or --thread NAME, not both"),
        (["status", "--ns", ""], "--ns NS selects a namespace of a thread"),
        (["log"], "give a TASK (`castore status` lists them) or --thread NAME"),
    ]:
        code, out, err = cli(capsys, "--store", root, *argv)
        assert (2, "", 1) == (code, out, len(err.splitlines())), argv
        assert message in err, argv
