"""An append-only log of trees: one castore task with a growing plan per LangGraph thread
namespace (and generation), each entry a step `e<n>` whose result is the entry's tree.

The saver needs three things of a thread: append one tree durably (`run.append`: one commit
through the exclusive-create commit point), read back the trees in order, and know whether
another writer appended since (one lstat of the next slot).
"""

from __future__ import annotations

from castore.chain.trees import TreeRef
from castore.errors import TaskNotFoundError, UsageError
from castore.format.layout import chain_key, slot_name
from castore.format.records import Plan
from castore.run.forget import Forgotten
from castore.run.run import Run
from castore.store import Store

_PLAN = Plan.grow("castore-langgraph-log")
# Seal a log this often: a snapshot (~600 bytes) outweighs a LangGraph step's new data, and a
# pack holds the sealed ones zlib-compressed, so the slots of a long thread cost a fraction.
SEAL_EVERY = 64


class ThreadLog:
    """The log of one task; `open` returns None if it was never started and raises
    TaskForgottenError if it was deleted. Not thread-safe: the saver serialises calls."""

    def __init__(self, store: Store, task_id: str, run: Run) -> None:
        self.store = store
        self.task_id = task_id
        self._run: Run | None = run
        self._entries: list[str] = []
        for index in range(run.head.grown.steps if run.head.grown is not None else 0):
            step = f"e{index}"
            run.at(step)  # the replay cursor to the end: the next append is a new position
            ref = run.outcome(step).result_ref
            if ref is None:
                raise UsageError(
                    f"task {task_id!r} step {step} records no tree: it is not a "
                    "castore.langgraph log; use another store or thread id"
                )
            self._entries.append(ref)

    @classmethod
    def open(cls, store: Store, task_id: str) -> ThreadLog | None:
        # lock_timeout=None: no local lock held for the log's lifetime; two writers are
        # kept apart by the commit point alone (the loser gets ConflictError).
        try:
            run = store.resume(task_id, _PLAN, lock_timeout=None)
        except TaskNotFoundError:
            return None
        return cls(store, task_id, run)

    @classmethod
    def create(cls, store: Store, task_id: str) -> ThreadLog:
        """Start the log; TaskExistsError if another writer started it first."""
        return cls(store, task_id, store.start(task_id, _PLAN, lock_timeout=None))

    @property
    def entries(self) -> list[str]:
        """The tree ids appended so far, oldest first."""
        return self._entries

    def moved(self) -> bool:
        """True if another writer appended after what this log read (one lstat)."""
        run = self._run
        if run is None:
            return False
        key = f"{chain_key(self.task_id)}/{slot_name(run.head.seq + 1)}"
        return self.store.medium.exists(key)

    def append(self, tree: TreeRef) -> None:
        """Commit `tree` as the next entry: durable when this returns. ConflictError if
        another writer appended first (nothing of this entry was committed)."""
        run = self._run
        if run is None:
            raise UsageError(f"the log of {self.task_id!r} is closed")
        run.append(f"e{len(self._entries)}", tree)
        self._entries.append(tree.tree)
        if run.head.seq % SEAL_EVERY == 0:
            run.seal_now()

    @property
    def head_id(self) -> str:
        """The id of the log's last snapshot as this log knows it."""
        if self._run is None:
            raise UsageError(f"the log of {self.task_id!r} is closed")
        return self._run.head_id

    def forget(self, *, who: str, why: str, only_if_head: str | None = None) -> Forgotten:
        """End the log for good (a tombstone through the commit point); gc reclaims it.
        `who` says which generation follows (generations.py). `only_if_head`: ConflictError
        unless HEAD is still that snapshot."""
        self.close()
        return self.store.forget(
            self.task_id, who=who, why=why, force_in_flight=True, only_if_head=only_if_head
        )

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
