"""A LangGraph thread's task as its page shows it: each checkpoint with its id, step, the
nodes that wrote it and run next, and each timeline entry in LangGraph's words, not only by
its tree id (pure reading).

The reading is castore.langgraph.threadview's, the one `castore log --thread` prints, so the
page and the command say the same. It needs the langgraph extra; without it the page shows
the plain timeline and says why.
"""

from __future__ import annotations

from typing import Any

from castore.format.model import attrs
from castore.format.records import Snapshot
from castore.store import Store

PREFIX = "lg-"  # castore.langgraph.names.PREFIX, without loading LangGraph to know it


@attrs.frozen
class Thread:
    title: str | None  # "thread 'chat-7', namespace ''", from the log's first event
    checkpoints: tuple[tuple[int, Any], ...]  # (seq, threadview.Checkpoint), newest first
    nodes: dict[int, str]  # seq -> what that entry of the log is, in LangGraph's words


def read_thread(
    store: Store, history: list[tuple[str, Snapshot]]
) -> tuple[Thread | None, str | None]:
    """The thread a task's history holds, or None and why it cannot be shown."""
    try:
        from castore.langgraph import threadview  # noqa: PLC0415 - the extra, if any
    except ImportError as exc:
        return None, f"LangGraph's node names need castore's langgraph extra ({exc})"
    found = threadview.events(store, history)
    if not found:
        return None, "no entry of this task is a CastoreSaver event this castore can read"
    title = next(
        (
            e.detail
            for e in found.values()
            if isinstance(e, threadview.Other) and e.kind == "thread"
        ),
        None,
    )
    checkpoints = tuple(
        (seq, event)
        for seq, event in sorted(found.items(), reverse=True)
        if isinstance(event, threadview.Checkpoint)
    )
    nodes = {seq: event.text() for seq, event in found.items()}
    return Thread(title, checkpoints, nodes), None
