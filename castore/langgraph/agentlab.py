"""A tool-calling LangGraph agent that pays an order through the crash lab's fake service.

    python -m castore.langgraph.agentlab --arm castore --store S --sqlite DB --thread T \
        --service URL --declare lookup

The model is a fake (no network) that behaves like a real one where it matters here: each of
its tool calls carries a fresh id. Arms: `baseline` (a plain tool that sends a fresh key per
execution, as a tool with no durable state must) and `castore` (the same payment as a
durable_tool). Exit status: 0 done, 3 interrupted (a service call failed; run again), 5 the
graph would not move on, 6 the graph paused on an UNRESOLVED call (the interrupt's value is
printed as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import uuid
from collections.abc import Callable
from typing import Any

import castore
from castore.lab.service import ServiceClient, ServiceError
from castore.langgraph.deps import (
    START,
    AIMessage,
    BaseChatModel,
    BaseMessage,
    BaseTool,
    ChatGeneration,
    ChatResult,
    Command,
    MessagesState,
    StateGraph,
    StructuredTool,
    ToolMessage,
    ToolNode,
    sqlite_saver,
    tools_condition,
)
from castore.langgraph.saver import CastoreSaver
from castore.langgraph.tool import durable_tool

EXIT_DONE, EXIT_INTERRUPTED, EXIT_STALLED, EXIT_UNRESOLVED = 0, 3, 5, 6
MAX_STALLS = 3
# Set by the campaign: SIGKILL this process right after the service answered a payment
# (committed, receipt not recorded anywhere yet): the moment a re-execution pays twice.
CRASH_AFTER_APPLY = "CASTORE_LG_CRASH_AFTER_APPLY"


class PayingModel(BaseChatModel):
    """A fake chat model: asks for one payment, then reports the tool's answer."""

    order: str = "order-1"
    amount: int = 3750

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        answers = [m for m in messages if isinstance(m, ToolMessage)]
        if answers:
            message = AIMessage(content=f"paid: {answers[-1].content}")
        else:
            # A real model names each tool call anew (call_<random>): so does this one.
            call = {
                "name": "pay",
                "args": {"order": self.order, "amount": self.amount},
                "id": f"call_{uuid.uuid4().hex[:24]}",
            }
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])

    @property
    def _llm_type(self) -> str:
        return "castore-paying-fake"


def build_agent(model: BaseChatModel, tool: BaseTool, checkpointer: Any) -> Any:
    """model -> tools (ToolNode) -> model -> end, compiled with `checkpointer`."""

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def applier(client: ServiceClient) -> Callable[[str, int, str], str]:
    """The payment request itself: POST /apply with the key, crash after it if armed."""

    def apply(order: str, amount: int, key: str) -> str:
        receipt = client.apply(key, "pay", {"order": order, "amount": amount})
        if os.environ.get(CRASH_AFTER_APPLY):
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt

    return apply


def payment_tool(arm: str, client: ServiceClient, store: str, declare: str) -> BaseTool:
    """The `pay` tool of an arm."""
    apply = applier(client)
    if arm == "baseline":

        def plain(order: str, amount: int) -> str:
            """Pay an order."""
            return apply(order, amount, f"plain-{uuid.uuid4().hex}")

        return StructuredTool.from_function(plain, name="pay")

    def reconcile(key: str) -> castore.Reconciled:
        try:
            receipt = client.lookup(key)
        except ServiceError as exc:
            return castore.unknown(str(exc))
        return castore.NOT_FOUND if receipt is None else castore.found(receipt)

    service = castore.Service("payments", reconcile=reconcile if declare == "lookup" else None)

    def pay(order: str, amount: int, *, idempotency_key: str) -> str:
        """Pay an order."""
        return apply(order, amount, idempotency_key)

    tool: BaseTool = durable_tool(pay, service=service, store=store)
    return tool


def checkpointer(args: argparse.Namespace) -> Any:
    """The arm's checkpointer: CastoreSaver for castore's arm (in a store of its own, beside
    the tool's), SqliteSaver for the baseline."""
    if args.arm == "castore":
        return CastoreSaver(f"{args.store}-graph")
    return sqlite_saver()(sqlite3.connect(args.sqlite, check_same_thread=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arm", choices=("baseline", "castore"), required=True)
    parser.add_argument("--store", required=True, help="castore store (castore arm)")
    parser.add_argument("--sqlite", required=True, help="SqliteSaver database")
    parser.add_argument("--thread", required=True)
    parser.add_argument("--service", required=True, help="base URL of the fake service")
    parser.add_argument("--declare", choices=("lookup", "none"), default="lookup")
    parser.add_argument("--durability", choices=("sync", "async", "exit"), default="sync")
    parser.add_argument("--resume", help="JSON answer to an UNRESOLVED interrupt")
    args = parser.parse_args(argv)
    client = ServiceClient(args.service, timeout=10.0)
    tool = payment_tool(args.arm, client, args.store, args.declare)
    app = build_agent(PayingModel(order=args.thread), tool, checkpointer(args))
    config = {"configurable": {"thread_id": args.thread}}
    print("ready", flush=True)
    state = app.get_state(config)
    given: Any = {"messages": [("user", f"pay {args.thread}")]}
    if args.resume and state.interrupts:  # a kill may have come after the answer was taken
        given = Command(resume=json.loads(args.resume))
    elif state.values:
        given = None  # resume from the last checkpoint (a finished graph does nothing)
    try:
        if not state.values or state.next:
            app.invoke(given, config, durability=args.durability)
        # A kill after the paused tool answered but before the next checkpoint leaves that
        # answer's task done and its interrupt still listed: the Command then moves nothing
        # on, and the graph is driven on from its checkpoint.
        for _ in range(MAX_STALLS):
            state = app.get_state(config)
            if not state.next or state.interrupts:
                break
            app.invoke(None, config, durability=args.durability)
    except ServiceError as exc:
        print(f"interrupted: {type(exc).__name__}: {exc}", flush=True)
        return EXIT_INTERRUPTED
    state = app.get_state(config)
    if state.next and not state.interrupts:
        print(f"stalled: the graph still has {state.next} to run", file=sys.stderr, flush=True)
        return EXIT_STALLED
    if state.interrupts:
        print(json.dumps({"unresolved": state.interrupts[0].value}), flush=True)
        return EXIT_UNRESOLVED
    print(json.dumps({"done": _answer(state.values)}), flush=True)
    return EXIT_DONE


def _answer(values: dict[str, Any]) -> str | None:
    """The receipt the tool answered with, once the model has reported it."""
    messages = values.get("messages", [])
    if not messages or not isinstance(messages[-1], AIMessage) or messages[-1].tool_calls:
        return None
    answers = [m.content for m in messages if isinstance(m, ToolMessage)]
    return str(answers[-1]) if answers else None


if __name__ == "__main__":
    sys.exit(main())
