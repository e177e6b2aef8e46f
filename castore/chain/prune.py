"""Steps 3 and 4 of sealing (docs/FORMAT.md 9.5): the sealed mark, then the prune of the slots
it makes redundant. Kept apart from the sealer, which only calls it."""

from __future__ import annotations

from collections.abc import Mapping

from castore import crashpoints
from castore.chain import sealmark
from castore.chain.refs import TaskSlots
from castore.format.records import Sealed


def prune(slots: TaskSlots, anchor: Sealed, known: Mapping[int, bytes] | None = None) -> None:
    """Steps 3 and 4 of the protocol, for an anchor a durable commit carries: the mark (only
    ever moved forward, whoever moved it last), then the slots <= its `through` and their
    snapshot objects (`known`: the bytes of some, by seq, which need not be read back)."""
    slots.marks.advance(sealmark.Mark(anchor.pack, anchor.through))
    crashpoints.reach("seal.mark_written")
    slots.prune(anchor.through, known)
    crashpoints.reach("seal.pruned")
