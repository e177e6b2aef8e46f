"""castore.langgraph.durable_tool: a LangGraph tool call that never applies its effect twice.

In-process graphs (ToolNode and a hand-written node, InMemorySaver and SqliteSaver) whose
payment function "crashes" after the service applied it (an exception: the graph run fails and
is re-executed from its checkpoint), each durability mode, the UNRESOLVED interrupt answered
with Command(resume=...), status and watch; then a small real-SIGKILL campaign against the lab
service, where the baseline arm must show the duplicates castore's arm does not.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

import castore
from castore.cli import EXIT_UNKNOWN_OUTCOME
from castore.langgraph import UnsafeDurabilityError, durable_tool
from castore.langgraph.agentlab import PayingModel, build_agent
from castore.langgraph.campaign import Settings, campaign
from castore.langgraph.deps import (
    START,
    AIMessage,
    BaseTool,
    Command,
    InMemorySaver,
    MessagesState,
    RunnableConfig,
    StateGraph,
    ToolMessage,
    sqlite_saver,
)
from castore.langgraph.tool import call_task_id
from castore.watch import Watcher
from castore.watch.alerts import Alert
from tests.helpers import cli

THREAD = {"configurable": {"thread_id": "t-1"}}


class Payments:
    """An in-process payment service with a ledger; it can lose its answer after applying."""

    def __init__(self) -> None:
        self.ledger: list[tuple[str, str, int]] = []  # (key, order, amount) per application
        self.sent: list[str] = []  # every key a request was sent with
        self.drop_answers = 0
        self.refuse = 0
        self.probe: Callable[[], bool] | None = None  # asked at each request, answers kept
        self.probed: list[bool] = []

    def pay(self, order: str, amount: int, *, idempotency_key: str) -> str:
        """Pay an order."""
        self.sent.append(idempotency_key)
        if self.probe is not None:
            self.probed.append(self.probe())
        if self.refuse:
            self.refuse -= 1
            raise ConnectionError("connection refused: nothing was applied")
        self.ledger.append((idempotency_key, order, amount))
        if self.drop_answers:
            self.drop_answers -= 1
            raise ConnectionError("the answer was lost after the payment was applied")
        return f"rcpt-{len(self.ledger)}"

    def lookup(self, key: str) -> castore.Reconciled:
        found = [n for n, (k, _, _) in enumerate(self.ledger, 1) if k == key]
        return castore.found(f"rcpt-{found[0]}") if found else castore.NOT_FOUND


@pytest.fixture
def payments() -> Payments:
    return Payments()


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.Store.open(tmp_path / "store", create=True)


def reconciling(payments: Payments, store: castore.Store) -> BaseTool:
    service = castore.Service("payments", reconcile=payments.lookup)
    tool: BaseTool = durable_tool(payments.pay, service=service, store=store)
    return tool


def blind(payments: Payments, store: castore.Store) -> BaseTool:
    """A service that can neither deduplicate nor be asked: a lost answer is UNRESOLVED."""
    tool: BaseTool = durable_tool(payments.pay, service=castore.Service("payments"), store=store)
    return tool


def start(app: Any) -> Any:
    return app.invoke({"messages": [("user", "pay")]}, THREAD, durability="sync")


def tool_answers(app: Any) -> list[str]:
    messages = app.get_state(THREAD).values["messages"]
    return [str(m.content) for m in messages if isinstance(m, ToolMessage)]


def test_toolnode_pays_once_and_answers_with_the_receipt(
    payments: Payments, store: castore.Store
) -> None:
    """In ToolNode with durability "sync" the payment is applied once and the tool's answer
    is the service's receipt; the call's castore task holds it as a confirmed effect."""
    app = build_agent(PayingModel(order="o-1"), reconciling(payments, store), InMemorySaver())
    start(app)
    assert [("o-1", 3750)] == [(order, amount) for _, order, amount in payments.ledger]
    assert ["rcpt-1"] == tool_answers(app)
    [task] = store.tasks()
    assert "rcpt-1" == store.verify(task).outcomes["call"].receipt


def test_model_sees_no_idempotency_key(store: castore.Store) -> None:
    """The schema the model is given (decorator form) has the function's arguments and
    docstring, not the key or the call id."""

    @durable_tool(service=castore.Service("payments"), store=store)
    def refund(order: str, cents: int, *, idempotency_key: str) -> str:
        """Refund an order."""
        return idempotency_key

    schema = refund.tool_call_schema.model_json_schema()
    assert ("refund", "Refund an order.") == (refund.name, refund.description)
    assert ["cents", "order"] == sorted(schema["properties"])


def test_lost_answer_reexecution_reconciles_with_the_same_key(
    payments: Payments, store: castore.Store
) -> None:
    """The service applied the payment but its answer was lost: the graph run fails, and
    re-executing it from its checkpoint looks the key up instead of paying again."""
    app = build_agent(PayingModel(order="o-1"), reconciling(payments, store), InMemorySaver())
    payments.drop_answers = 1
    with pytest.raises(ConnectionError):
        start(app)
    app.invoke(None, THREAD, durability="sync")
    assert 1 == len(payments.ledger)
    assert 1 == len(payments.sent)
    assert ["rcpt-1"] == tool_answers(app)


def test_reexecution_resubmits_with_the_same_key_when_not_applied(
    payments: Payments, store: castore.Store
) -> None:
    """A request that never reached the service is resubmitted with the key recorded before
    the first attempt: the key is the same across re-executions of the call."""
    app = build_agent(PayingModel(order="o-1"), reconciling(payments, store), InMemorySaver())
    payments.refuse = 1
    with pytest.raises(ConnectionError):
        start(app)
    app.invoke(None, THREAD, durability="sync")
    assert 2 == len(payments.sent)
    assert payments.sent[0] == payments.sent[1]
    assert [payments.sent[0]] == [key for key, _, _ in payments.ledger]


def test_ainvoke_reexecution_pays_once(payments: Payments, store: castore.Store) -> None:
    """Driven with ainvoke (the tool runs in an executor thread), a lost answer is looked up
    by key on re-execution, in both modes the tool accepts."""

    async def drive(app: Any, config: dict[str, Any], mode: str) -> None:
        with pytest.raises(ConnectionError):
            await app.ainvoke({"messages": [("user", "pay")]}, config, durability=mode)
        await app.ainvoke(None, config, durability=mode)

    app = build_agent(PayingModel(order="o-5"), reconciling(payments, store), InMemorySaver())
    for mode in ("sync", "async"):
        payments.drop_answers = 1
        asyncio.run(drive(app, {"configurable": {"thread_id": mode}}, mode))
    assert 2 == len(payments.ledger)
    assert 2 == len(set(payments.sent))


def test_hand_written_node_with_sqlite_saver(payments: Payments, store: castore.Store) -> None:
    """A node that invokes the tool itself with the model's tool calls works like ToolNode,
    with SqliteSaver as the checkpointer, through a lost answer and a re-execution."""
    tool = reconciling(payments, store)
    model = PayingModel(order="o-2")

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def pay_node(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        calls = [{**call, "type": "tool_call"} for call in last.tool_calls]
        return {"messages": [tool.invoke(call, config) for call in calls]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("pay", pay_node)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "pay")
    graph.add_edge("pay", "agent")
    pytest.importorskip("langgraph.checkpoint.sqlite")
    saver = sqlite_saver()(sqlite3.connect(":memory:", check_same_thread=False))
    app = graph.compile(checkpointer=saver, interrupt_after=["agent"])
    payments.drop_answers = 1
    start(app)  # the model asked for the payment; paused after it (a checkpoint)
    with pytest.raises(ConnectionError):
        app.invoke(None, THREAD, durability="sync")
    app.invoke(None, THREAD, durability="sync")
    assert [("o-2", 3750)] == [(order, amount) for _, order, amount in payments.ledger]
    assert ["rcpt-1"] == tool_answers(app)


def test_exit_durability_is_refused(payments: Payments, store: castore.Store) -> None:
    """In durability "exit" nothing is checkpointed before the graph stops: after a crash the
    model runs again and its new call has a new id. The tool refuses before anything is sent
    or recorded, naming the mode to use."""
    app = build_agent(PayingModel(), reconciling(payments, store), InMemorySaver())
    with pytest.raises(UnsafeDurabilityError) as caught:
        app.invoke({"messages": [("user", "pay")]}, THREAD, durability="exit")
    assert "exit" == caught.value.mode
    assert "durability='sync'" in str(caught.value)
    assert [] == payments.sent
    assert [] == list(store.tasks())


class SlowSaver(InMemorySaver):
    """A checkpointer whose writes take a while, as a disk under load does."""

    def put(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # the latency under test, not a wait for a condition
        return super().put(*args, **kwargs)

    def holds_the_call(self) -> bool:
        """True if the newest stored checkpoint ends with the model's tool call."""
        latest = self.get_tuple(THREAD)
        messages = latest.checkpoint["channel_values"].get("messages", []) if latest else []
        return (
            bool(messages) and isinstance(messages[-1], AIMessage) and bool(messages[-1].tool_calls)
        )


