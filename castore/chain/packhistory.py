"""A pack's history (format v3): the packs below it, listed in its own header, so that a
resume verifies one pack instead of walking `prev` pack by pack (docs/FORMAT.md 7.5).

A v3 pack's header carries `history`: the plan root, the clock of every older pack merged,
and one entry (id, range, last snapshot id) per older pack, oldest first. Its writer copies
the list from the pack it names as `prev` (a pack it verified or built) and adds that pack's
own entry, so the list is as trusted as the pack's hash: a verified anchor names the pack, the
pack names the rest. `check` is what a reader checks of the list itself (contiguous from 0, and
ending exactly where the pack starts); a `Lineage` is what a writer carries from pack to pack.
"""

from __future__ import annotations

from collections.abc import Callable

from castore.errors import ObjectCorruptError
from castore.format.effects import ChainClock
from castore.format.layout import validate_object_id
from castore.format.model import attrs


@attrs.frozen
class PackEntry:
    """One older pack of a v3 pack's history: its id, its range, its last snapshot's id."""

    id: str
    first_seq: int
    last_seq: int
    last_id: str


@attrs.frozen
class PackHistory:
    """The `history` field of a v3 pack header (docs/FORMAT.md 7.5): `root_plan` names the
    plan of sequence 0; `clock` merges the clocks of the packs in `packs`, newest first, as a
    walk of them would; `packs` are every pack `prev` reaches, oldest first (empty at 0)."""

    root_plan: str
    clock: ChainClock
    packs: tuple[PackEntry, ...]


def merge_clocks(newer: ChainClock, older: ChainClock) -> ChainClock:
    """The clock of two adjacent ranges, as one newest-first walk over both would compute it
    (on a tie the newer range's snapshot is the one named)."""
    clock = newer
    if older.latest_ms is not None and (
        clock.latest_ms is None or older.latest_ms > clock.latest_ms
    ):
        clock = attrs.evolve(clock, latest_ms=older.latest_ms, latest_seq=older.latest_seq)
    if older.backwards_ms > clock.backwards_ms:
        clock = attrs.evolve(
            clock, backwards_ms=older.backwards_ms, backwards_seq=older.backwards_seq
        )
    return clock


def check(
    history: PackHistory,
    *,
    first_seq: int,
    prev: str | None,
    first_parent: str | None,
    corrupt: Callable[[str], ObjectCorruptError],
) -> None:
    """The list holds together and ends where its pack starts; `corrupt(reason)` otherwise."""
    ids = [history.root_plan] + [id_ for e in history.packs for id_ in (e.id, e.last_id)]
    for value in ids:
        try:
            validate_object_id(value)
        except ValueError:
            raise corrupt(f"its history names {value!r}, not an object id") from None
    expected = 0
    for entry in history.packs:
        if entry.first_seq != expected or entry.last_seq < entry.first_seq:
            raise corrupt(
                f"its history lists pack {entry.id} at {entry.first_seq}..{entry.last_seq}, "
                f"where sequence {expected} comes next"
            )
        expected = entry.last_seq + 1
    last = history.packs[-1] if history.packs else None
    if expected != first_seq or (last is not None) != (prev is not None):
        raise corrupt(f"its history ends at sequence {expected - 1}, not {first_seq - 1}")
    if last is not None and (last.id != prev or last.last_id != first_parent):
        raise corrupt(
            f"its history ends with pack {last.id} at snapshot {last.last_id}, not its prev "
            f"{prev} at its first parent {first_parent}"
        )


@attrs.frozen
class Lineage:
    """What a v3 writer carries from one pack to the next: the plan root (None before the
    first pack: the first snapshot's plan), the clock of every pack so far, and their entries."""

    root_plan: str | None = None
    clock: ChainClock = attrs.field(factory=ChainClock)
    packs: tuple[PackEntry, ...] = ()

    def history(self, root_plan: str) -> PackHistory:
        """The `history` of the next pack, whose first snapshot's plan is `root_plan` when the
        lineage has no pack yet."""
        return PackHistory(self.root_plan or root_plan, self.clock, self.packs)

    def after(self, entry: PackEntry, clock: ChainClock, root_plan: str) -> Lineage:
        """The lineage once the pack `entry` (whose own clock is `clock`) is written."""
        return Lineage(
            self.root_plan or root_plan, merge_clocks(clock, self.clock), (*self.packs, entry)
        )
