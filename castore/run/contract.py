"""What the modules that drive a run need of it: the interface castore.run.run.Run provides.

The protocol, the journal, the replay, the brief and the in-flight registry are called by the
Run and call back into it; they are typed against RunView (and Position, what the replay finds
at its cursor), never against the Run class, so that nothing imports in a circle.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any, Protocol

from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome
from castore.format.effects import ChainClock, NextAction, Service
from castore.format.records import (
    EffectRecord,
    Frontier,
    Grown,
    Plan,
    Sealed,
    Snapshot,
    Step,
    Transition,
)


class Position(enum.Enum):
    """What `run.at` found at the cursor."""

    DONE = "done"  # recorded: its outcome stands; do not do the work again
    PENDING = "pending"  # decided, not done: do the work and commit it


class RunView(Protocol):
    """A run, as the modules it drives see it (castore.run.run.Run is the implementation)."""

    task_id: str
    plan: Plan
    plan_id: str
    head: Snapshot
    head_id: str
    chain_clock: ChainClock
    env_unverified: bool

    @property
    def finished(self) -> bool: ...
    @property
    def grows(self) -> bool: ...
    @property
    def next_step(self) -> str | None: ...
    @property
    def objects(self) -> ObjectStore: ...
    @property
    def allow_fields(self) -> Collection[str]: ...
    @property
    def task_place(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def writes_v2(self) -> bool: ...

    def at(self, step_id: str, *, effect: bool = False, args: str | None = None) -> Position: ...
    def append(
        self, step_id: str, result: Any = None, *, args: str | None = None
    ) -> str | None: ...
    def finish(self) -> str: ...
    def done(self, step_id: str) -> bool: ...
    def outcome(self, step_id: str) -> Outcome: ...
    def result(self, step_id: str) -> Any: ...
    def receipt(self, step_id: str) -> str | None: ...
    def commit_step(self, step_id: str, result: Any = None, *, args: str | None = None) -> str: ...
    def checked_result(self, step_id: str, result: Any) -> tuple[Any, str | None]: ...
    def record_step(
        self,
        step_id: str,
        inline: Any,
        ref: str | None,
        *,
        args: str | None = None,
        decided: Step | None = None,
    ) -> str: ...
    def grown_by(self, step: Step, args: str | None) -> Grown: ...
    def planned(self, step_id: str) -> EffectRecord: ...
    def snapshot_at(self, seq: int) -> Snapshot | None: ...
    def frontier_step(self) -> Step | None: ...
    def advance(
        self,
        transition: Transition,
        effects: tuple[EffectRecord, ...],
        *,
        move_frontier: bool = False,
        frontier: Frontier | None = None,
        plan_id: str | None = None,
        sealed: Sealed | None = None,
        packs_written: tuple[str, ...] = (),
        grown: Grown | None = None,
    ) -> str: ...
    def now_ms(self) -> int: ...
    def live_env(self) -> str | None: ...
    def record_outcome(self, outcome: Outcome) -> None: ...
    def call(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...
    def effect(
        self, step_id: str, service: Service, *, key: str | None = None
    ) -> AbstractContextManager[Any]: ...
    def perform(
        self, step_id: str, service: Service, send: Callable[[str], str], *, key: str | None = None
    ) -> str: ...
    def settle(self, service: Service) -> NextAction: ...
    def brief(self, *, budget_tokens: int = 512, now_ms: int | None = None) -> Any: ...
