"""The link rules of a growing plan (format v2): what may happen to `grown` between a snapshot
and its successor. history.illegal_changes applies them, so resume, the sealer and fsck judge
every link alike (docs/FORMAT.md 7.9).

A growing task's plan at HEAD is its base plan plus every step decided since, summed up by
the rolling digest: a link that adds a step without rolling it, rolls it wrong, or changes
`grown` on a commit that decides nothing would let a resumed agent replay a plan that is not
the one recorded.
"""

from __future__ import annotations

from castore.format.plans import roll_digest
from castore.format.records import Grown, Snapshot, Step, Transition, TransitionKind

_DECIDING = (TransitionKind.DECIDE, TransitionKind.STEP)
_AFTER_FINISH = (TransitionKind.SEAL, TransitionKind.FORGET)


def growth_changes(parent: Snapshot, child: Snapshot) -> list[str]:
    """Every way `grown` changes from `parent` to `child` that the format forbids; [] if none.
    Accepts fsck's snapshot views (it reads attributes only)."""
    old, new, transition = parent.grown, child.grown, child.transition
    kind, decided = transition.kind, transition.decided
    if old is None or new is None:
        return _fixed_changes(old, new, transition)
    if old.finished:
        if kind not in _AFTER_FINISH or not _same(old, new):
            return [f"a {kind!s}-kind transition after the task finished: only seal or forget"]
        return []
    if kind is TransitionKind.FINISH:
        return _finish_changes(parent, child, old, new)
    if decided is not None:
        return _decide_changes(parent, child, old, new, decided)
    problems = []
    if kind is TransitionKind.DECIDE:
        problems.append("a decide-kind transition that names no decided step")
    if not _same(old, new):
        problems.append(f"grown changes on a {kind!s}-kind transition, which decides no step")
    same_index = child.frontier.index == parent.frontier.index
    if same_index and child.frontier.step != parent.frontier.step:
        problems.append(
            f"the frontier step changes without a decision ({parent.frontier.step!r} -> "
            f"{child.frontier.step!r})"
        )
    return problems


def _fixed_changes(old: Grown | None, new: Grown | None, transition: Transition) -> list[str]:
    """A task whose plan does not grow (at either end of the link) decides nothing."""
    if old is not None or new is not None:
        return ["grown appears or vanishes: a task's plan grows from its start or never"]
    kind = transition.kind
    if kind in (TransitionKind.DECIDE, TransitionKind.FINISH) or transition.decided is not None:
        return [f"a {kind!s}-kind transition in a task whose plan does not grow"]
    return []


def _same(old: Grown, new: Grown) -> bool:
    return (old.steps, old.digest, old.finished) == (new.steps, new.digest, new.finished)


def _finish_changes(parent: Snapshot, child: Snapshot, old: Grown, new: Grown) -> list[str]:
    transition = child.transition
    problems = []
    if (new.steps, new.digest, new.finished) != (old.steps, old.digest, True):
        problems.append("a finish-kind transition must keep grown and set finished")
    if parent.frontier.step is not None or child.frontier != parent.frontier:
        problems.append(f"finish while step {parent.frontier.step!r} is not done")
    if parent.effects or child.effects:
        problems.append("finish while an effect is open")
    if transition.step is not None or transition.decided is not None:
        problems.append("a finish-kind transition names a step")
    return problems


def _decide_changes(
    parent: Snapshot, child: Snapshot, old: Grown, new: Grown, decided: Step
) -> list[str]:
    transition = child.transition
    problems = []
    if transition.kind not in _DECIDING:
        problems.append(f"a {transition.kind!s}-kind transition decides a step")
    rolled = roll_digest(old.digest, decided, transition.args)
    if (new.steps, new.digest, new.finished) != (old.steps + 1, rolled, False):
        problems.append(
            f"deciding {decided.id!r} must roll grown to {old.steps + 1} steps, digest "
            f"{rolled[:16]}; the snapshot says {new.steps}, {new.digest[:16]}"
        )
    if parent.frontier.step is not None:
        problems.append(f"{decided.id!r} decided while {parent.frontier.step!r} is not done")
    if transition.step != decided.id or decided.after:
        problems.append(f"the decided step {decided.id!r} is not the step the transition names")
    if transition.kind is TransitionKind.DECIDE:
        if child.frontier.index != parent.frontier.index or child.frontier.step != decided.id:
            problems.append(f"deciding {decided.id!r} must move the frontier to it")
        if any(r.step == decided.id for r in child.effects) != decided.effect:
            problems.append(f"{decided.id!r}: an effect is decided with its PLANNED record")
    elif decided.effect:
        problems.append(f"{decided.id!r}: an effect is decided and recorded in one step")
    return problems


def frontier_problems(
    steps: tuple[str, ...], effects: frozenset[str], grows: bool, snapshot: Snapshot
) -> list[str]:
    """What is wrong with the frontier and effect records of `snapshot` of a task whose plan
    has base `steps` (effect steps `effects`) and grows if `grows` (S4, S6 for growing plans;
    a fixed plan's snapshot is the caller's to judge). Accepts fsck's views."""
    grown, frontier = snapshot.grown, snapshot.frontier
    if (grown is not None) != grows:
        return ["grown does not match the plan (growing or fixed)"]
    if grown is None:
        return []
    base, index, step = len(steps), frontier.index, frontier.step
    last = base + grown.steps
    decided = index >= base and index == last - 1 and grown.steps > 0 and step is not None
    problems = []
    if not 0 <= index <= last:
        problems.append(f"step index {index} outside 0..{last}")
    elif grown.steps and index < last - 1:
        problems.append(f"step index {index} is behind the {grown.steps} steps decided")
    elif not decided and step != (steps[index] if index < base else None):
        expected = steps[index] if index < base else None
        problems.append(f"step {step!r} at index {index}, the plan has {expected!r}")
    for record in snapshot.effects:
        if decided and record.step == step:
            continue  # the decided effect at the frontier
        if record.step not in effects:
            problems.append(f"effect record for {record.step!r}, not an effect of the plan")
        elif steps.index(record.step) > index:
            problems.append(f"effect {record.step!r} is beyond the frontier")
    return problems
