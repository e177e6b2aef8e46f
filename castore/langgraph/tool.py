"""durable_tool: a LangChain tool whose side effect goes through castore's effect protocol.

Each logical tool call is one castore task with a one-effect plan. Its id is derived from what
stays the same when LangGraph executes the call again after a crash: the thread id, the graph's
checkpoint namespace and the tool call's id. The key is durable (SUBMITTED) before the
function is called and the receipt (CONFIRMED) after; a re-execution reconciles, resubmits with
the same key or, when nobody can know, pauses the graph with `interrupt(...)` for a person.

The tool call id only stays the same if the checkpoint holding the model's message was durable
before the tool acted: castore.langgraph.durability makes sure of it ("sync"; "async" waits
for it) or refuses the mode ("exit").
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, cast

import pydantic

import castore
from castore.errors import OutcomeUnknownError, UsageError
from castore.format.codec import encode_value
from castore.format.digest import hash_chunks
from castore.langgraph.deps import (
    BaseTool,
    InjectedToolCallId,
    RunnableConfig,
    StructuredTool,
    create_schema_from_function,
    interrupt,
)
from castore.langgraph.durability import ensure_call_durable, graph_namespace
from castore.run import resolution

STEP = "call"
KEY_PARAM = "idempotency_key"

StoreLike = castore.Store | str | os.PathLike[str]


def call_task_id(thread_id: str, namespace: str, tool_call_id: str) -> str:
    """The castore task of one logical tool call: the same on every execution of that call."""
    parts = ("castore-langgraph-call", thread_id, namespace, tool_call_id)
    digest = hash_chunks(part.encode() + b"\0" for part in parts)
    # Not "lg-": CastoreSaver names its thread tasks "lg-<thread>_n<ns>_g<n>".
    return f"lgtool-{digest[:40]}"


def call_plan(tool: str, args: Mapping[str, Any]) -> castore.Plan:
    """The one-effect plan of a call; its arguments' digest is part of it, so that the same
    call id coming back with other arguments is refused as plan drift, never sent."""
    args_digest = hash_chunks([encode_value(dict(args))])
    return castore.Plan.build("langgraph-tool", castore.effect(STEP), tool=tool, args=args_digest)


def interrupt_value(
    run: castore.Run, store: castore.Store, tool: str, call_id: str, why: str | None
) -> dict[str, Any]:
    """What the graph's caller sees in the interrupt: which effect and submission, and how to
    answer."""
    record = run.head.effect(STEP)
    attempt = record.attempts if record is not None else 0
    return {
        "castore": "unresolved",
        "store": str(store.root),
        "task": run.task_id,
        "step": STEP,
        "key": record.key if record is not None else None,
        "attempt": attempt,
        "tool": tool,
        "tool_call_id": call_id,
        "reason": why,
        "answer": (
            f'Command(resume={{"confirmed": RECEIPT, "attempt": {attempt}}}) if the service '
            f'applied it, Command(resume={{"not_done": REASON, "attempt": {attempt}}}) if not'
        ),
    }


def answers_this_submission(run: castore.Run, answer: Mapping[str, Any]) -> bool:
    """True if `answer` is about the effect's current submission. LangGraph hands a resumed
    node the answers its earlier executions consumed, in order; after a crash the first one
    may be about an earlier submission, already recorded (a "not done" then resent): applied
    again it would send the call once more. An answer names its submission ("attempt", from
    the interrupt); one that does not can only be about the first."""
    record = run.head.effect(STEP)
    current = record.attempts if record is not None else 0
    return bool(answer.get("attempt", 1) == current)


def record_answer(run: castore.Run, answer: object) -> str | None:
    """Record a person's answer to the interrupt as castore's audited resolution; returns the
    confirmed receipt, or None for "not done" (the call is then sent again, same key)."""
    if not isinstance(answer, Mapping) or len({"confirmed", "not_done"} & answer.keys()) != 1:
        raise UsageError(
            f"task {run.task_id!r}: resume an unresolved durable tool call with "
            'Command(resume={"confirmed": RECEIPT}) or Command(resume={"not_done": REASON}) '
            f'(optionally with "attempt" from the interrupt, and "who"), not {answer!r}'
        )
    who = answer.get("who") or f"{resolution.default_actor()} (LangGraph resume)"
    if "confirmed" in answer:
        receipt = answer["confirmed"]
        if not isinstance(receipt, str) or not receipt.strip():
            raise UsageError(f"task {run.task_id!r}: the confirmed receipt must be a non-empty str")
        resolution.resolve(run, STEP, receipt=receipt, who=str(who), reason=answer.get("reason"))
        return receipt
    resolution.resolve(run, STEP, not_done=True, reason=str(answer["not_done"]), who=str(who))
    return None


class _Call:
    """One execution of a durable tool: opens the call's task and drives its effect."""

    def __init__(self, tool: _DurableTool, config: RunnableConfig, call_id: str) -> None:
        configurable = config.get("configurable", {})
        thread = configurable.get("thread_id")
        if thread is None:
            raise UsageError(
                f"durable tool {tool.name!r} needs a thread: run it in a graph compiled with a "
                'checkpointer and invoked with config={"configurable": {"thread_id": ...}}'
            )
        self.tool, self.call_id = tool, call_id
        self.task = call_task_id(str(thread), graph_namespace(config), call_id)

    def run(self, args: dict[str, Any]) -> str:
        def send(key: str) -> str:
            receipt = self.tool.func(**args, **{KEY_PARAM: key})
            if not isinstance(receipt, str) or not receipt:
                raise UsageError(
                    f"durable tool {self.tool.name!r} returned {receipt!r}; it must return the "
                    "service's receipt (a non-empty str) for the operation it applied"
                )
            return receipt

        store = self.tool.open_store()
        with store.open_task(self.task, call_plan(self.tool.name, args)) as run:
            while True:
                try:
                    return run.perform(STEP, self.tool.service, send)
                except OutcomeUnknownError as exc:
                    # Raises GraphInterrupt on the first execution; on the one resumed with
                    # Command(resume=...) it returns the person's answer.
                    answer = interrupt(
                        interrupt_value(run, store, self.tool.name, self.call_id, exc.reason)
                    )
                    if isinstance(answer, Mapping) and not answers_this_submission(run, answer):
                        continue  # a stale answer: the next interrupt asks about this one
                    receipt = record_answer(run, answer)
                    if receipt is not None:
                        return receipt


