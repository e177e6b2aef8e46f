"""Resuming and opening a task by its plan's id (issue 26 item 4): the run gets the plan
stored with the task, the caller's plan is neither built nor hashed, and the gate refuses a
task of another plan as it refuses a changed plan."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

import castore
from castore.aio import AsyncStore
from castore.chain.planread import read_plan
from castore.format import codec, plans
from castore.format.fastdecode import decode_canonical
from castore.format.limits import MAX_DEPTH
from castore.format.records import Plan, Step

PLAN = Plan.build("ship", "fetch", castore.effect("charge", "fetch"), "report", owner="ann")
OTHER = Plan.build("other", "a", "b")


def _no_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any plan is encoded for its digest."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a plan was encoded for its digest")

    monkeypatch.setattr(plans, "_plan_pieces", refuse)


def test_resume_by_plan_id_runs_the_stored_plan_without_hashing_one(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store.start("t", PLAN) as run:
        run.commit_step("fetch", {"n": 1})
        plan_id = run.plan_id
    _no_digest(monkeypatch)
    with store.resume("t", plan_id=plan_id) as run:
        assert PLAN == run.plan
        assert "charge" == next(iter(run.pending()))
        assert {"n": 1} == run.result("fetch")
        assert plan_id == plans.plan_id(run.plan)  # remembered from the stored bytes
    with store.open_task("t", plan_id=plan_id) as run:
        assert 1 == run.head.seq


def test_a_task_of_another_plan_is_refused_and_nothing_is_written(
    store: castore.Store, tree_snapshot: object
) -> None:
    with store.start("t", PLAN):
        pass
    other_id = store.put_plan(OTHER)
    before = tree_snapshot(store.root)  # type: ignore[operator]
    with pytest.raises(castore.PlanDriftError, match="resumed by plan_id") as caught:
        store.resume("t", plan_id=other_id)
    assert (plans.plan_id(PLAN), other_id) == (caught.value.expected, caught.value.actual)
    assert before == tree_snapshot(store.root)  # type: ignore[operator]


@pytest.mark.parametrize(
    "arguments",
    [{}, {"plan": PLAN, "plan_id": "0" * 64}],
    ids=["neither", "both"],
)
def test_the_plan_or_its_id_exactly_one(store: castore.Store, arguments: dict[str, Any]) -> None:
    with store.start("t", PLAN):
        pass
    for call in (store.resume, store.open_task):
        with pytest.raises(castore.UsageError, match="not both, not neither"):
            call("t", **arguments)


@pytest.mark.parametrize("hostile", ["../../etc/passwd", "A" * 64, 7, ""])
def test_a_hostile_plan_id_is_refused_before_any_read(
    store: castore.Store, hostile: object
) -> None:
    with store.start("t", PLAN):
        pass
    with pytest.raises(castore.CastoreError):
        store.resume("t", plan_id=hostile)  # type: ignore[arg-type]


def test_open_task_starts_a_new_task_from_a_stored_plan(store: castore.Store) -> None:
    plan_id = store.put_plan(PLAN)
    with store.open_task("new", plan_id=plan_id) as run:
        assert PLAN == run.plan
        run.commit_step("fetch", 1)
    with store.resume("new", PLAN) as run:  # the same task as one started with the object
        assert 1 == run.result("fetch")


def test_open_task_by_the_id_of_a_plan_not_in_the_store(store: castore.Store) -> None:
    with pytest.raises(castore.UsageError, match="not in this store: store it first"):
        store.open_task("new", plan_id=plans.plan_id(OTHER))
    assert [] == store.tasks()


def test_a_stored_plan_that_is_not_valid_is_refused_at_start(store: castore.Store) -> None:
    """A forged plan object (it hashes to its id, its steps repeat an id) starts nothing."""
    body = codec.encode_value(
        {"meta": {}, "name": "forged", "steps": [{"after": [], "effect": False, "id": "a"}] * 2}
    )
    forged = store.objects.put_framed(codec.frame("plan", body))
    with pytest.raises(castore.UsageError, match="twice"):
        store.open_task("new", plan_id=forged)
    assert [] == store.tasks()


def test_a_growing_task_resumes_by_plan_id(store: castore.Store) -> None:
    with store.start("agent", Plan.grow("agent")) as run:
        run.append("think", "a")
        plan_id = run.plan_id
    with store.resume("agent", plan_id=plan_id) as run:
        assert "a" == run.result("think")
        run.append("think", "a")  # replayed, not run again
        run.append("act", "b")
    with store.resume("agent", Plan.grow("agent")) as run:
        assert 2 == run.head.seq


def test_the_fast_plan_read_agrees_with_the_strict_one(store: castore.Store) -> None:
    plan = Plan("p", (Step("a"), Step("b", True, ("a",))), meta={"k": [1, {"x": None}]}, grows=True)
    plan_id = store.put_plan(plan)
    body = store.objects.get(plan_id, "plan")
    assert plan == decode_canonical(body, Plan)
    assert plan == codec.from_builtins(codec.decode_value(body), Plan)
    assert plan == read_plan(store.objects, "t", plan_id)


def test_a_plan_whose_meta_nests_too_deep_takes_the_strict_path_and_is_refused() -> None:
    """The plan's depth check looks at meta alone: the plan's dict is level 1, meta level 2,
    so meta may hold MAX_DEPTH - 2 more levels. The fast path agrees with the strict one."""
    for extra, allowed in ((MAX_DEPTH - 2, True), (MAX_DEPTH - 1, False)):
        deep = b"[" * extra + b"0" + b"]" * extra
        body = b'{"meta":{"deep":%s},"name":"p","steps":[]}' % deep
        fast = decode_canonical(body, Plan)
        if allowed:
            assert fast is not None
            assert codec.decode_value_strict(body)["meta"] == codec.to_builtins(fast.meta)
        else:
            assert fast is None
            with pytest.raises(ValueError, match="nested"):
                codec.decode_value_strict(body)


def test_decoding_a_long_plan_leaves_the_collector_as_it_was(store: castore.Store) -> None:
    plan = Plan.build("long", *(f"s{i}" for i in range(30_000)))  # > 1 MB of body
    body = store.objects.get(store.put_plan(plan), "plan")
    assert len(body) > 1 << 20
    assert gc.isenabled()
    assert plan == decode_canonical(body, Plan)
    assert gc.isenabled()
    gc.disable()
    try:
        assert plan == decode_canonical(body, Plan)
        assert not gc.isenabled()  # the caller's choice, kept
    finally:
        gc.enable()


def test_the_async_store_resumes_by_plan_id(store: castore.Store) -> None:
    with store.start("t", PLAN) as run:
        run.commit_step("fetch", 1)
        plan_id = run.plan_id

    async def resume() -> object:
        astore = AsyncStore(store.root)
        async with await astore.open_task("t", plan_id=plan_id) as arun:
            return await arun.result("fetch")

    assert 1 == asyncio.run(resume())
