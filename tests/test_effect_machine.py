"""The effect lifecycle as a Hypothesis state machine, against a model of the next-action table.

An in-process fake service keeps the truth: which keys it applied, how often, with what
receipt. It can deduplicate by key (for a retention window) and/or be looked up by key, and
can be told to drop its answer after applying, or to fail before applying. Rules crash the
worker (drop the Run and resume from the store), perform and reconcile effects, let a person
resolve an effect from the service's truth, move the clock past the retention, and commit
plain steps. After every rule: the chain verifies, no key was applied twice, every CONFIRMED
receipt is the service's receipt, and castore's state and next action are the model's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import castore
from castore import Action, EffectState
from castore.format.effects import CLOCK_TOLERANCE_MS

S = EffectState
TASK = "machine-1"
PLAN = castore.Plan.build(
    "lifecycle",
    castore.effect("e1"),
    castore.Step("a", after=("e1",)),
    castore.effect("e2", "a"),
    castore.effect("e3", "e2"),
    "b",
)
PLAN_ID = castore.plan_id(PLAN)
EFFECTS = tuple(step.id for step in PLAN.steps if step.effect)
KEYS = {step: castore.derive_key(TASK, PLAN_ID, step) for step in EFFECTS}
RETENTION_S = CLOCK_TOLERANCE_MS // 1000 + 60
# castore resubmits only within the retention less the clock tolerance
# (docs/explanation/protocol.md, "Which clock castore trusts").
WINDOW_MS = RETENTION_S * 1000 - CLOCK_TOLERANCE_MS
START_MS = 1_800_000_000_000


class Dropped(Exception):
    """The service applied the operation, then the answer was lost."""


class Refused(Exception):
    """The service failed before applying anything (a 503, say)."""


class FakeService:
    """The outside world: a ledger of applications per key, the truth a person can check."""

    def __init__(self, *, dedupe: bool, lookup: bool, clock: list[int]) -> None:
        self.dedupe = dedupe
        self.can_lookup = lookup
        self.clock = clock
        self.applied: dict[str, list[str]] = {}
        self.first_ms: dict[str, int] = {}
        self.sent: list[str] = []
        self.drop_next = False
        self.fail_next = False
        self.outage = False  # lookups fail while set

    def send(self, key: str) -> str:
        self.sent.append(key)
        if self.fail_next:
            self.fail_next = False
            raise Refused(f"503 before applying {key}")
        now = self.clock[0]
        if self.dedupe and key in self.applied and now - self.first_ms[key] < RETENTION_S * 1000:
            receipt = self.applied[key][0]
        else:
            receipt = f"r-{sum(map(len, self.applied.values())) + 1}"
            self.applied.setdefault(key, []).append(receipt)
            self.first_ms.setdefault(key, now)
        if self.drop_next:
            self.drop_next = False
            raise Dropped(f"applied {key}, then the connection reset")
        return receipt

    def lookup(self, key: str) -> castore.Reconciled:
        if self.outage:
            raise Refused("lookup endpoint down")
        truth = self.truth(key)
        return castore.NOT_FOUND if truth is None else castore.found(truth)

    def truth(self, key: str) -> str | None:
        receipts = self.applied.get(key)
        return receipts[0] if receipts else None

    def declared(self) -> castore.Service:
        return castore.Service(
            "fake",
            idempotent=self.dedupe,
            retention=RETENTION_S if self.dedupe else None,
            reconcile=self.lookup if self.can_lookup else None,
        )


@attrs.define
class ModelEffect:
    state: EffectState = S.PLANNED
    first_ms: int | None = None


class EffectMachine(RuleBasedStateMachine):
    """castore's effect protocol against the model, with crashes between any two rules."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="castore-machine-"))
        self.clock = [START_MS]
        self.store = castore.Store.init(self.tmp / "store", clock=lambda: self.clock[0])
        self.run: castore.Run | None = None
        self.service = FakeService(dedupe=False, lookup=False, clock=self.clock)
        self.model = {step: ModelEffect() for step in EFFECTS}
        self.index = 0  # the model's frontier

    def teardown(self) -> None:
        if self.run is not None:
            self.run.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the model -------------------------------------------------------------------------------
    @property
    def step(self) -> str | None:
        return PLAN.steps[self.index].id if self.index < len(PLAN.steps) else None

    def frontier_effect(self) -> ModelEffect | None:
        step = self.step
        return self.model.get(step) if step is not None else None

    def expected_action(self, step: str | None = None) -> Action:
        """The next-action table, written out again from docs/explanation/protocol.md, 'What
        a restart does', for `step` (default: the frontier step)."""
        step = step or self.step
        if step is None:
            return Action.DONE
        effect = self.model.get(step)
        if effect is None:
            return Action.RUN
        if effect.state is S.CONFIRMED:
            return Action.SKIP
        by_state = {
            S.PLANNED: Action.SUBMIT,
            S.NOT_DONE: Action.SUBMIT,
            S.UNRESOLVED: Action.ESCALATE,
        }
        if effect.state in by_state:
            return by_state[effect.state]
        assert (S.SUBMITTED, True) == (effect.state, effect.first_ms is not None)
        if self.service.can_lookup:
            return Action.RECONCILE
        within = 0 <= self.clock[0] - (effect.first_ms or 0) < WINDOW_MS
        return Action.RESUBMIT if self.service.dedupe and within else Action.MARK_UNRESOLVED

    def confirm_in_model(self) -> None:
        self.model[self.step or ""].state = S.CONFIRMED
        self.index += 1

    def model_reconcile(self, step: str) -> None:
        """What a lookup by key leads to."""
        effect = self.model[step]
        if self.service.outage:
            if effect.state is S.SUBMITTED:
                effect.state = S.UNRESOLVED
            return
        if self.service.truth(KEYS[step]) is None:
            effect.state = S.NOT_DONE
        else:
            self.confirm_in_model()

    def model_settle(self, step: str) -> Action:
        """run.settle on the frontier effect `step`: the rows that do not send; returns what
        is left to do for `step`."""
        if self.expected_action(step) is Action.RECONCILE:
            self.model_reconcile(step)
        if self.expected_action(step) is Action.MARK_UNRESOLVED:
            self.model[step].state = S.UNRESOLVED
        if self.expected_action(step) is Action.ESCALATE and self.service.can_lookup:
            self.model_reconcile(step)
        return self.expected_action(step)

    # -- rules -------------------------------------------------------------------------------------
    @initialize(dedupe=st.booleans(), lookup=st.booleans())
    def start(self, dedupe: bool, lookup: bool) -> None:
        self.service.dedupe, self.service.can_lookup = dedupe, lookup
        self.run = self.store.start(TASK, PLAN, lock_timeout=None)

    @rule()
    def crash_and_resume(self) -> None:
        """The worker dies: everything not committed is lost; a new one resumes."""
        self.run = self.store.resume(TASK, PLAN, lock_timeout=None)

    @rule(ms=st.sampled_from([1_000, WINDOW_MS // 2, WINDOW_MS + 1, RETENTION_S * 1000 + 1]))
    def time_passes(self, ms: int) -> None:
        self.clock[0] += ms

    @rule(down=st.booleans())
    def lookup_outage(self, down: bool) -> None:
        self.service.outage = down

    @precondition(lambda self: self.expected_action() is Action.RUN)
    @rule()
    def commit_plain_step(self) -> None:
        assert self.run is not None
        self.run.commit_step(self.step or "", {"step": self.step})
        self.index += 1

    @precondition(lambda self: self.frontier_effect() is not None)
    @rule(fault=st.sampled_from(["none", "drop", "fail"]))
    def perform(self, fault: str) -> None:
        assert self.run is not None
        step, effect = self.step or "", self.frontier_effect()
        assert effect is not None
        service = self.service
        service.drop_next, service.fail_next = fault == "drop", fault == "fail"
        sent_before = len(service.sent)
        left = self.expected_action(step)
        if left in (Action.RECONCILE, Action.MARK_UNRESOLVED, Action.ESCALATE):
            left = self.model_settle(step)
        expect_send = left in (Action.SUBMIT, Action.RESUBMIT)
        expect_unknown = left is Action.ESCALATE
        raised: Exception | None = None
        receipt = None
        try:
            receipt = self.run.perform(step, service.declared(), service.send)
        except (castore.OutcomeUnknownError, Dropped, Refused) as exc:
            raised = exc
        finally:
            service.drop_next = service.fail_next = False
        assert (1 if expect_send else 0) == len(service.sent) - sent_before
        if expect_send:
            effect.first_ms = effect.first_ms or self.clock[0]
        if expect_unknown:
            assert isinstance(raised, castore.OutcomeUnknownError), raised
            assert KEYS[step] == raised.key
        elif fault != "none" and expect_send:
            assert (Refused if fault == "fail" else Dropped) is type(raised)
            effect.state = S.SUBMITTED
        else:
            assert None is raised
            if expect_send:
                self.confirm_in_model()
            assert service.truth(KEYS[step]) == receipt

    @precondition(
        lambda self: (
            self.service.can_lookup
            and (effect := self.frontier_effect()) is not None
            and effect.state in (S.SUBMITTED, S.UNRESOLVED)
        )
    )
    @rule()
    def reconcile(self) -> None:
        assert self.run is not None
        step = self.step or ""
        self.model_reconcile(step)
        assert (
            self.expected_action(step) == self.run.reconcile(step, self.service.declared()).action
        )

    @precondition(lambda self: self.frontier_effect() is not None)
    @rule()
    def settle(self) -> None:
        assert self.run is not None
        sent_before = len(self.service.sent)
        left = self.model_settle(self.step or "")
        assert left == self.run.settle(self.service.declared()).action
        assert sent_before == len(self.service.sent)  # settle never sends

    @precondition(
        lambda self: (
            (effect := self.frontier_effect()) is not None
            and effect.state in (S.SUBMITTED, S.UNRESOLVED)
        )
    )
    @rule()
    def person_resolves(self) -> None:
        """A person checks the service and records what it says, then the worker resumes."""
        step = self.step or ""
        truth = self.service.truth(KEYS[step])
        if truth is None:
            self.store.resolve(TASK, step, not_done=True, reason="not applied", who="ana@ops")
            self.model[step].state = S.NOT_DONE
        else:
            self.store.resolve(TASK, step, receipt=truth, who="ana@ops", reason="in ledger")
            self.confirm_in_model()
        self.run = self.store.resume(TASK, PLAN, lock_timeout=None)

    # -- invariants --------------------------------------------------------------------------------
    @invariant()
    def no_key_applied_twice(self) -> None:
        assert dict.fromkeys(self.service.applied, 1) == {
            key: len(receipts) for key, receipts in self.service.applied.items()
        }

    @invariant()
    def chain_verifies_and_receipts_are_the_services(self) -> None:
        if self.run is None:
            return
        chain = self.store.verify(TASK)  # raises ChainError if anything does not verify
        assert self.run.head_id == chain.head_id
        outcomes = chain.outcomes
        for step in EFFECTS:
            confirmed = step in outcomes
            assert (self.model[step].state is S.CONFIRMED) == confirmed
            if confirmed:
                assert self.service.truth(KEYS[step]) == outcomes[step].receipt

    @invariant()
    def castore_agrees_with_the_model(self) -> None:
        if self.run is None:
            return
        head = self.run.head
        assert self.step == head.frontier.step
        for step, effect in self.model.items():
            record = head.effect(step)
            actual = S.CONFIRMED if self.run.done(step) else (record and record.state)
            expected = effect.state if PLAN.index(step) <= self.index else None
            assert expected == actual, step
            if record is not None and record.state is not S.PLANNED:
                assert KEYS[step] == record.key
        assert self.expected_action() == self.run.next_action().action


TestEffectLifecycle = EffectMachine.TestCase
TestEffectLifecycle.settings = settings(stateful_step_count=30)
