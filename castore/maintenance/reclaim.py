"""gc's reclaim of forgotten tasks (format v2): their history goes, their tombstone stays.

For a task whose HEAD is a tombstone at seq F, gc:

1. flushes the chain directory (an fsync on POSIX), so that the tombstone's slot is durable
   before anything relies on it (its forget may have been killed between its link and its
   fsync);
2. moves the task's sealed mark to {"pack": null, "through": F - 1} unless it is there already
   (the next generation, an exclusive create: sealmark.py); crash point `reclaim.marked`;
3. removes the slots below F and their snapshot objects (TaskSlots.prune); crash point
   `reclaim.pruned`.

From step 2 on, a stale writer of the forgotten task that links a slot at or below F - 1
(one the prune freed) reads the mark after its link, finds its seq covered, removes its
slot and gets ConflictError (refs.py); one at F or above finds the tombstone's slot or
breaks nothing the tombstone leaves (history.py: nothing follows a tombstone). The objects
only the pruned slots named are then unnamed, and gc's ordinary handshake removes them once
they are older than the grace period. The plan the tombstone names stays (its parent
snapshot went with the prune: nothing walks below a tombstone), as does everything another
task still names: a fork's outcomes tree
names its results itself. A crash at any step leaves a state the next gc completes: the
mark without the prune (step 3 runs again), or a partial prune (the same).
"""

from __future__ import annotations

from castore import crashpoints
from castore.chain.refs import TaskSlots
from castore.chain.sealmark import Mark
from castore.errors import CastoreError
from castore.run.forget import tombstone_head
from castore.store import Store


def reclaim_forgotten(store: Store, *, dry_run: bool = False) -> list[str]:
    """Reclaim the history of every forgotten task of a format-2 store (see the module
    docstring); the tasks reclaimed now (or, in a dry run, that would be): a task reclaimed
    by an earlier gc is not again. A task whose tombstone or mark cannot be read is left
    alone: fsck names what is wrong with it."""
    if store.format_version < 2:
        return []  # a v1 store never gets a mark (V2SPEC V0)
    reclaimed = []
    for task in store.tasks():
        slots = TaskSlots(store.medium, store.objects, task)
        try:
            through = _to_reclaim(slots)
            if through is None:
                continue
            if not dry_run:
                _reclaim(slots, through)
        except CastoreError:
            continue  # an unreadable tombstone or mark: nothing is pruned on a guess
        reclaimed.append(task)
    return reclaimed


def _to_reclaim(slots: TaskSlots) -> int | None:
    """The `through` of the mark a forgotten task's reclaim moves to and prunes up to (its
    tombstone's seq - 1); None when there is nothing to do: the task is not forgotten, or
    an earlier gc reclaimed it. A mark without a pack is only ever written by a reclaim,
    with the tombstone just above it, so such a task costs the read of its mark alone
    (nothing below it is read again at every gc), plus, where pruning takes slots away
    (POSIX), one listing for what a reclaim killed mid-prune left."""
    mark = slots.mark()
    if mark is not None and mark.pack is None:
        return mark.through if _unpruned(slots, mark.through) else None
    found = tombstone_head(slots)
    if found is None:
        return None
    through = found.head.seq - 1
    if mark is not None and mark.through >= through and not _unpruned(slots, through):
        return None  # reclaimed before
    return through


def _unpruned(slots: TaskSlots, through: int) -> bool:
    """True if a slot at or below `through` is still to be taken away. Never on a medium
    that keeps retired slots (S3): there a prune has nothing to take away."""
    if slots.medium.keeps_retired:
        return False
    return any(seq <= through for seq in slots.present())


def _reclaim(slots: TaskSlots, through: int) -> None:
    slots.medium.flush_dir(slots.chain_key)  # the tombstone durable before the mark relies on it
    slots.marks.advance(Mark(pack=None, through=through))
    crashpoints.reach("reclaim.marked")
    slots.prune(through)
    crashpoints.reach("reclaim.pruned")
