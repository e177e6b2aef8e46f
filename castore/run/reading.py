"""Reading a store's tasks without working on them: the task list, a task's verified chain
and history, and its status from HEAD alone (the reading half of castore.Store, which
inherits it)."""

from __future__ import annotations

from collections.abc import Callable

from castore.chain import sealmark, status
from castore.chain.packwalk import read_pack
from castore.chain.refs import TaskSlots
from castore.chain.status import TaskStatus
from castore.chain.values import Values
from castore.chain.verify import (
    VerifiedChain,
    decode_snapshot,
    verified_head,
    verify_chain,
    verify_head,
)
from castore.errors import FormatVersionError, IntegrityError, TaskNotFoundError, UsageError
from castore.format.digest import hash_bytes
from castore.format.layout import CHAIN_DIR, TASKS_DIR, decode_task_id, slot_name
from castore.format.records import Plan, Snapshot
from castore.run import forget

FIRST_SLOT = slot_name(0)


class Reading(Values):
    """What castore.Store reads of its tasks."""

    _clock: Callable[[], int]

    def status(self, task_id: str, *, verify: bool = False) -> TaskStatus:
        """Where a task stands, from its HEAD alone, trusting the chain below it (a HEAD that
        does not verify is reported in `.error`, not raised). `verify=True` checks the whole
        chain first, as a resume does, and reports any damage in it the same way."""
        try:
            tombstone = forget.tombstone_head(self._slots(task_id)) if verify else None
            if tombstone is not None:
                head = tombstone  # the history below a tombstone may be reclaimed (gc)
            elif verify:
                head = verified_head(self.verify(task_id))
            else:
                head = verify_head(self._head_slots(task_id))
        except (IntegrityError, FormatVersionError) as exc:  # a planted file included
            return status.broken(task_id, exc)
        return status.describe(head, self._clock())

    def _verify_live(
        self,
        slots: TaskSlots,
        expected_plan: tuple[str, Plan] | None = None,
        *,
        keep_tail: bool = False,
    ) -> VerifiedChain:
        """The verified chain of a task that may still be worked on: TaskForgottenError if
        it ends with a tombstone (whose history gc may have reclaimed, breaking the walk).
        `keep_tail`: keep the tail's bytes, for a run that seals."""
        try:
            chain = verify_chain(self.objects, slots, expected_plan, keep_tail=keep_tail)
        except (IntegrityError, TaskNotFoundError):
            forget.refuse_forgotten(slots)
            raise
        if forget.is_tombstone(chain.head):
            raise forget.forgotten_error(slots.task_id, chain.head)
        return chain

    def verify(self, task_id: str) -> VerifiedChain:
        """Verify one task's chain without resuming it (read-only; ChainError if broken)."""
        return verify_chain(self.objects, self._slots(task_id))

    def tasks(self) -> list[str]:
        """Every started task's id, sorted (an interrupted start, without slot 0, is fsck's
        `no-chain` warning, not a task)."""
        try:
            names = self.medium.names(TASKS_DIR)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            try:
                task_id = decode_task_id(name)
            except UsageError:
                continue  # not castore's: fsck reports it
            # From the name decode_task_id checked (status pays for each id once, not thrice).
            # Slot 0 of a long task may be pruned: its sealed mark then says it started.
            task = f"{TASKS_DIR}/{name}"
            if (
                self.medium.exists(f"{task}/{CHAIN_DIR}/{FIRST_SLOT}")
                or sealmark.TaskMarks(self.medium, task_id, task).started()
            ):
                found.append(task_id)
        return sorted(found)

    def history(self, task_id: str) -> list[tuple[str, Snapshot]]:
        """(id, snapshot) for every snapshot of a verified task, newest first: the tail as
        the walk kept it, then each pack's snapshots (its digest was verified by the walk)."""
        chain = verify_chain(self.objects, self._slots(task_id), keep_tail=True)
        found = [(hash_bytes(data), decode_snapshot(data)) for data in reversed(chain.tail)]
        for ref in chain.outcomes.pack_refs:
            pack = read_pack(self.objects, task_id, ref.id)
            found += [
                (hash_bytes(data), decode_snapshot(data)) for data in reversed(pack.inflate())
            ]
        return found

    def _slots(self, task_id: str) -> TaskSlots:
        # One lookup each: absent is fine, a symlink is refused.
        slots = self._head_slots(task_id)
        self.medium.require_dir(slots.chain_key)
        return slots

    def _head_slots(self, task_id: str) -> TaskSlots:
        """`_slots` for a read that starts with HEAD lookup (`verify_head`), whose
        `names_if_small` refuses a chain directory that is not one: one lookup less a task."""
        slots = TaskSlots(self.medium, self.objects, task_id)
        self.medium.require_dir(slots.task_key)
        return slots
