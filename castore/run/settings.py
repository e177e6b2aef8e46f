"""How a run commits, and the snapshots and keys it starts from: settings, the default
idempotency keys, a snapshot's encoding under the payload rules, a new task's seq 0."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from castore.errors import EncodingError
from castore.format import codec, guard
from castore.format.digest import hash_chunks
from castore.format.model import attrs
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Grown,
    Plan,
    Snapshot,
    Transition,
    TransitionKind,
    Writer,
    snapshot_version,
)

EnvSource = str | Callable[[], str | None] | None
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def derive_key(task_id: str, plan_id: str, step_id: str) -> str:
    """The default idempotency key of an effect: stable across restarts, one per task+plan+step."""
    digest = hash_chunks([task_id.encode(), b"\0", plan_id.encode(), b"\0", step_id.encode()])
    return f"cas-{digest[:40]}"


def derive_step_key(task_id: str, step_id: str) -> str:
    """The default idempotency key of an effect of a growing plan: one per task+step, stable
    as the plan grows (never derived from the plan digest, which every decision changes)."""
    digest = hash_chunks([task_id.encode(), b"\0step\0", step_id.encode()])
    return f"cas-{digest[:40]}"


def effect_key(task_id: str, plan: Plan, plan_id: str, step_id: str) -> str:
    """The default key of effect `step_id`: per task+plan+step, or per task+step when the
    plan grows."""
    if plan.grows:
        return derive_step_key(task_id, step_id)
    return derive_key(task_id, plan_id, step_id)


@attrs.define
class RunSettings:
    """How a run commits: payload rules, clock and environment source."""

    env: EnvSource = None
    allow_fields: Collection[str] = ()
    snapshot_budget: int = guard.DEFAULT_SNAPSHOT_BUDGET
    clock: Clock = wall_clock_ms
    seal_every: int | None = None  # format v2: seal every this many commits (None: never)
    version: int = codec.FORMAT_VERSION  # the store's format: no commit may need a later one

    def live_env(self) -> str | None:
        """The environment digest now (calling the source if it is a function)."""
        return self.env() if callable(self.env) else self.env


def encode_snapshot(snapshot: Snapshot, settings: RunSettings, version: int | None = None) -> bytes:
    """Snapshot bytes after the payload rules: no secrets, within the size budget.
    `version`: snapshot_version(snapshot), when the caller has it already."""
    builtins = codec.to_builtins(snapshot)
    # Only the transition and effect records carry caller-supplied values; the rest are
    # castore's own ids and numbers, the task id and the env anchor (both judged where they
    # enter: refuse_recorded_secrets).
    guard.refuse_secrets(builtins["transition"], settings.allow_fields, "$.transition")
    guard.refuse_secrets(builtins["effects"], settings.allow_fields, "$.effects")
    if version is None:
        version = snapshot_version(snapshot)
    try:
        encoded = codec.encode_value(builtins)
    except EncodingError as exc:
        step = snapshot.transition.step
        owner = (
            f"task {snapshot.task!r}"
            if step is None
            else f"step {step!r} of task {snapshot.task!r}"
        )
        raise codec.told_of_result(exc, owner, "$.transition.result") from exc
    data = codec.frame("snapshot", encoded, version)
    parts = {**builtins["transition"], "effects": builtins["effects"]}
    guard.check_size(data, parts, settings.snapshot_budget)
    return data


def planned_record(
    task_id: str, plan: Plan, plan_id: str, index: int, now_ms: int
) -> EffectRecord | None:
    """The PLANNED record of the effect at `index`, if that step is an effect."""
    if index >= len(plan.steps) or not plan.steps[index].effect:
        return None
    step = plan.steps[index].id
    return EffectRecord(step, effect_key(task_id, plan, plan_id, step), EffectState.PLANNED, now_ms)


def refuse_recorded_secrets(task_id: str | None, env: str | None, settings: RunSettings) -> None:
    """Refuse a task id or an environment anchor that looks like a credential: each is written
    in clear into every snapshot of the task (the id into its directory name too), where no
    later commit can take it back. `allow_fields` vouches for them as "$.task" and "$.env"."""
    recorded = {"task": task_id, "env": env}
    guard.refuse_secrets(
        {k: v for k, v in recorded.items() if v is not None}, settings.allow_fields
    )


def initial_snapshot(task_id: str, plan: Plan, plan_id: str, settings: RunSettings) -> Snapshot:
    """Sequence 0 of a new task: its frontier at the first step, its parent the plan root."""
    now = settings.clock()
    env = settings.live_env()
    refuse_recorded_secrets(task_id, env, settings)
    planned = planned_record(task_id, plan, plan_id, 0, now)
    return Snapshot(
        task=task_id,
        seq=0,
        parent=None,
        plan=plan_id,
        frontier=Frontier(0, plan.steps[0].id if plan.steps else None),
        effects=() if planned is None else (planned,),
        transition=Transition(TransitionKind.START),
        env=env,
        time_ms=now,
        writer=Writer.new_run(),
        grown=Grown(0, plan_id) if plan.grows else None,
    )
