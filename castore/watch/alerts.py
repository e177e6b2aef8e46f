"""What deserves an alert, judged from a task's verified HEAD and the time (pure; no I/O).

`castore.watch` re-reads tasks and diffs the readings this module makes; keeping the
judgement here lets it be tested without threads, clocks or a filesystem.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Literal

from castore.chain.verify import VerifiedHead
from castore.format.effects import effect_action
from castore.format.model import attrs
from castore.format.records import EffectRecord, EffectState

__all__ = [
    "EFFECT_KINDS",
    "TASK_KINDS",
    "Alert",
    "Condition",
    "Ident",
    "Kind",
    "Reading",
    "Status",
    "broken",
    "effect_conditions",
    "gone",
    "read_chain",
    "span",
]

Kind = Literal["unresolved", "stuck", "retention", "chain", "observer"]
Status = Literal["raised", "cleared"]
Ident = tuple[str | None, str | None, str]  # (task, step, kind): one alert while it holds

EFFECT_KINDS = frozenset({"unresolved", "stuck", "retention"})
TASK_KINDS = EFFECT_KINDS | {"chain"}


@attrs.frozen
class Alert:
    """A watched condition started (`raised`) or ended (`cleared`); `time` is in epoch seconds."""

    kind: Kind
    status: Status
    task: str | None
    step: str | None
    key: str | None
    message: str
    time: float

    def to_dict(self) -> dict[str, Any]:
        """The alert's fields as a dict of JSON values."""
        data: dict[str, Any] = attrs.asdict(self)
        return data

    def to_json(self) -> str:
        """The alert as one line of JSON text (keys sorted), ready to send or to log."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)


@attrs.frozen
class Condition:
    """A condition that holds now; the watcher alerts when it starts and when it ends."""

    kind: Kind
    task: str | None
    step: str | None
    key: str | None
    message: str

    @property
    def ident(self) -> Ident:
        return (self.task, self.step, self.kind)


@attrs.frozen
class Reading:
    """What one re-read of a task found. Only kinds in `scope` were judged: a broken chain
    says nothing about its effects, so their alerts neither repeat nor clear."""

    task: str
    conditions: dict[Ident, Condition]
    scope: frozenset[str]
    open_effects: dict[str, EffectRecord] = attrs.field(factory=dict)
    wake_at: float | None = None
    gone: bool = False

    def cleared_message(self, ident: Ident) -> str:
        task, step, kind = ident
        if self.gone:
            return f"task {task} is no longer in the store"
        if kind == "chain":
            return f"task {task}: its chain verifies again"
        record = self.open_effects.get(step or "")
        now = f"{record.state.value} now" if record else "CONFIRMED now (no longer open)"
        return f"effect {step} of task {task} is {now}; the {kind} alert is over"


def span(seconds: float) -> str:
    """A duration for people: 45s, 5m, 1.5h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"


def _resolve_hint(task: str, step: str) -> str:
    return (
        f"castore resolve {shlex.quote(task)} {shlex.quote(step)} --confirmed RECEIPT "
        "(or --not-done --reason TEXT)"
    )


def _unresolved(task: str, record: EffectRecord) -> Condition:
    message = (
        f"effect {record.step} of task {task} is UNRESOLVED: {record.reason or 'outcome unknown'}. "
        f"Ask the service about key {record.key}, then record the answer: "
        f"{_resolve_hint(task, record.step)}"
    )
    return Condition("unresolved", task, record.step, record.key, message)


def _stuck(task: str, record: EffectRecord, now: float) -> Condition:
    action = effect_action(record, int(now * 1000))
    message = (
        f"effect {record.step} of task {task} has been SUBMITTED for "
        f"{span(now - record.since_ms / 1000)} (attempt {record.attempts}): is its worker "
        f"alive? A restart would {action.action.value}: {action.reason}"
    )
    return Condition("stuck", task, record.step, record.key, message)


def _retention(task: str, record: EffectRecord, now: float) -> Condition:
    retention = float(record.retention_s or 0)
    left = (record.first_submitted_ms or 0) / 1000 + retention - now
    if left > 0:
        when = f"ends in {span(left)}: resume the task before then, or a resubmission"
    else:
        when = f"passed {span(-left)} ago: a resubmission"
    message = (
        f"effect {record.step} of task {task} is SUBMITTED and its service deduplicates key "
        f"{record.key} for {span(retention)} from the first submission; that window {when} "
        "would be a new operation (a restart marks it UNRESOLVED)"
    )
    return Condition("retention", task, record.step, record.key, message)


def _retention_warning_at(record: EffectRecord, fraction: float) -> float | None:
    if not record.idempotent or record.retention_s is None or record.first_submitted_ms is None:
        return None
    return record.first_submitted_ms / 1000 + fraction * record.retention_s


def effect_conditions(
    task: str, record: EffectRecord, now: float, stuck_after: float, retention_warning: float
) -> tuple[list[Condition], float | None]:
    """The conditions one open effect is in at `now`, and when the next one may start."""
    if record.state is EffectState.UNRESOLVED:
        return [_unresolved(task, record)], None
    if record.state is not EffectState.SUBMITTED:
        return [], None
    found: list[Condition] = []
    upcoming: list[float] = []
    stuck_at = record.since_ms / 1000 + stuck_after
    if now >= stuck_at:
        found.append(_stuck(task, record, now))
    else:
        upcoming.append(stuck_at)
    warn_at = _retention_warning_at(record, retention_warning)
    if warn_at is not None and now >= warn_at:
        found.append(_retention(task, record, now))
    elif warn_at is not None:
        upcoming.append(warn_at)
    return found, min(upcoming, default=None)


def broken(task: str, error: str) -> Reading:
    """A task whose chain does not verify: only the chain is judged, its effects are unknown."""
    message = (
        f"task {task}: its chain does not verify when re-read ({error}). It cannot be "
        f"resumed until repaired; castore fsck --task {shlex.quote(task)} names the damage"
    )
    condition = Condition("chain", task, None, None, message)
    return Reading(task, {condition.ident: condition}, frozenset({"chain"}))


def read_chain(
    verified: VerifiedHead, now: float, stuck_after: float, retention_warning: float
) -> Reading:
    """Every condition a verified task is in at `now` (epoch seconds), from its HEAD."""
    task, head = verified.task, verified.head
    conditions: dict[Ident, Condition] = {}
    upcoming: list[float] = []
    for record in head.effects:
        found, next_at = effect_conditions(task, record, now, stuck_after, retention_warning)
        conditions.update((c.ident, c) for c in found)
        upcoming.extend([] if next_at is None else [next_at])
    effects = {record.step: record for record in head.effects}
    return Reading(task, conditions, TASK_KINDS, effects, min(upcoming, default=None))


def gone(task: str) -> Reading:
    """A task with no chain any more: whatever held for it is over."""
    return Reading(task, {}, TASK_KINDS, gone=True)