@pytest.mark.parametrize("mode", ["async", None], ids=["async", "default"])
def test_async_durability_waits_for_the_checkpoint_holding_the_call(
    payments: Payments, store: castore.Store, mode: str | None
) -> None:
    """In durability "async" (LangGraph's default) the checkpoint holding the model's tool
    call is written in the background while the tools run; the durable tool waits until it
    is stored before anything is recorded or sent, so a crash cannot change the call's id."""
    saver = SlowSaver()
    payments.probe = saver.holds_the_call
    app = build_agent(PayingModel(order="o-4"), reconciling(payments, store), saver)
    options = {} if mode is None else {"durability": mode}
    app.invoke({"messages": [("user", "pay")]}, THREAD, **options)
    assert [True] == payments.probed
    assert ["rcpt-1"] == tool_answers(app)


def test_without_thread_or_checkpointer_is_refused(
    payments: Payments, store: castore.Store
) -> None:
    """Without a checkpointer nothing of a run survives a crash, and without a thread id
    nothing is stable to key the call on: each is a clear refusal, nothing sent."""
    tool = reconciling(payments, store)
    call = {"name": "pay", "args": {"order": "o", "amount": 1}, "id": "c1", "type": "tool_call"}
    sync: dict[str, Any] = {"__pregel_durability": "sync"}
    with pytest.raises(UnsafeDurabilityError, match="no checkpointer"):
        tool.invoke(call, {"configurable": {**sync, "thread_id": "t"}})
    with pytest.raises(castore.UsageError, match="needs a thread"):
        tool.invoke(call, {"configurable": {**sync, "__pregel_checkpointer": InMemorySaver()}})
    assert [] == payments.sent


