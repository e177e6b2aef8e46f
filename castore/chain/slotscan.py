"""A task's chain directory as a verifier reads it: HEAD's slot, and the slots from the lowest
kept to HEAD checked for gaps (docs/FORMAT.md 11.2, steps 2 and 3)."""

from __future__ import annotations

from castore.chain.refs import TaskSlots
from castore.errors import (
    CastoreError,
    ChainError,
    FormatVersionError,
    StoreIOError,
    TaskNotFoundError,
)
from castore.format import codec, layout
from castore.format.layout import missing_seqs


def check_head_frame(slots: TaskSlots, data: bytes, seq: int) -> None:
    """A HEAD slot whose own bytes are not a whole object (truncated, emptied) is said to be
    so: its hash names no object, which would otherwise read as a missing object."""
    try:
        codec.unframe(data, "")
    # The slot's path only now: status checks thousands of HEADs that are whole.
    except FormatVersionError as exc:
        raise FormatVersionError(slots.path(seq), exc.found, exc.supported) from None
    except codec.FrameError as exc:
        raise ChainError(
            slots.task_id, f"HEAD slot {seq} is damaged: {exc.reason}", slots.path(seq), seq=seq
        ) from None


def head_and_contiguous(slots: TaskSlots, low: int) -> tuple[int, bytes]:
    """`read_head_slot`, with the slots from `low` (0, or above the sealed mark) to HEAD
    checked for gaps (`check_contiguous`). Where a listing that starts at `low` is one
    request and every lookup another (S3, whose chain keeps every slot ever committed), HEAD
    is the last of one such listing with no gap; any gap, or no slot `low`, and the search
    and the check below decide, as they do elsewhere."""
    if not slots.medium.aliases:
        after = layout.slot_name(low - 1) if low > 0 else ""
        listed = sorted(
            seq
            for seq in map(layout.parse_slot_name, slots.medium.names_after(slots.chain_key, after))
            if seq is not None and seq >= low
        )
        if listed and listed == list(range(low, low + len(listed))):
            return read_head_slot(slots, listed[-1])
    head_seq, slot_data = read_head_slot(slots)
    check_contiguous(slots, head_seq, low)
    return head_seq, slot_data


def read_head_slot(slots: TaskSlots, head_seq: int | None = None) -> tuple[int, bytes]:
    """HEAD's sequence number (§9.4; `head_seq` if the caller found it) and the bytes of its
    slot; TaskNotFoundError without slot 0, ChainError if the slot cannot be read or is not a
    whole object."""
    if head_seq is None:
        head_seq = slots.head_seq()
    if head_seq is None:
        raise TaskNotFoundError(slots.task_id)
    try:
        slot_data = slots.read(head_seq)
    except StoreIOError:
        raise  # the system could not read it: not a broken chain (and no backup to restore)
    except (OSError, CastoreError) as exc:
        raise ChainError(
            slots.task_id,
            f"HEAD slot {head_seq} unreadable: {exc}",
            slots.path(head_seq),
            seq=head_seq,
        ) from exc
    check_head_frame(slots, slot_data, head_seq)
    return head_seq, slot_data


def check_contiguous(slots: TaskSlots, head_seq: int, low: int) -> None:
    """Slots from the lowest kept (`low`: 0, or above the sealed mark) to HEAD, no gap,
    nothing beyond. HEAD lookup is a binary search that trusts this; a deleted middle slot
    would otherwise roll HEAD back and let a second successor commit."""
    present = [seq for seq in slots.present() if seq >= low]  # sorted
    count, missing = missing_seqs([seq - low for seq in present], head_seq - low, shown=5)
    missing = [seq + low for seq in missing]
    beyond = max(present, default=0) > head_seq + 1
    # A commit racing this walk may add slots past HEAD (a listing may even show head+2
    # before head+1); only a slot still missing below a present one is damage.
    if beyond and not count and not slots.exists(head_seq + 1):
        count, missing = 1, [head_seq + 1]
    if count:
        raise ChainError(
            slots.task_id,
            f"chain slots are not contiguous: {len(present)} slots up to "
            f"{max(present, default=head_seq)}, "
            f"missing {missing}{'...' if count > 5 else ''}",
            slots.directory,
        )