class _DurableTool:
    """What durable_tool keeps: the function, its service and the store (opened once)."""

    def __init__(
        self, func: Callable[..., Any], service: castore.Service, store: StoreLike, name: str
    ) -> None:
        self.func, self.service, self.name = func, service, name
        self._store = store if isinstance(store, castore.Store) else None
        self._path = None if isinstance(store, castore.Store) else os.fspath(store)

    def open_store(self) -> castore.Store:
        if self._store is None:
            self._store = castore.Store.open(str(self._path), create=True)
        return self._store

    def invoke(self, config: RunnableConfig, tool_call_id: str, **args: Any) -> str:
        ensure_call_durable(config, self.name)
        return _Call(self, config, tool_call_id).run(args)


def _check_function(func: Callable[..., Any]) -> None:
    parameters = inspect.signature(func).parameters
    param = parameters.get(KEY_PARAM)
    if param is None or param.kind not in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
        raise UsageError(
            f"durable_tool needs a function that takes an {KEY_PARAM!r} keyword (the key to "
            f"send to the service); {getattr(func, '__name__', func)!r} has none"
        )


def durable_tool(
    func: Callable[..., Any] | None = None,
    *,
    service: castore.Service,
    store: StoreLike,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Turn `func(..., idempotency_key=...)` (it applies the operation and returns the
    service's receipt, a str) into a LangChain tool that never applies a call twice.

    Use it as `durable_tool(pay, service=..., store=...)` or as a decorator
    `@durable_tool(service=..., store=...)`. The tool's result is the receipt. The graph must
    run with durability "sync" or "async" ("exit" is refused) and a thread id; any
    checkpointer will do."""

    def build(function: Callable[..., Any]) -> BaseTool:
        _check_function(function)
        tool_name = name or function.__name__
        durable = _DurableTool(function, service, store, tool_name)
        # langchain builds a pydantic v2 model from a signature (v1 only for v1 inputs).
        visible = cast(
            "type[pydantic.BaseModel]",
            create_schema_from_function(tool_name, function, filter_args=[KEY_PARAM]),
        )
        schema = pydantic.create_model(
            f"{tool_name}_call",
            __base__=visible,
            tool_call_id=(Annotated[str, InjectedToolCallId], ...),
        )

        def call(config: RunnableConfig, tool_call_id: str, **args: Any) -> str:
            return durable.invoke(config, tool_call_id, **args)

        return StructuredTool(
            name=tool_name,
            description=description or inspect.getdoc(function) or tool_name,
            args_schema=schema,
            func=call,
        )

    return build if func is None else build(func)
