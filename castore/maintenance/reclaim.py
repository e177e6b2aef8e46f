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
    docstring); the tasks reclaimed now (or, in a dry run, that would be). A task whose
    tombstone or mark cannot be read is left alone: fsck names what is wrong with it."""
    if store.format_version < 2:
        return []  # a v1 store never gets a mark (V2SPEC V0)
    reclaimed = []
    for task in store.tasks():
        slots = TaskSlots(store.medium, store.objects, task)
        try:
            found = tombstone_head(slots)
            if found is None:
                continue
            through = found.head.seq - 1
            mark = slots.mark()
            stale = [seq for seq in slots.present() if seq <= through]
            if mark is not None and mark.through >= through and not stale:
                continue  # reclaimed before
            if not dry_run:
                _reclaim(slots, through)
        except CastoreError:
            continue  # an unreadable tombstone or mark: nothing is pruned on a guess
        reclaimed.append(task)
    return reclaimed


def _reclaim(slots: TaskSlots, through: int) -> None:
    slots.medium.flush_dir(slots.chain_key)  # the tombstone durable before the mark relies on it
    slots.marks.advance(Mark(pack=None, through=through))
    crashpoints.reach("reclaim.marked")
    slots.prune(through)
    crashpoints.reach("reclaim.pruned")
