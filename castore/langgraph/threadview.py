"""A thread's castore task read back the way LangGraph shows it (`castore log` and `status
--thread`): per checkpoint its id, step and source, the node that wrote it, the channels it
changed and the nodes it leaves to run next.

Read from the events state.py's docstring lists, decoded with LangGraph's default
serializer; a saver given another serializer (an encrypted one) leaves events this cannot
decode, which are then shown as castore steps (None here). Nothing is written.

Which node wrote a checkpoint is what LangGraph's own loop knows: the tasks whose writes
were put for its parent. Which nodes run next is derived as LangGraph's StateGraph decides
it, without the graph: node X is triggered when channel `branch:to:X` holds a value at a
version X has not seen (node __start__ by channel __start__). A graph that triggers its
nodes otherwise shows no next node.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

from castore.chain.trees import TreeRef
from castore.errors import CastoreError
from castore.format.model import attrs
from castore.format.records import Snapshot
from castore.langgraph.deps import JsonPlusSerializer
from castore.langgraph.parts import Parts
from castore.store import Store

_BRANCH = "branch:to:"
_START = "__start__"  # the input's channel and the node that reads it
_PULL = "~__pregel_pull, "  # a task path's start for a node run by the graph's edges
_INTERRUPT = "__interrupt__"
# Writes that are not a node's finished run: it failed, or a resume value was given to it.
_NOT_A_NODES_RUN = frozenset({"__error__", "__resume__"})


@attrs.frozen
class Checkpoint:
    """One checkpoint as get_state_history shows it, with what castore can add."""

    checkpoint_id: str
    step: int | None
    source: str | None
    written_by: tuple[str, ...]  # the nodes whose writes made it (none: the input, an update)
    changed: tuple[str, ...]  # the channels it changed (but the branch:to: channels)
    next: tuple[str, ...] = ()  # the nodes it leaves to run
    interrupted: tuple[str, ...] = ()  # the nodes that called interrupt() on it

    def to_json(self) -> dict[str, Any]:
        return {"kind": "checkpoint", **attrs.asdict(self)}

    def text(self) -> str:
        """`checkpoint ID  step 2 (loop)  by act  changed: items  next: act`"""
        parts = [f"checkpoint {self.checkpoint_id}", f"step {self.step} ({self.source})"]
        if self.written_by:
            parts.append(f"by {', '.join(self.written_by)}")
        elif self.source == "input":
            parts.append("from the input")
        elif self.source == "update":
            parts.append("by update_state")
        parts.append(f"changed: {', '.join(self.changed) or 'nothing'}")
        if self.interrupted:
            parts.append(f"interrupted in {', '.join(self.interrupted)}")
        if self.next:
            parts.append(f"next: {', '.join(self.next)}")
        return "  ".join(parts)


@attrs.frozen
class Writes:
    """The writes one task put for a checkpoint (the pending writes LangGraph keeps)."""

    checkpoint_id: str
    node: str
    channels: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"kind": "writes", **attrs.asdict(self)}

    def text(self) -> str:
        return f"writes of {self.node} for checkpoint {self.checkpoint_id}: " + (
            ", ".join(self.channels) or "nothing"
        )


@attrs.frozen
class Other:
    """The thread's name event, or a rewrite's intent."""

    kind: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail}

    def text(self) -> str:
        return self.detail


Event = Checkpoint | Writes | Other


def events(store: Store, history: Iterable[tuple[str, Snapshot]]) -> dict[int, Event]:
    """The LangGraph event of each snapshot (by seq) of a thread's task whose event could be
    read; `history` oldest first or newest first."""
    reader = _Reader(store)
    ordered = sorted(history, key=lambda pair: pair[1].seq)
    found = {snapshot.seq: reader.read(snapshot) for _, snapshot in ordered}
    return {seq: reader.finish(event) for seq, event in found.items() if event is not None}


def latest(found: dict[int, Event]) -> Checkpoint | None:
    """The newest checkpoint among `found`, as get_state shows it."""
    checkpoints = [event for _, event in sorted(found.items()) if isinstance(event, Checkpoint)]
    return checkpoints[-1] if checkpoints else None


def node_of(task_path: str) -> str:
    """The node a task path names (`~__pregel_pull, plan` is node plan's run); another kind
    of task (a Send's) is shown by its path."""
    return task_path[len(_PULL) :] if task_path.startswith(_PULL) else task_path or "a task"


class _Reader:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.parts = Parts(store, JsonPlusSerializer())
        self.filled: dict[tuple[str, Any], bool] = {}  # (channel, version): holds a value
        self.writers: dict[str, list[str]] = {}  # checkpoint id -> nodes that wrote for it
        self.interrupts: dict[str, list[str]] = {}  # checkpoint id -> nodes interrupted on it
        self.headers: dict[str, dict[str, Any]] = {}

    def read(self, snapshot: Snapshot) -> Event | None:
        ref = snapshot.transition.result_ref
        if ref is None or not snapshot.transition.step:
            return None
        try:
            tree = self.store.get_tree(TreeRef(ref))
            kind = tree.data["k"]
            header = self.parts.decode(base64.b64decode(tree.data["h"]))
            return self._event(kind, header, tree.refs)
        except (CastoreError, KeyError, TypeError, ValueError, IndexError, binascii.Error):
            return None  # another serializer's bytes, not a saver's log, a damaged tree

    def _event(self, kind: str, header: Any, refs: dict[str, str]) -> Event | None:
        if kind == "m":
            return Other("thread", f"thread {header[0]!r}, namespace {header[1]!r}")
        if kind == "i":
            return Other("rewrite", f"rewrite keeping {len(header['keep'])} checkpoint(s)")
        if kind == "w":
            return self._writes(header)
        if kind == "p":
            return self._put(header, refs)
        return None

    def _writes(self, header: dict[str, Any]) -> Writes:
        node = node_of(header["task_path"])
        checkpoint_id = header["checkpoint_id"]
        channels = tuple(channel for channel, _ in header["writes"])
        if _INTERRUPT in channels:
            self.interrupts.setdefault(checkpoint_id, []).append(node)
        elif _NOT_A_NODES_RUN.isdisjoint(channels):
            self.writers.setdefault(checkpoint_id, []).append(node)
        return Writes(checkpoint_id, node, channels)

    def _put(self, header: dict[str, Any], refs: dict[str, str]) -> Checkpoint:
        checkpoint = header["checkpoint"]
        listed = {name.split(".", 1)[0] for name in refs}
        for i, channel in enumerate(header["channels"]):
            has_value = str(i) in header["inline"] or f"v{i}" in listed
            self.filled[(channel, header["new_versions"][channel])] = has_value
        self.headers[checkpoint["id"]] = header
        metadata = header.get("metadata") or {}
        changed = checkpoint.get("updated_channels") or header["channels"]
        return Checkpoint(
            checkpoint["id"],
            metadata.get("step"),
            metadata.get("source"),
            (),
            tuple(c for c in changed if not c.startswith(_BRANCH)),  # shown as `next`
            self._next(checkpoint),
        )

    def _next(self, checkpoint: dict[str, Any]) -> tuple[str, ...]:
        seen = checkpoint.get("versions_seen") or {}
        triggered = []
        for channel, version in sorted(checkpoint.get("channel_versions", {}).items()):
            if not channel.startswith(_BRANCH) and channel != _START:
                continue
            if not self.filled.get((channel, version)):
                continue  # taken by the node it triggered: LangGraph empties it
            node = channel[len(_BRANCH) :] if channel != _START else _START
            last = seen.get(node, {}).get(channel)
            try:
                fresh = last is None or version > last
            except TypeError:  # versions of two kinds: LangGraph would call it new
                fresh = True
            if fresh:
                triggered.append(node)
        return tuple(triggered)

    def finish(self, event: Event) -> Event:
        """A checkpoint with the writers and interrupts known once every event was read
        (a task's writes may be committed after the checkpoint they lead to)."""
        if not isinstance(event, Checkpoint):
            return event
        parent = self.headers[event.checkpoint_id].get("parent")
        writers = self.writers.get(parent, []) if parent is not None else []
        interrupted = self.interrupts.get(event.checkpoint_id, [])
        return attrs.evolve(
            event,
            written_by=tuple(dict.fromkeys(writers)),
            interrupted=tuple(dict.fromkeys(interrupted)),
        )
