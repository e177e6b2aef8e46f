"""Sealing (format v2): a task's writer turns the oldest part of its chain into packs, off the
commit's critical path, and prunes the slots the packs made redundant (docs/FORMAT.md 9.5).

The protocol, for a run whose newest anchor is (P0, T0):
1. when SEAL_EVERY snapshots lie past T0, a background thread builds the pack of the oldest
   SEAL_EVERY of them from bytes the run holds (checking every link) and publishes it as an
   object (file fsync, directory fsync): `seal.pack_written`;
2. the run's next commit carries `sealed = (P1, T1)`; once it is durable: `seal.committed`;
3. the thread moves the task's mark to `{"pack": P1, "through": T1}` unless it is there
   already (the next generation, an exclusive create: sealmark.py): `seal.mark_written`;
4. it removes slots <= T1 and their snapshot objects: `seal.pruned`.
A crash before 2 leaves an unreferenced pack (gc removes it after the grace period); after 2
and before 4 the next run of the task finishes 3 and 4 (`Sealer.finish_prune`). A finished
task with sealed history gets one SEAL commit that seals everything before it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from castore import crashpoints
from castore.chain import packs
from castore.chain.objects import ObjectStore
from castore.chain.prune import prune  # callers keep seal.prune
from castore.chain.refs import TaskSlots
from castore.errors import CastoreError, UsageError
from castore.format.model import attrs
from castore.format.records import Sealed, Snapshot

SEAL_EVERY = packs.MAX_SNAPSHOTS


@attrs.frozen
class SealReport:
    """What `seal_task` did: the packs it wrote (oldest first), the anchor HEAD now carries,
    and the SEAL commit's snapshot id (None if the task was sealed already)."""

    task: str
    packs: tuple[str, ...]
    anchor: Sealed | None
    snapshot_id: str | None


def build_packs(
    objects: ObjectStore,
    framed: list[bytes],
    anchor: Sealed | None,
    parent: bytes | None,
    *,
    every: int = SEAL_EVERY,
    records: list[Snapshot | None] | None = None,
) -> tuple[Sealed, list[str]]:
    """Publish packs for `framed` (the snapshots just past `anchor`, oldest first; `parent`
    the bytes of the anchor's last snapshot), at most `every` per pack, chained by prev.
    `records`, if given, runs beside `framed`: the record each was encoded from in this
    process, or None (packs.build). Returns the anchor naming the newest and the ids
    written. Each pack is durable before this returns (inside a batch: before the commit
    that names it links its slot, which publishes the batch first), so a commit may name it."""
    if not framed:
        raise UsageError("nothing to seal")
    written: list[str] = []
    prev = anchor.pack if anchor is not None else None
    through = anchor.through if anchor is not None else -1
    for start in range(0, len(framed), every):
        chunk = framed[start : start + every]
        encoded = records[start : start + every] if records is not None else ()
        # Remembered: the commit that names it holds its bytes, to store it again if a gc
        # removed it meanwhile (refs.py, the gc handshake).
        built = packs.build(chunk, prev=prev, parent=parent, encoded=encoded)
        pack_id = objects.put_framed(built)
        crashpoints.reach("seal.pack_written")
        written.append(pack_id)
        prev, parent, through = pack_id, chunk[-1], through + len(chunk)
    return Sealed(written[-1], through), written


