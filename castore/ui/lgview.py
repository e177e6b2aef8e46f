"""A LangGraph thread's task as a person reads it: each entry of CastoreSaver's log named by
its checkpoint id and the graph's nodes, not only by its tree id (pure reading).

CastoreSaver's headers are LangGraph's serializer's bytes, so reading them needs the
langgraph extra; without it the page shows the plain timeline and says why. The saver's
own modules do the decoding (castore.langgraph is the only importer of langgraph).
"""

from __future__ import annotations

import base64
from typing import Any

from castore.errors import CastoreError
from castore.format.model import attrs
from castore.format.records import Snapshot
from castore.store import Store

PREFIX = "lg-"  # castore.langgraph.names.PREFIX, without loading LangGraph to know it


@attrs.frozen
class Checkpoint:
    seq: int
    checkpoint_id: str
    step: Any
    source: str
    ran: tuple[str, ...]  # the nodes whose writes this checkpoint is the first to hold
    next: tuple[str, ...]  # the nodes it triggers


@attrs.frozen
class Thread:
    thread_id: str | None
    namespace: str | None
    checkpoints: tuple[Checkpoint, ...]
    nodes: dict[int, str]  # seq -> what that entry of the log is, in LangGraph's words


def read_thread(
    store: Store, history: list[tuple[str, Snapshot]]
) -> tuple[Thread | None, str | None]:
    """The thread a task's history holds, or None and why it cannot be shown."""
    try:
        from castore.langgraph.deps import InMemorySaver  # noqa: PLC0415 - the extra, if any
        from castore.langgraph.parts import Parts  # noqa: PLC0415
    except ImportError as exc:
        return None, f"LangGraph's node names need castore's langgraph extra ({exc})"
    parts = Parts(store, InMemorySaver().serde)
    thread = _Reader()
    try:
        for _, snapshot in reversed(history):  # oldest first: a put is judged by the one before
            ref = snapshot.transition.result_ref
            if ref is not None:
                thread.add(snapshot.seq, store.get_tree(ref).data, parts)
    except (CastoreError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"not a CastoreSaver log this castore can read ({exc!r})"
    return thread.result(), None


class _Reader:
    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.namespace: str | None = None
        self.checkpoints: list[Checkpoint] = []
        self.nodes: dict[int, str] = {}
        self._seen: dict[str, Any] = {}

    def add(self, seq: int, data: Any, parts: Any) -> None:
        kind = data["k"]
        header = parts.decode(base64.b64decode(data["h"]))
        if kind == "m":
            self.thread_id, self.namespace = str(header[0]), str(header[1])
            self.nodes[seq] = f"thread {self.thread_id!r}, namespace {self.namespace!r}"
        elif kind == "p":
            self._put(seq, header)
        elif kind == "w":
            node = str(header["task_path"]).rpartition(", ")[2] or "?"
            channels = ", ".join(str(channel) for channel, _ in header["writes"])
            self.nodes[seq] = (
                f"writes of node {node} for checkpoint {header['checkpoint_id']}: {channels}"
            )
        elif kind == "i":
            self.nodes[seq] = f"a rewrite keeping {len(header['keep'])} checkpoints"

    def _put(self, seq: int, header: dict[str, Any]) -> None:
        checkpoint = header["checkpoint"]
        seen = checkpoint.get("versions_seen", {})
        ran = tuple(
            sorted(n for n, v in seen.items() if n != "__input__" and self._seen.get(n) != v)
        )
        self._seen = dict(seen)
        triggered = tuple(
            sorted(
                channel.removeprefix("branch:to:")
                for channel in checkpoint.get("updated_channels") or ()
                if str(channel).startswith("branch:to:")
            )
        )
        metadata = header.get("metadata") or {}
        found = Checkpoint(
            seq,
            str(checkpoint["id"]),
            metadata.get("step"),
            str(metadata.get("source", "")),
            ran,
            triggered,
        )
        self.checkpoints.append(found)
        text = f"checkpoint {found.checkpoint_id} (step {found.step}, {found.source})"
        if ran:
            text += f" after {', '.join(ran)}"
        if triggered:
            text += f"; next: {', '.join(triggered)}"
        self.nodes[seq] = text

    def result(self) -> Thread:
        return Thread(self.thread_id, self.namespace, tuple(reversed(self.checkpoints)), self.nodes)
