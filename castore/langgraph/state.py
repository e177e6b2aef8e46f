"""One thread namespace as the saver sees it: its log, and an index of what the log holds.

Every event of the log is one tree, its `data` {"k": kind, "h": header}, the header being
LangGraph's serializer's bytes (parts.py's encoding, base64), its parts named by position:
- "m" meta: header (thread_id, checkpoint_ns); the first event of every generation.
- "p" put: header {checkpoint (channel_values removed), metadata, parent, new_versions,
  channels, inline: small values by index}; "v<i>" = the value of channels[i] at its new
  version, or "v<i>.*" a list by element (parts.py); neither and not inline: empty.
- "w" writes: header {checkpoint_id, task_id, task_path, writes: [[channel, idx], ...],
  inline}; "x<i>" = the value of writes[i] ("x<i>.<j>": a list's elements); only the writes
  first-write-wins lets in.
- "i" intent: header {"keep": checkpoint ids}; a rewrite (prune, delete_for_runs) starts by
  committing it, and its copy is the successor of this event's snapshot (generations.py).
Names and ids live in the serializer's bytes, never in a tree's own fields or part names,
so a hostile thread id or channel name is never judged as castore data.
"""

from __future__ import annotations

import base64
from collections.abc import Collection
from typing import Any

from castore import crashpoints
from castore.chain.trees import TreeRef
from castore.errors import ConflictError, TaskExistsError
from castore.format.model import attrs
from castore.langgraph import generations, names
from castore.langgraph.deps import WRITES_IDX_MAP
from castore.langgraph.parts import ListInfo, Parts
from castore.langgraph.threadlog import ThreadLog
from castore.store import Store

WriteKey = tuple[str, int]  # (task_id, idx)
# A channel value whose serialized bytes are at most this goes in its put's header, not an
# object of its own (an object costs its file, two fsyncs and a name in the tree).
INLINE_BYTES = 256


def _elements(refs: dict[str, str], prefix: str) -> tuple[str, ...]:
    """The parts `prefix`0, `prefix`1, ... of a tree, in order: a list stored by element."""
    found: list[str] = []
    while (part := refs.get(f"{prefix}{len(found)}")) is not None:
        found.append(part)
    return tuple(found)


@attrs.frozen
class Inline:
    """A small value kept in its event's header, not an object of its own."""

    value: Any


@attrs.define
class Saved:
    """A checkpoint of the index: its header (decoded) and where its writes are."""

    header: dict[str, Any]
    # (task_id, channel, value: one part, a list's element parts or inline, task_path)
    writes: dict[WriteKey, tuple[str, str, str | tuple[str, ...] | Inline, str]] = attrs.field(
        factory=dict
    )


