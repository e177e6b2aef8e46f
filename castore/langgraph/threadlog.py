"""An append-only log of trees, one castore task family per LangGraph thread namespace.

The saver needs three things of a thread: append one tree durably (a commit through the
exclusive-create commit point), read back the trees in order, and know whether another
writer appended since. Growing plans (one task, `run.append(step, tree)`) are the natural
home; until they land, a log is a sequence of segment tasks whose fixed plan has SEGMENT
plain steps, each step's result one tree. A segment that is full is followed by the next.
"""

from __future__ import annotations

import os
from functools import cache

from castore.errors import TaskForgottenError, TaskNotFoundError, UsageError
from castore.layout import CHAIN_DIR, slot_name
from castore.records import Plan
from castore.run import Run
from castore.store import Store
from castore.trees import TreeRef

SEGMENT = 128  # steps per segment task: its plan object (one, shared by all) stays ~6 KB
# Seal a log this often: a snapshot (~600 bytes) outweighs a LangGraph step's new data, and a
# pack holds the sealed ones zlib-compressed, so the slots of a long thread cost a fraction.
SEAL_EVERY = 64
_PLAN_NAME = "castore-langgraph-log"


@cache
def segment_plan() -> Plan:
    return Plan.build(_PLAN_NAME, *(f"e{i}" for i in range(SEGMENT)))


def _segment_task(task_id: str, segment: int) -> str:
    return f"{task_id}_s{segment}"


class ThreadLog:
    """The log of one task family; `open` returns None if it was never started, raises
    TaskForgottenError if it was deleted. Not thread-safe: the saver serialises calls."""

    def __init__(self, store: Store, task_id: str) -> None:
        self.store = store
        self.task_id = task_id
        self._run: Run | None = None  # the last segment's run, the only one appended to
        self._segment = 0
        self._entries: list[str] = []

    @classmethod
    def open(cls, store: Store, task_id: str) -> ThreadLog | None:
        log = cls(store, task_id)
        return log if log._load() else None

    @classmethod
    def create(cls, store: Store, task_id: str) -> ThreadLog:
        log = cls(store, task_id)
        if not log._load():
            # lock_timeout=None: no local lock held for the log's lifetime; two writers are
            # kept apart by the commit point alone (the loser gets ConflictError).
            log._run = store.start(_segment_task(task_id, 0), segment_plan(), lock_timeout=None)
        return log

    def _load(self) -> bool:
        """Read every segment; keep the last one's run. False if segment 0 does not exist."""
        self.close()
        self._entries, segment = [], 0
        while True:
            try:
                run = self.store.resume(
                    _segment_task(self.task_id, segment), segment_plan(), lock_timeout=None
                )
            except TaskNotFoundError:
                if segment == 0:
                    return False
                break
            except TaskForgottenError:
                if segment == 0:
                    raise
                break  # a delete that a crash interrupted after segment 0's tombstone
            index = run.head.frontier.index if not run.finished else SEGMENT
            for i in range(index):
                ref = run.outcome(f"e{i}").result_ref
                if ref is None:
                    raise UsageError(
                        f"task {run.task_id!r} step e{i} records no tree: it is not a "
                        "castore.langgraph log; use another store or thread id"
                    )
                self._entries.append(ref)
            if self._run is not None:
                self._run.close()
            self._run, self._segment = run, segment
            if not run.finished:
                break
            segment += 1
        return True

    def reload(self) -> None:
        if not self._load():
            raise TaskNotFoundError(self.task_id)

    @property
    def entries(self) -> list[str]:
        """The tree ids appended so far, oldest first."""
        return self._entries

    def moved(self) -> bool:
        """True if another writer appended after what this log read (one lstat)."""
        run = self._run
        if run is None:
            return False
        if run.finished:
            task, seq = _segment_task(self.task_id, self._segment + 1), 0
        else:
            task, seq = run.task_id, run.head.seq + 1
        chain = os.path.join(self.store.layout.task_dir(task), CHAIN_DIR)
        return os.path.lexists(os.path.join(chain, slot_name(seq)))

    def append(self, tree: TreeRef) -> None:
        """Commit `tree` as the next entry: durable when this returns. ConflictError if
        another writer appended first (nothing of this entry was committed)."""
        run = self._run
        if run is None:
            raise UsageError(f"the log of {self.task_id!r} is closed")
        if run.finished:
            nxt = self.store.start(
                _segment_task(self.task_id, self._segment + 1), segment_plan(), lock_timeout=None
            )
            run.close()
            self._run, self._segment, run = nxt, self._segment + 1, nxt
        run.commit_step(f"e{run.head.frontier.index}", tree)
        self._entries.append(tree.tree)
        if run.head.seq % SEAL_EVERY == 0 and not run.finished:
            run.seal_now()

    def forget(self, *, why: str) -> None:
        """End the log for good: segment 0's tombstone first (from then on the log reads as
        deleted), then the others', so gc reclaims all of it."""
        last = self._segment
        self.close()
        for segment in range(last + 1):
            self.store.forget(
                _segment_task(self.task_id, segment),
                who="castore.langgraph",
                why=why,
                force_in_flight=True,
            )

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
