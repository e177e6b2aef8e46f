"""The resumption gate: each invariant refuses with its own exception and a message that says
what to do; drift is accepted only by an audited override, never silently."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import flip_bit, rewrite, tree_snapshot

import castore
from castore.chain.refs import TaskSlots
from castore.format.records import EffectRecord, EffectState, Frontier, Transition, TransitionKind
from castore.run.settings import RunSettings, encode_snapshot, initial_snapshot

TASK = "report-1"
PLAN = castore.Plan.build("report", "fetch", castore.effect("pay", "fetch"), "publish")
NEITHER = castore.Service("payments")
WHO, WHY = "ana@ops", "the config was rotated on purpose"


def forge(
    store: castore.Store, task: str = TASK, *, header: bytes | None = None, **changes: Any
) -> str:
    """Commit a hand-made successor of HEAD (what a buggy or foreign writer could leave)."""
    chain = store.verify(task)
    snapshot = attrs.evolve(chain.head, seq=chain.head.seq + 1, parent=chain.head_id, **changes)
    data = encode_snapshot(snapshot, RunSettings())
    if header is not None:
        data = header + data[data.index(b" snapshot ") :]
    return TaskSlots(store.medium, store.objects, task).commit(data, snapshot.seq, chain.head_id)


def forge_root(store: castore.Store, **changes: Any) -> str:
    """Create TASK with a hand-made sequence 0: a malformed frontier or record can only come
    from there or an override, since no other transition may move the frontier or add records
    (a successor doing so is refused as an illegal history first; tests/test_history.py)."""
    plan_id = store.put_plan(PLAN)
    snapshot = attrs.evolve(initial_snapshot(TASK, PLAN, plan_id, RunSettings()), **changes)
    slots = TaskSlots(store.medium, store.objects, TASK)
    os.makedirs(slots.directory)
    return slots.commit(encode_snapshot(snapshot, RunSettings()), 0, "<none: new task>")


def interrupted(run: castore.Run, service: castore.Service) -> None:
    """Submit 'pay' and lose the connection inside the block: it stays SUBMITTED."""
    with run.effect("pay", service):
        raise ConnectionError("dropped")


def three_snapshots(store: castore.Store, **options: Any) -> list[str]:
    """Start TASK and commit "fetch": returns the snapshot ids, oldest first."""
    with store.start(TASK, PLAN, **options) as run:
        run.commit_step("fetch", [1, 2, 3])
        with pytest.raises(ConnectionError, match="dropped"):
            interrupted(run, NEITHER)
    return [object_id for object_id, _ in reversed(store.history(TASK))]


# -- 1. the chain ----------------------------------------------------------------------------------


def test_corrupt_snapshot_object_is_a_chain_error(store: castore.Store) -> None:
    """A flipped bit in a snapshot object: ChainError naming the object, store not resumed."""
    ids = three_snapshots(store)
    rewrite(Path(store.objects.path(ids[1])), flip_bit)
    with pytest.raises(castore.ChainError) as caught:
        store.resume(TASK, PLAN)
    error = caught.value
    assert ids[1] == error.object_id
    assert f"task {TASK!r}: the chain is broken at slot 1" in str(error)
    assert "is corrupt" in str(error)
    assert "will not resume" in str(error)
    assert isinstance(error, castore.ResumeRefusedError)
    assert isinstance(error, castore.IntegrityError)


def test_missing_snapshot_object_is_a_chain_error(store: castore.Store) -> None:
    """A parent snapshot object that is gone, its slot holding other bytes (so the slot
    cannot stand for a lost name): ChainError saying it is missing."""
    ids = three_snapshots(store)
    os.unlink(store.objects.path(ids[0]))
    rewrite(Path(TaskSlots(store.medium, store.objects, TASK).path(0)), flip_bit)
    with pytest.raises(castore.ChainError) as caught:
        store.resume(TASK, PLAN)
    assert "is missing" in str(caught.value)
    assert ids[0] in str(caught.value)


def test_snapshot_of_another_task_spliced_in_is_a_chain_error(store: castore.Store) -> None:
    """A slot that links another task's snapshot: ChainError naming the foreign task."""
    three_snapshots(store)
    with store.start("other", PLAN) as run:
        run.commit_step("fetch", [1, 2, 3])
        run.perform("pay", NEITHER, lambda key: "rcpt-1")  # seq 2 is its SUBMITTED commit
    foreign_id = store.history("other")[1][0]
    slots = TaskSlots(store.medium, store.objects, TASK)
    os.unlink(slots.path(2))  # HEAD of TASK, replaced by the other task's snapshot 2
    os.link(store.objects.path(foreign_id), slots.path(2))
    with pytest.raises(castore.ChainError) as caught:
        store.resume(TASK, PLAN)
    assert "belongs to task 'other'" in str(caught.value)