def test_same_call_id_with_other_arguments_is_refused(
    payments: Payments, store: castore.Store
) -> None:
    """A call id coming back with other arguments is not the same logical call: castore
    refuses it as plan drift instead of sending it under the recorded key."""
    tool = reconciling(payments, store)
    saver = InMemorySaver()
    config: RunnableConfig = {
        "configurable": {
            "thread_id": "t",
            "__pregel_durability": "sync",
            "__pregel_checkpointer": saver,
        }
    }
    call = {"name": "pay", "args": {"order": "o", "amount": 1}, "id": "c1", "type": "tool_call"}
    tool.invoke(call, config)
    with pytest.raises(castore.PlanDriftError):
        tool.invoke({**call, "args": {"order": "o", "amount": 2}}, config)
    assert 1 == len(payments.sent)


def test_function_without_idempotency_key_is_refused(store: castore.Store) -> None:
    """durable_tool needs the function to take the key it must send."""

    def pay(order: str) -> str:
        return order

    with pytest.raises(castore.UsageError, match="idempotency_key"):
        durable_tool(pay, service=castore.Service("payments"), store=store)


def test_call_task_depends_on_thread_namespace_and_call_id() -> None:
    """The castore task of a call is a function of thread, namespace and call id only."""
    base = call_task_id("t-1", "", "call_1")
    assert base == call_task_id("t-1", "", "call_1")
    others = {call_task_id("t-2", "", "call_1"), call_task_id("t-1", "sub:1", "call_1")}
    assert base not in others | {call_task_id("t-1", "", "call_2")}


def unresolved_graph(payments: Payments, store: castore.Store) -> tuple[Any, dict[str, Any]]:
    """A graph paused on an UNRESOLVED call; returns it and the interrupt's value."""
    app = build_agent(PayingModel(order="o-3"), blind(payments, store), InMemorySaver())
    payments.drop_answers = 1
    with pytest.raises(ConnectionError):
        start(app)
    result = app.invoke(None, THREAD, durability="sync")
    [pending] = result["__interrupt__"]
    value: dict[str, Any] = pending.value
    return app, value


