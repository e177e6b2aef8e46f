"""One task's page, read: its status, its chain as a timeline, its plan, its brief and the
`castore resolve` commands a person may run (pure reading; never writes)."""

from __future__ import annotations

import shlex
import time

from castore.chain.planread import read_plan
from castore.chain.status import TaskStatus
from castore.errors import CastoreError
from castore.format.model import attrs
from castore.format.records import EffectState, Plan, Snapshot, TransitionKind
from castore.store import Store
from castore.ui import lgview

TIMELINE_MAX = 200  # newest snapshots shown unless the page asks for all
OPEN_STATES = frozenset({EffectState.SUBMITTED.value, EffectState.UNRESOLVED.value})


@attrs.frozen
class Entry:
    """One snapshot of the timeline, as the page shows it."""

    seq: int
    snapshot_id: str
    when: str
    kind: str
    step: str | None
    effect: str | None  # "SUBMITTED -> UNRESOLVED", for an effect's or a person's transition
    state: str | None  # the state the effect is in after it (CONFIRMED, UNRESOLVED, ...)
    key: str | None
    receipt: str | None
    result_ref: str | None
    who: str | None
    why: str | None
    node: str | None = None  # a LangGraph thread's: what this entry of its log holds


@attrs.frozen
class PlanStep:
    id: str
    effect: bool
    mark: str  # done, next, open (an effect in flight), or "" (not reached)


@attrs.frozen
class Command:
    """A `castore resolve` a person may run for one open effect."""

    step: str
    state: str
    key: str | None
    confirmed: str
    not_done: str


@attrs.frozen
class TaskView:
    status: TaskStatus
    timeline: tuple[Entry, ...] = ()
    total: int = 0  # snapshots in the chain (the timeline may show only the newest)
    plan_name: str | None = None
    plan: tuple[PlanStep, ...] = ()
    grows: bool = False
    brief: str | None = None
    commands: tuple[Command, ...] = ()
    problems: tuple[str, ...] = ()  # what could not be read, each as castore said it
    thread: lgview.Thread | None = None


def read_task(
    store: Store, task: str, status: TaskStatus, *, store_arg: str | None, everything: bool = False
) -> TaskView:
    """The page of task `task` whose status is `status` (read by the caller first, so that a
    task that is not there is refused before anything else is read). `store_arg`: the
    --store the commands name (None: the default store)."""
    problems: list[str] = []
    history: list[tuple[str, Snapshot]] = []
    try:
        history = store.history(task)
    except CastoreError as exc:
        problems.append(f"the chain does not verify: {exc}")
    timeline = _timeline(history, None if everything else TIMELINE_MAX)
    plan: Plan | None = None
    if history:
        try:
            plan = read_plan(store.objects, task, history[0][1].plan)
        except CastoreError as exc:
            problems.append(f"its plan cannot be read: {exc}")
    brief = None
    try:
        brief = store.brief(task).text
    except CastoreError as exc:
        problems.append(f"no brief: {exc}")
    thread = None
    if task.startswith(lgview.PREFIX) and history:
        thread, note = lgview.read_thread(store, history)
        if note:
            problems.append(note)
        if thread is not None:
            timeline = tuple(attrs.evolve(e, node=thread.nodes.get(e.seq)) for e in timeline)
    return TaskView(
        status=status,
        timeline=timeline,
        total=len(history),
        plan_name=plan.name if plan is not None else None,
        plan=_plan_steps(plan, status, history) if plan is not None else (),
        grows=bool(plan is not None and plan.grows),
        brief=brief,
        commands=commands(task, status, store_arg),
        problems=tuple(problems),
        thread=thread,
    )


def _timeline(history: list[tuple[str, Snapshot]], limit: int | None) -> tuple[Entry, ...]:
    keys: dict[str, str | None] = {}  # each effect's key, from the records that carry it
    entries = []
    for snapshot_id, snapshot in reversed(history):  # oldest first: a key is known by then
        for record in snapshot.effects:
            keys[record.step] = record.key
        entries.append(_entry(snapshot_id, snapshot, keys))
    entries.reverse()
    return tuple(entries if limit is None else entries[:limit])


def _entry(snapshot_id: str, snapshot: Snapshot, keys: dict[str, str | None]) -> Entry:
    t = snapshot.transition
    moved = None
    if t.effect_from is not None or t.effect_to is not None:
        before = t.effect_from.value if t.effect_from else "-"
        moved = f"{before} -> {t.effect_to.value if t.effect_to else '-'}"
    step = t.step or (t.decided.id if t.decided is not None else None)
    is_effect = t.kind in (TransitionKind.EFFECT, TransitionKind.RESOLVE)
    return Entry(
        seq=snapshot.seq,
        snapshot_id=snapshot_id,
        when=time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(snapshot.time_ms / 1000)),
        kind=t.kind.value,
        step=step,
        effect=moved,
        state=t.effect_to.value if t.effect_to is not None else None,
        key=keys.get(step) if is_effect and step is not None else None,
        receipt=t.receipt,
        result_ref=t.result_ref,
        who=t.who,
        why=t.why,
    )


def _plan_steps(
    plan: Plan, status: TaskStatus, history: list[tuple[str, Snapshot]]
) -> tuple[PlanStep, ...]:
    ids = [(step.id, step.effect) for step in plan.steps]
    if plan.grows:  # the steps decided as it ran, in order, after the base plan's
        known = {step_id for step_id, _ in ids}
        for _, snapshot in reversed(history):
            decided = snapshot.transition.decided
            if decided is not None and decided.id not in known:
                known.add(decided.id)
                ids.append((decided.id, decided.effect))
    head = history[0][1] if history else None
    done = head.frontier.index if head is not None and head.grown is None else None
    open_steps = {effect.step for effect in status.effects}
    marked = []
    for index, (step_id, effect) in enumerate(ids):
        if step_id in open_steps:
            mark = "open"
        elif step_id == status.step and not status.finished:
            mark = "next"
        elif (done is not None and index < done) or (done is None and _reached(index, ids, status)):
            mark = "done"
        else:
            mark = ""
        marked.append(PlanStep(step_id, effect, mark))
    return tuple(marked)


def _reached(index: int, ids: list[tuple[str, bool]], status: TaskStatus) -> bool:
    """In a growing plan, every step before the one the task is at is done."""
    if status.finished:
        return True
    at = next((i for i, (step_id, _) in enumerate(ids) if step_id == status.step), len(ids))
    return index < at


def commands(task: str, status: TaskStatus, store_arg: str | None) -> tuple[Command, ...]:
    """The `castore resolve` commands of each effect in flight (SUBMITTED or UNRESOLVED)."""
    start = "castore" + (f" --store {shlex.quote(store_arg)}" if store_arg else "")
    found = []
    for effect in status.effects:
        if effect.state not in OPEN_STATES:
            continue
        resolve = f"{start} resolve {shlex.quote(task)} {shlex.quote(effect.step)}"
        found.append(
            Command(
                effect.step,
                effect.state,
                effect.key,
                f"{resolve} --confirmed RECEIPT",
                f"{resolve} --not-done --reason TEXT",
            )
        )
    return tuple(found)