def test_snapshot_naming_another_plan_is_a_chain_error(store: castore.Store) -> None:
    """A snapshot that switches to another plan without an override: ChainError."""
    three_snapshots(store)
    foreign_plan = store.put_plan(castore.Plan.build("other", "fetch", "pay", "publish"))
    forge(store, plan=foreign_plan)
    with pytest.raises(castore.ChainError) as caught:
        store.resume(TASK, PLAN)
    assert f"its child names {foreign_plan}" in str(caught.value)


# -- 2. plan drift ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "line"),
    [
        (
            castore.Plan.build(
                "report", "fetch", castore.effect("pay", "fetch"), "publish", "archive"
            ),
            "+step archive after publish",
        ),
        (
            castore.Plan.build("report", "fetch", castore.effect("pay", "fetch")),
            "-step publish after pay",
        ),
    ],
    ids=["added", "removed"],
)
def test_plan_drift_names_the_added_or_removed_step(
    store: castore.Store, plan: castore.Plan, line: str
) -> None:
    """A different plan: PlanDriftError whose .diff (and message) names the changed step."""
    three_snapshots(store)
    before = tree_snapshot(store.root)
    with pytest.raises(castore.PlanDriftError) as caught:
        store.resume(TASK, plan)
    error = caught.value
    assert (castore.plan_id(PLAN), castore.plan_id(plan)) == (error.expected, error.actual)
    assert line in error.diff.splitlines()
    assert error.diff in str(error)
    assert "audited override" in str(error)
    assert isinstance(error, castore.ResumeRefusedError)
    assert before == tree_snapshot(store.root)


def test_plan_drift_says_a_task_id_of_its_own_is_the_usual_fix(store: castore.Store) -> None:
    """Another job that reuses a task id is told to take a task id of its own first."""
    with store.open_task("order-7", PLAN) as run:
        run.commit_step("fetch", 1)
    with pytest.raises(castore.PlanDriftError) as caught:
        store.open_task("order-7", castore.Plan.grow("agent"))
    advice = str(caught.value).splitlines()[-1]
    assert advice.startswith("If this is another job that reused the task id, give it a task id")
    assert "the usual fix" in advice
    assert "store.override(" in advice


# -- 3. environment drift --------------------------------------------------------------------------


def test_environment_drift_of_a_value_is_refused(store: castore.Store) -> None:
    """env_digest of a changed value: EnvironmentDriftError with both digests."""
    old, new = castore.env_digest({"model": "m1", "n": 1}), castore.env_digest({"model": "m2"})
    assert old == castore.env_digest({"n": 1, "model": "m1"})  # key order does not matter
    with store.start(TASK, PLAN, env=old) as run:
        run.commit_step("fetch", 1)
    with pytest.raises(castore.EnvironmentDriftError) as caught:
        store.resume(TASK, PLAN, env=new)
    error = caught.value
    assert (old, new) == (error.expected, error.actual)
    assert f"anchor {old}, live {new}" in str(error)
    assert "audited override" in str(error)
    assert isinstance(error, castore.ResumeRefusedError)


def test_environment_drift_of_a_directory_tree_is_refused(
    store: castore.Store, tmp_path: Path
) -> None:
    """tree_digest notices a file written into the tree; ignored patterns do not count."""
    world = tmp_path / "world"
    (world / "src").mkdir(parents=True)
    (world / "src" / "app.py").write_text("print(1)\n")

    def live() -> str:
        return castore.tree_digest(world, ignore=["*.log", "cache"])

    with store.start(TASK, PLAN, env=live) as run:
        run.commit_step("fetch", 1)
    anchor = live()
    (world / "run.log").write_text("noise\n")
    (world / "cache").mkdir()
    (world / "cache" / "x").write_text("noise\n")
    assert anchor == live()
    with store.resume(TASK, PLAN, env=live) as run:  # ignored changes are no drift
        assert 1 == run.head.seq
    (world / "src" / "new.py").write_text("print(2)\n")
    assert anchor != live()
    with pytest.raises(castore.EnvironmentDriftError) as caught:
        store.resume(TASK, PLAN, env=live)
    assert (anchor, live()) == (caught.value.expected, caught.value.actual)


def _submitted_while_the_world_changes(
    store: castore.Store, world: Path, service: castore.Service
) -> None:
    """Start TASK with the tree of `world` as its environment; leave 'pay' SUBMITTED."""
    with store.start(TASK, PLAN, env=lambda: castore.tree_digest(world)) as run:
        run.commit_step("fetch", 1)
        with pytest.raises(ConnectionError, match="dropped"):
            interrupted(run, service)


