"""`castore status --thread NAME [--ns NS]` and `castore log --thread ...`: a LangGraph
thread's tasks found by the encoded start of their ids, whatever their generation suffix."""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from helpers import cli

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

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


class _Trip(TypedDict):
    items: Annotated[list[str], operator.add]


def _graph(saver: CastoreSaver, *, stop_before: str | None = None) -> Any:
    """plan -> act: two nodes, each adding to `items`; `stop_before` a node: interrupt there."""
    graph = StateGraph(_Trip)
    graph.add_node("plan", lambda _: {"items": ["planned"]})
    graph.add_node("act", lambda _: {"items": ["acted"]})
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "act")
    graph.add_edge("act", END)
    return graph.compile(
        checkpointer=saver, interrupt_before=[stop_before] if stop_before else None
    )


def test_log_of_a_thread_shows_its_checkpoints_as_langgraph_does(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log --thread` gives each checkpoint's id, step, source, the node that wrote it, the
    channels it changed and the nodes it leaves next, as get_state_history has them."""
    config: Any = {"configurable": {"thread_id": "trip-7"}}
    with CastoreSaver(store) as saver:
        app = _graph(saver)
        app.invoke({"items": ["hi"]}, config)
        history = list(app.get_state_history(config))
    code, out, err = cli(capsys, "--store", str(store.root), "log", "--thread", "trip-7")
    assert (0, "") == (code, err)
    lines = [line.strip().split("  ", 3)[3] for line in out.splitlines()]
    checkpoints = [line for line in lines if line.startswith("checkpoint ")]
    assert [
        f"checkpoint {state.config['configurable']['checkpoint_id']}  step "
        f"{state.metadata['step']} ({state.metadata['source']})"
        for state in history
    ] == [line.split("  ")[0] + "  " + line.split("  ")[1] for line in checkpoints]
    assert [list(state.next) for state in history] == [
        line.partition("  next: ")[2].split(", ") if "  next: " in line else []
        for line in checkpoints
    ]
    step_1 = history[1].config["configurable"]["checkpoint_id"]
    assert f"checkpoint {step_1}  step 1 (loop)  by plan  changed: items  next: act" in lines
    assert "thread 'trip-7', namespace ''" in lines
    code, out, _ = cli(capsys, "--store", str(store.root), "log", "--thread", "trip-7", "--json")
    told = [json.loads(line).get("langgraph", {}) for line in out.splitlines()]
    assert ["act"] == next(t for t in told if t.get("step") == 2)["written_by"]


def test_status_of_a_thread_says_where_its_graph_stands(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A thread that finished its turn is idle at its last checkpoint with no next node; one
    stopped before a node names that node; neither says "waiting for its next decision"."""
    done: Any = {"configurable": {"thread_id": "done"}}
    held: Any = {"configurable": {"thread_id": "held"}}
    with CastoreSaver(store) as saver:
        _graph(saver).invoke({"items": ["hi"]}, done)
        stopped = _graph(saver, stop_before="act")
        stopped.invoke({"items": ["hi"]}, held)
        last = {
            name: _graph(saver).get_state(config).config["configurable"]["checkpoint_id"]
            for name, config in (("done", done), ("held", held))
        }
    root = str(store.root)
    for thread, step, told in [
        ("done", 2, "next node: none (the graph finished its turn)"),
        ("held", 1, "next node: act"),
    ]:
        code, out, _ = cli(capsys, "--store", root, "status", "--thread", thread)
        line = out.splitlines()[0]
        assert (0, f"idle at checkpoint {last[thread]} (step {step})  {told}") == (
            code,
            line.split("  ", 2)[2],
        )
        code, out, _ = cli(capsys, "--store", root, "status", "--thread", thread, "--json")
        row = json.loads(out.splitlines()[0])["langgraph"]
        assert (last[thread], [] if thread == "done" else ["act"]) == (
            row["checkpoint_id"],
            row["next"],
        )
