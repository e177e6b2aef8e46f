"""Which generation of a LangGraph namespace is live, decided by what the commit points
recorded: every reader finds the same one, so none has anything to repair or write.

A namespace's generations form one chain from `<base>_g0`. A generation is live until its
task is forgotten; its tombstone (castore's commit point: final, and kept by gc's reclaim)
names the next one by its `who`:
- SWITCH_WHO, a rewrite's switch (prune, delete_for_runs): the successor of the tombstone's
  parent. The rewrite committed that parent, its intent event, before it copied what it keeps
  into that successor, and switches with `forget(only_if_head=intent)`: the copy becomes live
  by this one commit or never.
- LEGACY_WHO on `<base>_g<n>` (the saver before this rule): `<base>_g<n+1>`.
- anything else (delete_thread, a user's `castore forget`): the successor of the tombstone
  itself, a task nobody can have written before that tombstone existed.
The first generation of the chain that is not forgotten is live (one never started is empty:
the next put starts it, and two first puts meet at its slot 0). docs/FORMAT.md, appendix D.
"""

from __future__ import annotations

from collections.abc import Iterable

from castore.chain.verify import VerifiedHead
from castore.errors import ChainError, TaskForgottenError
from castore.format.model import attrs
from castore.langgraph import names
from castore.langgraph.threadlog import ThreadLog
from castore.run.forget import tombstone_head
from castore.store import Store

SWITCH_WHO = "castore.langgraph switch"
DELETE_WHO = "castore.langgraph delete"
LEGACY_WHO = "castore.langgraph"


@attrs.frozen
class Live:
    """A namespace's live generation, its log (None: never started), and the generations
    that ended before it, oldest first."""

    task: str
    log: ThreadLog | None
    ended: tuple[str, ...]


def find_live(store: Store, base: str) -> Live:
    """Follow the chain of generations from the first (module docstring); reads only."""
    ended: list[str] = []
    task = names.generation(base, 0)
    while True:
        tombstone = _tombstone(store, task)
        if tombstone is None:
            try:
                return Live(task, ThreadLog.open(store, task), tuple(ended))
            except TaskForgottenError:
                tombstone = _tombstone(store, task)  # forgotten since the look above
                if tombstone is None:
                    raise
        ended.append(task)
        task = successor_of(base, task, tombstone)


def successor_of(base: str, task: str, tombstone: VerifiedHead) -> str:
    """The generation that follows `task`, ended by `tombstone` (module docstring)."""
    head = tombstone.head
    who = head.transition.who
    if who == SWITCH_WHO and head.parent is not None:
        return names.successor(base, head.parent)
    number = names.number_of(base, task)
    if who == LEGACY_WHO and number is not None:
        return names.generation(base, number + 1)
    return names.successor(base, tombstone.head_id)


def _tombstone(store: Store, task: str) -> VerifiedHead | None:
    # Store._slots refuses a task or chain directory that is a symlink, as resume does.
    try:
        return tombstone_head(store._slots(task))
    except ChainError:
        return None  # not a tombstone this castore can read: resume names the damage


def forget_abandoned(store: Store, base: str, listed: Iterable[str], live: Live) -> None:
    """Forget the generations of `base` among `listed` (a task listing taken before `live`
    was found) that can never become live. Only writers call this; a copy still being
    written then dies with ConflictError, as its switch would have.

    A successor `<base>_s<X>` existed when listed, so its intent X was committed before
    `live` was read, into a generation live then (a rewrite writes its intent nowhere else),
    so on the chain now. It becomes live only by a switch tombstone right after X: X is then
    HEAD of the live generation, or that tombstone has put it on the chain. A numbered one
    `<base>_g<n>` off the chain follows only a LEGACY_WHO tombstone, which only the old saver
    wrote and only on a numbered generation: once the live one is a successor, none can."""
    keep = {*live.ended, live.task}
    if live.log is not None:
        keep.add(names.successor(base, live.log.head_id))
    past_numbered = names.is_successor(base, live.task)
    for task in listed:
        if task in keep:
            continue
        numbered = names.number_of(base, task) is not None
        abandoned = names.is_successor(base, task) or (past_numbered and numbered)
        if abandoned and _tombstone(store, task) is None:
            store.forget(
                task,
                who=DELETE_WHO,
                why="an abandoned LangGraph rewrite copy (it was never live)",
                force_in_flight=True,
            )