def test_environment_check_waits_for_a_submitted_effect_found_adopts_it(
    store: castore.Store, tmp_path: Path
) -> None:
    """A SUBMITTED effect defers the env check; once it is found the live env is adopted."""
    world = tmp_path / "world"
    world.mkdir()
    found = castore.Service("payments", reconcile=lambda key: castore.found("rcpt-1"))
    _submitted_while_the_world_changes(store, world, found)
    anchor = store.verify(TASK).head.env
    (world / "invoice.pdf").write_text("paid")  # what the effect did

    def live() -> str:
        return castore.tree_digest(world)

    with store.resume(TASK, PLAN, env=live) as run:
        assert castore.Action.RECONCILE == run.next_action().action
        assert castore.Action.SKIP == run.settle(found).action
        assert live() == run.head.env
        run.commit_step("publish", "ok")
    assert anchor != live()
    with store.resume(TASK, PLAN, env=live) as run:
        assert run.finished


def test_environment_check_after_a_not_found_effect_raises_drift(
    store: castore.Store, tmp_path: Path
) -> None:
    """If the SUBMITTED effect was not applied it explains nothing: the drift is raised then."""
    world = tmp_path / "world"
    world.mkdir()
    absent = castore.Service("payments", reconcile=lambda key: castore.NOT_FOUND)
    _submitted_while_the_world_changes(store, world, absent)
    anchor = store.verify(TASK).head.env
    (world / "surprise.txt").write_text("someone else")

    def live() -> str:
        return castore.tree_digest(world)

    with store.resume(TASK, PLAN, env=live) as run:
        with pytest.raises(castore.EnvironmentDriftError) as caught:
            run.settle(absent)
        assert (anchor, live()) == (caught.value.expected, caught.value.actual)
    head = store.verify(TASK).head
    assert (EffectState.NOT_DONE, anchor) == (head.effect("pay").state, head.env)
    with pytest.raises(castore.EnvironmentDriftError):
        store.resume(TASK, PLAN, env=live)


# -- 4. keyless in-flight effect -------------------------------------------------------------------


def test_submitted_effect_without_a_key_is_refused(store: castore.Store) -> None:
    """A SUBMITTED effect whose key is None: KeylessEffectError naming the step and the fix."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
    now = store.verify(TASK).head.time_ms
    forge(
        store,
        effects=(EffectRecord("pay", None, EffectState.SUBMITTED, now, attempts=1),),
        transition=Transition(
            TransitionKind.EFFECT,
            step="pay",
            effect_from=EffectState.PLANNED,
            effect_to=EffectState.SUBMITTED,
        ),
    )
    with pytest.raises(castore.KeylessEffectError) as caught:
        store.resume(TASK, PLAN)
    error = caught.value
    assert (TASK, "pay") == (error.task, error.step)
    assert "SUBMITTED without an idempotency key" in str(error)
    assert f"castore resolve {TASK} pay" in str(error)
    assert isinstance(error, castore.ResumeRefusedError)


# -- 5. malformed frontier and unknown format version ----------------------------------------------


@pytest.mark.parametrize(
    ("frontier", "reason"),
    [
        (Frontier(7, None), "step index 7 outside 0..3"),
        (Frontier(-1, "fetch"), "step index -1 outside 0..3"),
        (Frontier(1, "nope"), "step 'nope' at index 1, plan has 'pay'"),
    ],
    ids=["out-of-range", "negative", "unknown-step"],
)
def test_malformed_frontier_is_refused(
    store: castore.Store, frontier: Frontier, reason: str
) -> None:
    """A frontier that does not fit the plan: MalformedFrontierError with the reason."""
    forge_root(store, frontier=frontier, effects=())
    with pytest.raises(castore.MalformedFrontierError) as caught:
        store.resume(TASK, PLAN)
    assert reason == caught.value.reason
    assert f"malformed frontier: {reason}" in str(caught.value)
    assert isinstance(caught.value, castore.ResumeRefusedError)


def test_effect_record_of_an_unknown_step_is_a_malformed_frontier(store: castore.Store) -> None:
    """An effect record naming a step the plan does not have: MalformedFrontierError."""
    forge_root(store, effects=(EffectRecord("ghost", "k-1", EffectState.SUBMITTED, 0),))
    with pytest.raises(castore.MalformedFrontierError) as caught:
        store.resume(TASK, PLAN)
    assert "unknown effect 'ghost'" in str(caught.value)


def test_unknown_format_version_is_refused(store: castore.Store) -> None:
    """A snapshot whose object header says version 9: FormatVersionError, a CastoreError."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
    forged = forge(store, header=b"castore 9")
    before = tree_snapshot(store.root)
    with pytest.raises(castore.FormatVersionError) as caught:
        store.resume(TASK, PLAN)
    assert (9, (1, 2)) == (caught.value.found, caught.value.supported)
    assert "uses castore format version 9" in str(caught.value)
    assert forged == store.objects.path(forged).rsplit("/", 1)[-1]
    assert isinstance(caught.value, castore.CastoreError)
    assert before == tree_snapshot(store.root)