class ThreadState:
    """The index of one namespace of one thread (its live generation)."""

    def __init__(self, store: Store, parts: Parts, base: str) -> None:
        self.store = store
        self.parts = parts
        self.base = base  # names.task_base(thread_id, ns)
        self.thread_id: str | None = None
        self.checkpoint_ns: str | None = None
        self.log: ThreadLog | None = None
        self.load()

    # -- loading -------------------------------------------------------------------------
    def load(self) -> None:
        """Find the live generation (generations.py: the commit points decide it, nothing
        is written) and index its log."""
        if self.log is not None:
            self.log.close()
        self.log = None
        self._reset()
        self.live = generations.find_live(self.store, self.base)
        self.task, self.log = self.live.task, self.live.log
        if self.log is not None:
            for tree_id in self.log.entries:
                self._apply(tree_id)

    def _reset(self) -> None:
        self.saved: dict[str, Saved] = {}
        self.blobs: dict[tuple[str, Any], str | None] = {}
        self.inline: dict[tuple[str, Any], Any] = {}  # small values kept in a put's header
        self.latest_value: dict[str, str] = {}  # channel -> id of its last stored value

    def _apply(self, tree_id: str) -> None:
        tree = self.store.get_tree(TreeRef(tree_id))
        kind = tree.data.get("k") if isinstance(tree.data, dict) else None
        header = self.parts.decode(base64.b64decode(tree.data["h"]))
        if kind == "m":
            self.thread_id, self.checkpoint_ns = header[0], header[1]
        elif kind == "p":
            self._index_put(tree_id, header, tree.refs)
        elif kind == "w":
            self._index_writes(header, tree.refs)

    def _index_put(self, tree_id: str, header: dict[str, Any], refs: dict[str, str]) -> None:
        versions, inline = header["new_versions"], header["inline"]
        listed = {name.split(".", 1)[0] for name in refs if "." in name}
        for i, channel in enumerate(header["channels"]):
            part = refs.get(f"v{i}") or (f"{tree_id}#v{i}" if f"v{i}" in listed else None)
            key = (channel, versions[channel])
            if str(i) in inline:
                self.inline[key] = inline[str(i)]
            self.blobs[key] = part
            if part is not None:
                self.latest_value[channel] = part
        self.saved[header["checkpoint"]["id"]] = Saved(header)

    def _index_writes(self, header: dict[str, Any], refs: dict[str, str]) -> None:
        saved = self.saved.get(header["checkpoint_id"])
        if saved is None:
            return  # writes of a checkpoint since deleted
        for i, (channel, idx) in enumerate(header["writes"]):
            key = (header["task_id"], idx)
            inline = header["inline"]
            part: str | tuple[str, ...] | Inline
            if str(i) in inline:
                part = Inline(inline[str(i)])
            else:
                part = refs.get(f"x{i}") or _elements(refs, f"x{i}.")
            saved.writes[key] = (header["task_id"], channel, part, header["task_path"])

    # -- writing -------------------------------------------------------------------------
    def append(self, kind: str, header: Any, refs: dict[str, str]) -> str:
        """Commit one event (returns its tree's id); ConflictError if another writer
        appended to this thread."""
        # The header as the serializer's bytes (base64) in the tree's own data: one object
        # (two fsyncs) less per event than a raw part. Vouched like a raw part is: opaque
        # framework bytes, which the secret guard cannot judge (castore.Store.put_raw).
        return self.commit_tree(self.make_tree(kind, header, refs))

    def make_tree(self, kind: str, header: Any, refs: dict[str, str]) -> TreeRef:
        """The event's tree (its header inline, its parts by reference), not committed."""
        data = {"k": kind, "h": base64.b64encode(self.parts.encode(header)).decode("ascii")}
        return self.store.put_tree(refs, data, allow_fields=("$.data.h",))

    def commit_tree(self, tree: TreeRef) -> str:
        """Commit one event's tree to the thread's log; returns its id."""
        self._log().append(tree)
        self._apply(tree.tree)
        return tree.tree

    def copy_event(self, tree_id: str) -> None:
        """Append another namespace's event (same objects): copy_thread."""
        tree = self.store.get_tree(TreeRef(tree_id))
        if isinstance(tree.data, dict) and tree.data.get("k") not in ("m", "i"):
            self._log().append(TreeRef(tree_id))
            self._apply(tree_id)

    def _log(self) -> ThreadLog:
        """The log, started (with its meta event) on the first write of a generation."""
        if self.log is None:
            task = self.task
            try:
                self.log = ThreadLog.create(self.store, task)
            except TaskExistsError as exc:
                # Another worker started this thread after this saver looked.
                raise ConflictError(task, "<none: new thread>", "<another writer's>", 0) from exc
            self.append("m", (self.thread_id, self.checkpoint_ns), {})
        return self.log

    def put(
        self,
        checkpoint: dict[str, Any],
        metadata: Any,
        parent: str | None,
        new_versions: dict[str, Any],
        values: dict[str, Any],
    ) -> None:
        channels = sorted(new_versions)
        refs: dict[str, str] = {}
        inline: dict[str, Any] = {}
        lists: dict[str, ListInfo] = {}
        # Its parts, its tree and the commit's snapshot published together: two flushes for
        # all of them, then the slot's (store.batch; the commit inside the block publishes it).
        with self.parts.batch():
            for i, channel in enumerate(channels):
                if channel not in values:
                    continue
                value = values[channel]
                if type(value) is list and value:
                    info = self.parts.list_refs(value, self.latest_value.get(channel), f"v{i}")
                    lists[f"v{i}"] = info
                    refs.update(info.refs)
                    continue
                body = self.parts.encode(value)
                if len(body) <= INLINE_BYTES:
                    inline[str(i)] = value  # one object less per step for a counter or a flag
                else:
                    refs[f"v{i}"] = self.parts.put_value(value, body)
            header = {
                "checkpoint": checkpoint,
                "metadata": metadata,
                "parent": parent,
                "new_versions": {c: new_versions[c] for c in channels},
                "channels": channels,
                "inline": inline,
            }
            tree = self.commit_tree(self.make_tree("p", header, refs))
        for slot, info in lists.items():
            self.parts.stored_list(tree, slot, info)

    def put_writes(
        self, checkpoint_id: str, writes: list[tuple[str, Any]], task_id: str, task_path: str
    ) -> None:
        saved = self.saved.get(checkpoint_id)
        existing = saved.writes if saved is not None else {}
        kept: dict[WriteKey, tuple[str, Any]] = {}
        for idx, (channel, value) in enumerate(writes):
            key = (task_id, WRITES_IDX_MAP.get(channel, idx))
            # First write wins for ordinary channels; a special one (negative idx) replaces.
            if key[1] >= 0 and key in existing:
                continue
            kept[key] = (channel, value)
        if not kept:
            return  # a retried put_writes: nothing new, nothing committed
        refs: dict[str, str] = {}
        inline: dict[str, Any] = {}
        with self.parts.batch():
            for i, (_, value) in enumerate(kept.values()):
                if type(value) is list and value:
                    # Element by element: the messages a node writes are the ones the next
                    # checkpoint's list holds, stored once for both.
                    for j, item in enumerate(value):
                        refs[f"x{i}.{j}"] = self.parts.put_element(item)
                else:
                    body = self.parts.encode(value)
                    if len(body) <= INLINE_BYTES:
                        inline[str(i)] = value
                    else:
                        refs[f"x{i}"] = self.parts.put_body(body)
            header = {
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "task_path": task_path,
                "writes": [[channel, key[1]] for key, (channel, _) in kept.items()],
                "inline": inline,
            }
            self.commit_tree(self.make_tree("w", header, refs))

    def keep_only(self, keep: list[str], listed: Collection[str] = ()) -> None:
        """Rewrite the namespace as its next generation holding only the checkpoints in
        `keep` (each with every value it reads, and its writes), so gc gives the rest of the
        disk back (prune, delete_for_runs). Commits the intent X into this generation, copies
        into X's successor, then switches: forget(only_if_head=X). Anything else reaching this
        generation's next slot first (a put, another rewrite, a delete) makes it
        ConflictError, the copy abandoned for good; so does a crash before the switch.
        `listed`: a task listing taken before, whose abandoned copies are then forgotten."""
        old = self.log
        if old is None:
            return
        kept = sorted(c for c in keep if c in self.saved)
        events = [event for c in kept for event in self._full_events(self.saved[c])]
        try:
            self.append("i", {"keep": kept}, {})
        except ConflictError:
            self.load()  # another writer appended since this saver read: nothing was copied
            raise
        crashpoints.reach("lgprune.intent")
        intent = old.head_id
        copy = names.successor(self.base, intent)
        try:
            self._copy(copy, events)
            old.forget(
                who=generations.SWITCH_WHO,
                why="LangGraph prune or delete_for_runs",
                only_if_head=intent,
            )
        except BaseException as exc:
            old.close()
            self._abandon(old.task_id, copy, lost=isinstance(exc, ConflictError))
            raise
        crashpoints.reach("lgprune.switched")
        self.load()
        generations.forget_abandoned(self.store, self.base, listed, self.live)

    def _copy(self, task: str, events: list[tuple[str, Any, dict[str, str]]]) -> None:
        """Start generation `task` and append `events` to it (the copy of a rewrite)."""
        self.log, self.task = None, task
        self._reset()
        for number, (kind, header, refs) in enumerate(events):
            self.append(kind, header, refs)
            if number == 0:
                crashpoints.reach("lgprune.copy_started")
        crashpoints.reach("lgprune.copied")

    def _abandon(self, task: str, copy: str, *, lost: bool) -> None:
        """After a rewrite of generation `task` failed: the live generation read again (what
        the commit points say, whatever the rewrite got to), and the copy forgotten if the
        switch was lost (this rewrite alone could switch to it, and gives up)."""
        started = self.log is not None and self.task == copy
        if self.log is not None:
            self.log.close()
        # Until load succeeds, a put finds `task` taken (ConflictError), never the copy.
        self.log, self.task = None, task
        self._reset()
        self.load()
        if lost and started and copy not in (*self.live.ended, self.live.task):
            self.store.forget(
                copy,
                who=generations.DELETE_WHO,
                why="a LangGraph rewrite that lost its switch (the copy was never live)",
                force_in_flight=True,
            )

    def _full_events(self, saved: Saved) -> list[tuple[str, Any, dict[str, str]]]:
        """A put naming every value its checkpoint reads (lists by element), then its writes."""
        versions = saved.header["checkpoint"]["channel_versions"]
        channels = sorted(versions)
        refs: dict[str, str] = {}
        inline: dict[str, Any] = {}
        for i, channel in enumerate(channels):
            key = (channel, versions[channel])
            part = self.blobs.get(key)
            if key in self.inline:
                inline[str(i)] = self.inline[key]
            elif part is not None:
                info = self.parts.list_info(part)
                if info is None:
                    refs[f"v{i}"] = part
                else:
                    refs.update({f"v{i}.e{j}": e for j, e in enumerate(info.elements)})
        header = dict(saved.header)
        header.update(
            new_versions={c: versions[c] for c in channels}, channels=channels, inline=inline
        )
        events: list[tuple[str, Any, dict[str, str]]] = [("p", header, refs)]
        for (task_id, idx), (_, channel, value, task_path) in saved.writes.items():
            write_refs: dict[str, str] = {}
            write_inline: dict[str, Any] = {}
            if isinstance(value, Inline):
                write_inline["0"] = value.value
            elif isinstance(value, tuple):
                write_refs.update({f"x0.{j}": e for j, e in enumerate(value)})
            else:
                write_refs["x0"] = value
            write = {
                "checkpoint_id": saved.header["checkpoint"]["id"],
                "task_id": task_id,
                "task_path": task_path,
                "writes": [[channel, idx]],
                "inline": write_inline,
            }
            events.append(("w", write, write_refs))
        return events

    def forget(self, listed: Collection[str] = ()) -> None:
        """Delete the namespace: its live generation is forgotten, and the next put starts
        a fresh one (generations.py). A generation another saver switched away first is
        followed: its successor is forgotten too. `listed` as for keep_only."""
        self.load()
        while self.log is not None:
            ended = self.log.forget(who=generations.DELETE_WHO, why="LangGraph delete_thread")
            self.load()
            if not ended.already:
                break
        generations.forget_abandoned(self.store, self.base, listed, self.live)

    def moved(self) -> bool:
        return self.log is not None and self.log.moved()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
