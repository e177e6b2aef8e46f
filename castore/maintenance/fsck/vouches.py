"""Which slots of a chain the next slot vouches for, by naming their bytes as its parent."""

from __future__ import annotations

from castore.format.model import attrs
from castore.format.records import Snapshot


@attrs.define
class Vouches:
    """The walk's record of which slots the next slot names as its parent: those that no
    next slot names go to `doubted` (HEAD is judged on its own, TaskCheck._vouch_head)."""

    doubted: set[int]
    waiting: int | None = None  # the last slot read, until the next one names it

    def broken(self) -> None:
        """The next slot read does not follow the waiting one (a gap, an unreadable slot)."""
        if self.waiting is not None:
            self.doubted.add(self.waiting)
        self.waiting = None

    def read(self, seq: int, snapshot: Snapshot, previous: tuple[str, Snapshot] | None) -> None:
        """Slot `seq` read, `previous` the (id, snapshot) of the slot before it, if read."""
        if self.waiting is not None and (previous is None or snapshot.parent != previous[0]):
            self.doubted.add(self.waiting)
        self.waiting = seq

    def end(self, head: int) -> None:
        """The walk is over: a slot still waiting below HEAD had no readable next slot."""
        if self.waiting != head:
            self.broken()
