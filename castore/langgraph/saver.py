"""`CastoreSaver`: a LangGraph checkpointer whose every `put` is a durable castore commit.

Each (thread_id, checkpoint_ns) is a castore task family (state.py, threadlog.py); channel
values are content-addressed parts shared by every checkpoint and thread that holds them
(parts.py). A second worker on a thread is refused: a saver reads a thread when a run loads
it (`get_tuple` of the latest checkpoint, or any read after another writer appended), and
its next write commits only if nobody appended since; otherwise castore's ConflictError.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from castore.errors import UsageError
from castore.langgraph import names
from castore.langgraph.deps import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    RunnableConfig,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from castore.langgraph.parts import Parts
from castore.langgraph.state import Inline, Saved, ThreadState
from castore.store import Store

T = TypeVar("T")


class CastoreSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a castore store.

    `CastoreSaver(".castore")` opens the store at that path (created if missing);
    `CastoreSaver(store)` uses an open `castore.Store`. Use it as a context manager (sync or
    async), or call `close()`.
    """

    def __init__(
        self, store: Store | str | os.PathLike[str], *, serde: SerializerProtocol | None = None
    ) -> None:
        super().__init__(serde=serde)
        self.store = store if isinstance(store, Store) else Store.open(store, create=True)
        self._parts = Parts(self.store, self.serde)
        self._states: dict[str, ThreadState] = {}
        # LangGraph may call from several threads (the async twins run in a pool): one at a
        # time, since a thread's index and its open castore run are not shareable.
        self._mutex = threading.RLock()
        self._closed = False

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        with self._mutex:
            for state in self._states.values():
                state.close()
            self._states.clear()
            self._closed = True

    def __enter__(self) -> CastoreSaver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> CastoreSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    # -- threads -------------------------------------------------------------------------
    def _state(self, thread_id: str, checkpoint_ns: str, *, fresh: bool) -> ThreadState:
        """The index of a namespace; `fresh`: read it again if another writer appended."""
        if self._closed:
            raise UsageError("this CastoreSaver is closed; make a new one")
        base = names.task_base(str(thread_id), checkpoint_ns)
        state = self._states.get(base)
        if state is None:
            state = self._states[base] = ThreadState(self.store, self._parts, base)
        elif fresh and state.moved():
            state.load()
        if state.thread_id is None:
            state.thread_id, state.checkpoint_ns = str(thread_id), checkpoint_ns
        return state

    def _bases(self, thread_id: str | None) -> builtins.list[str]:
        """Every namespace base in the store (of `thread_id` only, if given)."""
        return sorted(self._namespaces(thread_id))

    def _namespaces(self, thread_id: str | None) -> dict[str, builtins.list[str]]:
        """Every namespace base in the store (of `thread_id` only, if given), each with the
        ids of its tasks (generations) listed now: a rewrite or delete forgets the abandoned
        copies among them (generations.forget_abandoned)."""
        prefix = names.thread_prefix(str(thread_id)) if thread_id is not None else names.PREFIX
        found: dict[str, builtins.list[str]] = {base: [] for base in self._states}
        for task in self.store.tasks():
            if (base := names.base_of(task)) is not None:
                found.setdefault(base, []).append(task)
        return {base: tasks for base, tasks in found.items() if base.startswith(prefix)}

    def _known_state(self, base: str, *, fresh: bool = True) -> ThreadState:
        state = self._states.get(base)
        if state is None:
            state = self._states[base] = ThreadState(self.store, self._parts, base)
        elif fresh and state.moved():
            state.load()
        return state

    # -- reading -------------------------------------------------------------------------
    def _tuple(self, state: ThreadState, checkpoint_id: str, saved: Saved) -> CheckpointTuple:
        header = saved.header
        values = {}
        for channel, version in header["checkpoint"]["channel_versions"].items():
            key = (channel, version)
            part = state.blobs.get(key)
            if key in state.inline:
                values[channel] = copy.deepcopy(state.inline[key])
            elif part is not None:
                values[channel] = self._parts.get_value(part)
        # Copies: LangGraph changes what get_tuple returns, and the index must not change.
        checkpoint = copy.deepcopy(header["checkpoint"])
        checkpoint["channel_values"] = values
        writes = sorted(saved.writes.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        parent = header["parent"]
        return CheckpointTuple(
            config=self._config(state, checkpoint_id),
            checkpoint=checkpoint,
            metadata=copy.deepcopy(header["metadata"]),
            parent_config=self._config(state, parent) if parent else None,
            pending_writes=[
                (
                    task_id,
                    channel,
                    copy.deepcopy(part.value)
                    if isinstance(part, Inline)
                    else self._parts.get_value(part),
                )
                for _, (task_id, channel, part, _path) in writes
            ],
        )

    @staticmethod
    def _config(state: ThreadState, checkpoint_id: str) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": state.thread_id,
                "checkpoint_ns": state.checkpoint_ns or "",
                "checkpoint_id": checkpoint_id,
            }
        }

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (its checkpoint_id), else the thread's latest."""
        configurable = config["configurable"]
        with self._mutex:
            state = self._state(
                configurable["thread_id"], configurable.get("checkpoint_ns", ""), fresh=True
            )
            checkpoint_id = get_checkpoint_id(config)
            if checkpoint_id is None:
                if not state.saved:
                    return None
                checkpoint_id = max(state.saved)
            saved = state.saved.get(checkpoint_id)
            return self._tuple(state, checkpoint_id, saved) if saved is not None else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first per namespace, filtered by metadata, before a checkpoint."""
        return iter(self._list(config, filter, before, limit))

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> builtins.list[CheckpointTuple]:
        configurable = config["configurable"] if config else {}
        thread_id = configurable.get("thread_id")
        ns = configurable.get("checkpoint_ns")
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        found: builtins.list[CheckpointTuple] = []
        with self._mutex:
            if thread_id is not None and ns is not None:
                bases = [names.task_base(str(thread_id), ns)]
            else:
                bases = self._bases(thread_id)
            for base in bases:
                state = self._known_state(base)
                if state.log is None and not state.saved:
                    continue
                for checkpoint_id in sorted(state.saved, reverse=True):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    if before_id and checkpoint_id >= before_id:
                        continue
                    saved = state.saved[checkpoint_id]
                    metadata = saved.header["metadata"]
                    if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                    if limit is not None and len(found) >= limit:
                        return found
                    found.append(self._tuple(state, checkpoint_id, saved))
        return found

    # -- writing -------------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Commit a checkpoint; durable when this returns. ConflictError if another worker
        wrote to this thread since this saver read it."""
        configurable = config["configurable"]
        thread_id, ns = configurable["thread_id"], configurable.get("checkpoint_ns", "")
        stored: dict[str, Any] = dict(checkpoint)
        values = stored.pop("channel_values")
        with self._mutex:
            state = self._state(thread_id, ns, fresh=False)
            state.put(
                stored,
                get_checkpoint_metadata(config, metadata),
                configurable.get("checkpoint_id"),
                dict(new_versions),
                values,
            )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Commit a task's writes for a checkpoint (first write wins per (task, idx), a
        special channel replaces); a repeat that adds nothing commits nothing."""
        configurable = config["configurable"]
        with self._mutex:
            state = self._state(
                configurable["thread_id"], configurable.get("checkpoint_ns", ""), fresh=False
            )
            state.put_writes(configurable["checkpoint_id"], list(writes), task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Forget every namespace of the thread (castore forget: gc reclaims what only it
        held); the thread id can be used again, as a new generation."""
        with self._mutex:
            for base, listed in sorted(self._namespaces(thread_id).items()):
                self._known_state(base, fresh=False).forget(listed)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata names one of `run_ids`, in every thread:
        each namespace holding one is rewritten without them, the old one forgotten (gc
        gives the bytes back)."""
        wanted = set(run_ids)
        if not wanted:
            return
        with self._mutex:
            for base, listed in sorted(self._namespaces(None).items()):
                state = self._known_state(base)
                kept = [
                    checkpoint_id
                    for checkpoint_id, saved in state.saved.items()
                    if saved.header["metadata"].get("run_id") not in wanted
                ]
                if len(kept) < len(state.saved):
                    state.keep_only(kept, listed)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace of a thread to another: its events again, naming the same
        objects (nothing stored twice)."""
        with self._mutex:
            for base in self._bases(source_thread_id):
                source = self._known_state(base)
                if source.log is None:
                    continue
                target = self._state(target_thread_id, source.checkpoint_ns or "", fresh=True)
                for tree_id in source.log.entries:
                    target.copy_event(tree_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: only each namespace's latest checkpoint (and its writes) stays, in
        a new generation; the old one is forgotten, so gc gives the rest back. `delete`: as
        delete_thread."""
        if strategy not in ("keep_latest", "delete"):
            raise UsageError(f"unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        with self._mutex:
            for thread_id in thread_ids:
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                for base, listed in sorted(self._namespaces(thread_id).items()):
                    state = self._known_state(base)
                    if len(state.saved) > 1:
                        state.keep_only([max(state.saved)], listed)

    # -- async twins: the same work in a worker thread, never on the event loop ----------
    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self._run(self._list, config, filter, before, limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._run(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(self.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A zero-padded counter (versions compare as strings), then a random tie-break so two
        branches of one thread never share a (channel, version) key. Shorter than
        InMemorySaver's 49 characters: every checkpoint stores each version several times."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:016}.{secrets.token_hex(4)}"