def test_unresolved_call_interrupts_and_confirmed_answer_continues(
    payments: Payments, store: castore.Store
) -> None:
    """An answer lost by a service that can neither deduplicate nor be asked pauses the
    graph with an interrupt naming task, step and key; Command(resume={"confirmed": ...})
    records the decision (who, audited) and the graph continues with that receipt."""
    app, value = unresolved_graph(payments, store)
    [task] = store.tasks()
    assert (task, "call", payments.sent[0]) == (value["task"], value["step"], value["key"])
    assert str(store.root) == value["store"]
    app.invoke(
        Command(resume={"confirmed": "rcpt-1", "who": "ops@example"}), THREAD, durability="sync"
    )
    assert 1 == len(payments.sent)
    assert ["rcpt-1"] == tool_answers(app)
    head = store.verify(task).head.transition
    assert ("resolve", "ops@example", "rcpt-1") == (head.kind.value, head.who, head.receipt)


def test_not_done_answer_resubmits_with_the_same_key(
    payments: Payments, store: castore.Store
) -> None:
    """Command(resume={"not_done": reason}) records NOT_DONE and the call is sent again with
    the same key."""
    app, value = unresolved_graph(payments, store)
    app.invoke(
        Command(resume={"not_done": "not in the payments ledger"}), THREAD, durability="sync"
    )
    assert [value["key"], value["key"]] == payments.sent
    assert ["rcpt-2"] == tool_answers(app)


def test_answer_replayed_after_a_crash_is_not_applied_to_a_later_submission(
    payments: Payments, store: castore.Store
) -> None:
    """LangGraph hands a re-executed node the answers it consumed before: after "not done",
    the resent call's answer lost again, the old "not done" is not applied to the new
    submission (which would send it a third time); the graph asks again, naming attempt 2."""
    app, value = unresolved_graph(payments, store)
    assert 1 == value["attempt"]
    payments.drop_answers = 1  # the resent payment is applied, its answer lost
    with pytest.raises(ConnectionError):
        app.invoke(Command(resume={"not_done": "not in the ledger"}), THREAD, durability="sync")
    result = app.invoke(None, THREAD, durability="sync")
    [pending] = result["__interrupt__"]
    assert (2, value["key"]) == (pending.value["attempt"], pending.value["key"])
    assert 2 == len(payments.sent)
    answer = {"confirmed": "rcpt-2", "attempt": 2}
    app.invoke(Command(resume=answer), THREAD, durability="sync")
    assert 2 == len(payments.sent)
    assert ["rcpt-2"] == tool_answers(app)


def test_malformed_answer_is_refused(payments: Payments, store: castore.Store) -> None:
    """A resume value that is neither answer says which two it may be; nothing is resolved."""
    app, value = unresolved_graph(payments, store)
    with pytest.raises(castore.UsageError, match="not_done"):
        app.invoke(Command(resume="yes"), THREAD, durability="sync")
    assert "UNRESOLVED" == store.status(value["task"]).effects[0].state


def test_status_and_watch_show_the_unresolved_call(
    payments: Payments, store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore status` lists the paused call's effect as UNRESOLVED with its key, and the
    watcher raises its unresolved alert, as for any castore effect."""
    _, value = unresolved_graph(payments, store)
    code, out, _ = cli(capsys, "--store", str(store.root), "status")
    assert EXIT_UNKNOWN_OUTCOME == code
    assert value["task"] in out
    assert "UNRESOLVED" in out
    alerts: list[Alert] = []
    watcher = Watcher(store.root, alerts.append, rescan_every=3600.0)
    try:
        watcher.check_now()
    finally:
        watcher.stop()
    unresolved = [(a.task, a.step, a.key) for a in alerts if a.kind == "unresolved"]
    assert [(value["task"], "call", value["key"])] == unresolved


def test_import_castore_does_not_load_langgraph() -> None:
    """`import castore` loads neither castore.langgraph nor langgraph/langchain."""
    code = (
        "import sys, castore; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langchain_core') or m.startswith('castore.langgraph')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "[]" == out.strip()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "campaign"
    path.mkdir()
    return path


def test_small_campaign_castore_never_pays_twice_where_the_baseline_does(workdir: Path) -> None:
    """Real SIGKILLs (right after the service committed, at castore's crash points, at random):
    the baseline arm (SqliteSaver + a plain tool) pays some orders twice; castore's arm pays
    every order exactly once and reports the receipt the service's ledger holds."""
    pytest.importorskip("langgraph.checkpoint.sqlite")
    settings = Settings(seed=5, after_apply_share=0.0, point_share=0.2, random_share=0.1)
    tally = campaign(workdir, 2, settings)
    assert 2 == tally.runs
    assert tally.kills >= 4  # every thread's first run is killed after the payment
    assert [] == tally.problems
    assert (0, 0) == (tally.duplicates, tally.lost)
    assert tally.baseline_duplicates >= 2
