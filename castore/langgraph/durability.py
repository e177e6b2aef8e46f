"""Which LangGraph durability modes keep a tool call's id across a crash, and the wait that
makes "async" keep it too.

A re-execution sees the same tool call id only if the checkpoint holding the model's message
was durable before the tool acted. "sync" writes it before the next step starts. "async"
writes it in the background while the tools run: a kill before that write re-runs the model,
whose new message names a new call id (measured: 3 of 8 kills). "exit" writes nothing before
the graph stops (8 of 8). So under "async" the tool waits until its checkpoint can be read
back from the checkpointer before it records anything; "exit" is refused.
"""

from __future__ import annotations

import time
from typing import Any

from castore.errors import UsageError
from castore.langgraph.deps import RunnableConfig

SAFE_MODES = ("sync", "async")
# Where LangGraph keeps, in the config it hands every node, the run's durability mode (absent:
# its default, "async"), its checkpointer, and the checkpoint id each namespace runs from
# (langgraph._internal._constants: CONFIG_KEY_DURABILITY, CONFIG_KEY_CHECKPOINTER, ..._MAP).
_DURABILITY, _DEFAULT = "__pregel_durability", "async"
_CHECKPOINTER, _CHECKPOINT_MAP = "__pregel_checkpointer", "checkpoint_map"
_NS_SEP = "|"
WAIT_S = 30.0
_FIRST_POLL_S, _MAX_POLL_S = 0.001, 0.05


class UnsafeDurabilityError(UsageError):
    """The graph runs in a mode (or with a checkpointer) that can lose the tool call id."""

    def __init__(
        self, mode: str, tool: str, why: str | None = None, fix: str | None = None
    ) -> None:
        self.mode = mode
        why = why or (
            "a crash can lose the checkpoint that holds the model's tool call, the model runs "
            "again, its new call gets a new id and the effect a new key"
        )
        fix = fix or "run the graph with durability='sync' (graph.invoke(..., durability='sync'))"
        super().__init__(
            f"durable tool {tool!r} runs in a graph with durability={mode!r}: {why}; {fix}"
        )


def durability_of(config: RunnableConfig) -> str:
    """The durability mode LangGraph runs the calling graph in."""
    return str(config.get("configurable", {}).get(_DURABILITY, _DEFAULT))


def graph_namespace(config: RunnableConfig) -> str:
    """The checkpoint namespace of the graph the calling node belongs to: the node's own
    namespace without its last `node:task` segment (a task id changes with the checkpoint)."""
    ns = str(config.get("configurable", {}).get("checkpoint_ns", ""))
    return ns.rpartition(_NS_SEP)[0] if _NS_SEP in ns else ""


def ensure_call_durable(config: RunnableConfig, tool: str, wait_s: float = WAIT_S) -> None:
    """Return once the checkpoint this tool call runs from is durable; refuse modes that
    cannot promise it."""
    mode = durability_of(config)
    if mode not in SAFE_MODES:
        raise UnsafeDurabilityError(mode, tool)
    if config.get("configurable", {}).get(_CHECKPOINTER) is None:
        raise UnsafeDurabilityError(
            mode,
            tool,
            "the graph has no checkpointer, so after a crash nothing of the run is left and the "
            "model's call comes back with a new id",
            "compile the graph with a checkpointer (graph.compile(checkpointer=...))",
        )
    if mode == "async":
        _await_checkpoint(config, tool, wait_s)


def _await_checkpoint(config: RunnableConfig, tool: str, wait_s: float) -> None:
    configurable = config.get("configurable", {})
    namespace = graph_namespace(config)
    checkpoint_id = configurable.get(_CHECKPOINT_MAP, {}).get(namespace)
    saver: Any = configurable.get(_CHECKPOINTER)
    if checkpoint_id is None or saver is None:
        raise UnsafeDurabilityError(
            "async", tool, "the node's config names no checkpointer or checkpoint to wait for"
        )
    target: RunnableConfig = {
        "configurable": {
            "thread_id": configurable.get("thread_id"),
            "checkpoint_ns": namespace,
            "checkpoint_id": checkpoint_id,
        }
    }
    deadline = time.monotonic() + wait_s
    poll = _FIRST_POLL_S
    # The put of this checkpoint was submitted before this task started; it is durable when
    # the checkpointer can read it back (SqliteSaver commits before its put returns).
    while saver.get_tuple(target) is None:
        if time.monotonic() > deadline:
            raise UnsafeDurabilityError(
                "async",
                tool,
                f"checkpoint {checkpoint_id} (thread {configurable.get('thread_id')!r}, "
                f"namespace {namespace!r}) holding the tool call was not readable from the "
                f"checkpointer within {wait_s:g} s",
            )
        time.sleep(poll)
        poll = min(poll * 2, _MAX_POLL_S)