# -- the audited override --------------------------------------------------------------------------


def test_environment_drift_is_accepted_only_by_an_audited_override(store: castore.Store) -> None:
    """Env drift is refused until override(who, why, env) records it as its own snapshot."""
    old, new = castore.env_digest("v1"), castore.env_digest("v2")
    with store.start(TASK, PLAN, env=old) as run:
        run.commit_step("fetch", 1)
    before = tree_snapshot(store.root)
    for _ in range(2):
        with pytest.raises(castore.EnvironmentDriftError):
            store.resume(TASK, PLAN, env=new)
    assert before == tree_snapshot(store.root)
    snapshot_id = store.override(TASK, who=WHO, why=WHY, env=new)
    newest_id, newest = store.history(TASK)[0]
    assert snapshot_id == newest_id
    assert (TransitionKind.OVERRIDE, WHO, WHY, new) == (
        newest.transition.kind,
        newest.transition.who,
        newest.transition.why,
        newest.env,
    )
    with store.resume(TASK, PLAN, env=new) as run:
        assert "pay" == run.next_step
        assert [1] == [run.result("fetch")]
    with pytest.raises(castore.EnvironmentDriftError):
        store.resume(TASK, PLAN, env=old)
    store.verify(TASK)


def test_plan_drift_is_accepted_by_an_override_with_the_new_plan(store: castore.Store) -> None:
    """override(plan=new) with a step added at the end lets the new plan resume, audited."""
    new_plan = castore.Plan.build(
        "report", "fetch", castore.effect("pay", "fetch"), "publish", "archive"
    )
    with store.start(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
    with pytest.raises(castore.PlanDriftError):
        store.resume(TASK, new_plan)
    store.override(TASK, who=WHO, why="archive reports from now on", plan=new_plan)
    newest = store.history(TASK)[0][1]
    assert (castore.plan_id(PLAN), castore.plan_id(new_plan), WHO) == (
        newest.transition.replaced,
        newest.plan,
        newest.transition.who,
    )
    with store.resume(TASK, new_plan) as run:
        run.perform("pay", NEITHER, lambda key: "rcpt-1")
        run.commit_step("publish", "ok")
        run.commit_step("archive", "ok")
        assert run.finished
    with pytest.raises(castore.PlanDriftError):
        store.resume(TASK, PLAN)
    assert castore.plan_id(new_plan) == store.verify(TASK).plan_id


def test_a_plan_override_does_not_drop_the_environment_anchor(store: castore.Store) -> None:
    """Accepting plan drift accepts nothing else: the environment anchor is kept."""
    new_plan = castore.Plan.build(
        "report", "fetch", castore.effect("pay", "fetch"), "publish", "archive"
    )
    old = castore.env_digest("v1")
    with store.start(TASK, PLAN, env=old) as run:
        run.commit_step("fetch", 1)
    store.override(TASK, who=WHO, why="archive reports from now on", plan=new_plan)
    assert old == store.verify(TASK).head.env
    with pytest.raises(castore.EnvironmentDriftError):
        store.resume(TASK, new_plan, env=castore.env_digest("something else"))


@pytest.mark.parametrize(("who", "why"), [("", WHY), (WHO, ""), ("  ", WHY), (WHO, " \t")])
def test_override_without_who_or_why_is_a_usage_error(
    store: castore.Store, who: str, why: str
) -> None:
    """An override must say who and why: UsageError, and the store is unchanged."""
    with store.start(TASK, PLAN, env=castore.env_digest("v1")) as run:
        run.commit_step("fetch", 1)
    before = tree_snapshot(store.root)
    with pytest.raises(castore.UsageError):
        store.override(TASK, who=who, why=why, env=castore.env_digest("v2"))
    assert before == tree_snapshot(store.root)
    with pytest.raises(castore.EnvironmentDriftError):
        store.resume(TASK, PLAN, env=castore.env_digest("v2"))


@pytest.mark.parametrize(
    "error",
    [
        castore.ChainError,
        castore.PlanDriftError,
        castore.EnvironmentDriftError,
        castore.KeylessEffectError,
        castore.MalformedFrontierError,
    ],
)
def test_every_gate_refusal_is_a_resume_refused_castore_error(error: type[Exception]) -> None:
    """Each gate exception is a ResumeRefusedError, under the one root CastoreError."""
    assert (True, True) == (
        issubclass(error, castore.ResumeRefusedError),
        issubclass(error, castore.CastoreError),
    )
