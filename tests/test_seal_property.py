"""Property: a sealed and an unsealed store of the same history resume to the same state.

The same workload (steps with inline and blob results, effects confirmed through a service,
the run closed and resumed at chosen points) runs on a v2 store that seals every 4 commits and
on a v1 store, which never seals, with the same clock. Their resumes must agree on everything
a run acts on: HEAD's frontier, effects and plan, each step's outcome and result, and what the
chain shows of its writers' clocks; and their status lines on everything but the ids.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import castore
import castore.store
from castore.format.records import Plan

PAY = castore.Service("pay", idempotent=True, retention=3600)


def plan_for(effects: frozenset[int], steps: int) -> Plan:
    """`steps` steps, those in `effects` effect steps; one more step left undone at the end
    (the task never finishes, so neither store gets a finish seal)."""
    built = [castore.effect(f"s{i}") if i in effects else f"s{i}" for i in range(steps + 1)]
    return Plan.build("prop", *built)


def drive(store: castore.Store, plan: Plan, steps: int, breaks: frozenset[int]) -> None:
    """Commit `steps` steps of `plan`, closing and resuming the run after each in `breaks`;
    the sealing thread is waited for after each commit (hypothesis needs one outcome per
    example)."""
    run = store.open_task("t", plan)
    for i in range(steps):
        step = plan.steps[i]
        if step.effect:
            run.perform(step.id, PAY, lambda key, i=i: f"receipt-{i}-{key[-6:]}")
        elif i % 3 == 2:
            run.commit_step(step.id, store.put_blob({"i": i, "pad": "x" * i}))
        else:
            run.commit_step(step.id, {"i": i})
        if run._sealer is not None:  # seals land at the same commits in every run of the test
            run._sealer.drain()
        if i in breaks:
            run.close()
            run = store.open_task("t", plan)
    run.close()


def make_store(root: Path, version: int, clock: object) -> castore.Store:
    store = castore.Store.init(root)
    if version == 1:  # a v1 store: read and written as v1, never sealed
        Path(store.layout.marker).write_bytes(b'{"format":"castore","version":1}\n')
    return castore.Store(root, clock=clock)  # type: ignore[arg-type]


def state(store: castore.Store, plan: Plan) -> dict[str, object]:
    """Everything a resumed run acts on, without ids (the two stores' snapshots differ in
    their anchors, hence their ids)."""
    with store.resume("t", plan) as run:
        head = run.head
        outcomes = {}
        for step in plan.steps:
            if run.done(step.id):
                found = run.outcome(step.id)
                outcomes[step.id] = (found.seq, found.result, found.result_ref, found.receipt)
                outcomes[step.id + "/result"] = run.result(step.id) if not step.effect else None
        return {
            "seq": head.seq,
            "frontier": head.frontier,
            "effects": head.effects,
            "plan": head.plan,
            "env": head.env,
            "outcomes": outcomes,
            "clock": run.chain_clock,
            "status": attrs.asdict(store.status("t"), filter=lambda a, _: a.name != "head"),
        }


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.integers(1, 26),
    effects=st.frozensets(st.integers(0, 25), max_size=4),
    breaks=st.frozensets(st.integers(0, 25), max_size=3),
)
def test_a_sealed_and_an_unsealed_store_resume_to_the_same_state(
    tmp_path_factory: object, steps: int, effects: frozenset[int], breaks: frozenset[int]
) -> None:
    """The same history on a store that seals every 4 commits and on one that never seals:
    the same HEAD state, outcomes, results, clock and status."""
    base = Path(tmp_path_factory.mktemp("prop"))  # type: ignore[attr-defined]
    plan = plan_for(effects, steps)
    results = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(castore.store, "SEAL_EVERY", 4)
        # What is compared is state, not durability (the crash tests judge that): no fsync.
        mp.setattr("os.fsync", lambda fd: None)
        for version in (2, 1):
            ticks = itertools.count(1_000_000, 7)  # the same clock readings for both
            store = make_store(base / f"v{version}", version, ticks.__next__)
            drive(store, plan, steps, breaks)
            results.append(state(store, plan))
    sealed, unsealed = results
    chain = castore.Store(base / "v2").verify("t")
    if steps >= 4:
        assert chain.head.sealed is not None, "the v2 store did not seal"
    assert unsealed == sealed