class Sealer:
    """The background thread of one run: builds and publishes packs, then (after the commit
    naming one is durable) writes the mark and prunes. Jobs run in order on one thread; an
    error stops sealing and is kept for the run to raise at close (the chain is intact, only
    not sealed)."""

    def __init__(
        self,
        objects: ObjectStore,
        slots: TaskSlots,
        *,
        tail: tuple[bytes, ...],
        anchor: Sealed | None,
        sealed_last: bytes | None,
        every: int = SEAL_EVERY,
    ) -> None:
        self._objects = objects
        self._slots = slots
        self._every = every
        self._lock = threading.Lock()
        # The snapshots past the anchor, oldest first (HEAD last), and the bytes of the
        # anchor's own last snapshot: all a pack is built from, never read back from disk.
        self._tail = list(tail)
        # Beside the tail: the record of each snapshot this run committed (a pack checks its
        # links on them rather than decoding the bytes again), None for those read at resume.
        self._records: list[Snapshot | None] = [None] * len(self._tail)
        self._anchor = anchor
        self._parent = sealed_last
        self._building = False
        self._ready: Sealed | None = None  # published, no commit names it yet
        self.error: CastoreError | OSError | None = None
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def worth_finishing(self) -> bool:
        """True if a finished task is to be sealed whole: it has sealed history (a pack, named
        or ready), so it is a long task. A task that never reached SEAL_EVERY commits keeps
        its slots, and the history (seq numbers, length) it would have in a v1 store."""
        with self._lock:
            return (self._ready or self._anchor) is not None

    def next_anchor(self) -> Sealed | None:
        """What the next commit carries: a pack published and not named yet, else the anchor."""
        with self._lock:
            return self._ready or self._anchor

    def finish_prune(self) -> None:
        """At resume, when HEAD's anchor is ahead of the mark (a crash between steps 2 and 4):
        make HEAD durable (the mark must never claim more than the durable chain holds), then
        write the mark and prune, in the background like any prune."""
        anchor = self._anchor
        if anchor is None:
            return

        def job() -> None:
            self._slots.medium.flush_dir(self._slots.chain_key)
            prune(self._slots, anchor)

        self._submit(job)

    def committed(self, data: bytes, snapshot: Snapshot) -> None:
        """A commit of the run is durable: `data` its bytes, encoded from `snapshot`."""
        anchor = snapshot.sealed
        with self._lock:
            self._tail.append(data)
            self._records.append(snapshot)
            if anchor is not None and anchor != self._anchor:
                crashpoints.reach("seal.committed")
                self._adopt(anchor)
            if self._building or self._ready is not None or self.error is not None:
                return
            if len(self._tail) < self._every:
                return
            self._building = True
            chunk, records = self._tail[: self._every], self._records[: self._every]
            anchor_now, parent = self._anchor, self._parent
        self._submit(lambda: self._build(chunk, records, anchor_now, parent))

    def _adopt(self, anchor: Sealed) -> None:
        """A durable commit carries `anchor`: what it seals leaves memory and is pruned."""
        first = self._anchor.through + 1 if self._anchor is not None else 0
        count = anchor.through - first + 1
        sealed, self._tail = self._tail[:count], self._tail[count:]
        del self._records[:count]
        self._parent, self._anchor, self._ready = sealed[-1], anchor, None
        # The run committed these bytes: pruning need not read 4,096 slots back to name them.
        known = dict(enumerate(sealed, start=first))
        self._submit(lambda: prune(self._slots, anchor, known))

    def _build(
        self,
        chunk: list[bytes],
        records: list[Snapshot | None],
        anchor: Sealed | None,
        parent: bytes | None,
    ) -> None:
        newest, _ = build_packs(
            self._objects, chunk, anchor, parent, every=self._every, records=records
        )
        with self._lock:
            self._ready, self._building = newest, False

    def seal_all(self) -> tuple[Sealed, list[str]]:
        """Packs for every snapshot of the tail, HEAD included, built in the caller's thread
        once the queued jobs are done: the anchor a SEAL commit after HEAD carries, and the
        packs it relies on (those written for it, and a ready pack no commit named)."""
        self.drain()
        with self._lock:
            if self.error is not None:
                raise self.error
            pending, records = self._tail, self._records
            anchor, parent = self._anchor, self._parent
            unnamed: list[str] = []
            if self._ready is not None:
                # No commit named it yet (_adopt clears it): the SEAL commit relies on it too
                # (its packs' prev reaches it), so a gc that removed it meanwhile finds it
                # stored again after the link (FORMAT.md §9.5 step 2).
                unnamed.append(self._ready.pack)
                offset = self._ready.through - (anchor.through if anchor else -1)
                pending, anchor, parent = pending[offset:], self._ready, pending[offset - 1]
                records = records[offset:]
        if not pending:  # a ready pack holds HEAD already
            if anchor is None:
                raise UsageError(f"task {self._slots.task_id!r}: nothing to seal")
            return anchor, unnamed
        sealed, written = build_packs(
            self._objects, pending, anchor, parent, every=self._every, records=records
        )
        return sealed, [*unnamed, *written]

    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name=f"castore-seal-{self._slots.task_id}", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            crashpoints.wait("seal.idle", lambda: not self._jobs.empty())
            job = self._jobs.get()
            if job is None:
                break
            try:
                if self.error is None:
                    job()
            except (CastoreError, OSError) as exc:  # kept, and raised by the run's close
                with self._lock:
                    self.error, self._building = exc, False
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def drain(self) -> None:
        """Wait until every job queued so far is done."""
        if self._thread is not None:
            crashpoints.wait("seal.drain", lambda: self._jobs.unfinished_tasks == 0)
            self._jobs.join()

    def close(self) -> None:
        """Finish the queued jobs and stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            crashpoints.wait("seal.close", lambda: self._jobs.unfinished_tasks == 0)
            self._thread.join()
            self._thread = None
