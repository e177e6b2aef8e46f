"""A plan's validation and digest are remembered per Plan object (issue 26): a process that
resumes a long fixed plan again neither re-checks nor re-hashes it, and a plan whose meta
changed, or which could change, is never answered from the memo."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

import castore
from castore.format import planmemo, plans
from castore.format.digest import hash_bytes
from castore.format.records import Plan, Step


def _count_encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time a plan's steps are encoded."""
    calls: list[int] = []
    real = plans._plan_pieces

    def counted(plan: Plan, **how: Any) -> list[bytes | memoryview]:
        calls.append(len(plan.steps))
        return real(plan, **how)

    monkeypatch.setattr(plans, "_plan_pieces", counted)
    return calls


def test_one_plan_object_is_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_encodings(monkeypatch)
    plan = Plan.build("memo", "a", "b", "c")
    first = plans.plan_id(plan)
    assert first == plans.plan_id(plan)
    assert [3] == calls
    assert first == plans.plan_id(Plan.build("memo", "a", "b", "c"))  # a new object: hashed
    assert [3, 3] == calls


def test_a_changed_meta_is_hashed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_encodings(monkeypatch)
    plan = Plan.build("memo", "a", "b", owner="ann")
    before = plans.plan_id(plan)
    plan.meta["owner"] = "bob"  # a Plan is frozen, its meta dict is not
    after = plans.plan_id(plan)
    assert before != after
    assert after == plans.plan_id(Plan.build("memo", "a", "b", owner="bob"))
    assert 3 == len(calls)


def test_validation_is_remembered_only_when_it_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real, fast = plans._validate, plans._valid_plain

    def counted(check: Any) -> Any:
        def call(plan: Plan, **how: bool) -> Any:
            checked.append(plan.name)
            return check(plan, **how)

        return call

    monkeypatch.setattr(plans, "_validate", counted(real))
    monkeypatch.setattr(plans, "_valid_plain", counted(fast))
    good = Plan.build("good", "a", "b")
    plans.validate_plan(good)
    plans.validate_plan(good)
    assert ["good"] == checked
    bad = Plan("bad", (Step("a"), Step("a")))
    for _ in range(2):  # refused every time: a failure is never remembered as a pass
        with pytest.raises(castore.UsageError, match="twice"):
            plans.validate_plan(bad)
    # "bad": the fast check says "look closer", the step-by-step one refuses.
    assert ["good", "bad", "bad", "bad", "bad"] == checked


def test_a_plan_that_could_change_is_not_remembered() -> None:
    """A step id of a str subclass (its value could be anything a subclass makes it) or a
    list where a tuple belongs: no memo, the plan is checked and hashed at every use."""
    odd_id = type("Id", (str,), {})("a")
    listed = Step("b", after=["a"])  # type: ignore[arg-type]
    for plan in (Plan("p", (Step(odd_id),)), Plan("p", (Step("a"), listed))):
        assert plans._memo(plan) is None


def test_the_memo_goes_with_its_plan() -> None:
    plan = Plan.build("gone", "a")
    plans.plan_id(plan)
    key = id(plan)
    assert key in planmemo._MEMO
    del plan
    gc.collect()
    assert key not in planmemo._MEMO


def test_resume_again_with_one_plan_object(tmp_path: Path) -> None:
    """The same plan object resumes its task again; with its meta changed, the task's plan
    is not the caller's any more and the gate says so, as for any other plan."""
    store = castore.Store.init(str(tmp_path / "store"))
    plan = Plan.build("job", "a", "b", owner="ann")
    with store.start("t", plan) as run:
        run.commit_step("a", 1)
    for _ in range(2):
        with store.resume("t", plan) as run:
            assert run.done("a")
            assert not run.done("b")
    plan.meta["owner"] = "bob"
    with pytest.raises(castore.PlanDriftError):
        store.resume("t", plan)


def _chained_plan(name: str, *ids: str, **meta: Any) -> Plan:
    """The plan `Plan.build` made step by step before it had a path of its own for ids."""
    steps = [Step(ids[0])] + [Step(step_id, after=(ids[n],)) for n, step_id in enumerate(ids[1:])]
    return Plan(name, tuple(steps), meta)


@pytest.mark.parametrize(
    "ids", [("a",), ("a", "b"), tuple(f"s{n}" for n in range(5000)), ("é", "x y", "\u00e9")]
)
def test_a_plan_built_from_ids_is_the_plan_the_step_by_step_build_makes(ids: tuple[str]) -> None:
    built = Plan.build("job", *ids, owner="ann")
    assert _chained_plan("job", *ids, owner="ann") == built
    assert plans.plan_id(_chained_plan("job", *ids, owner="ann")) == plans.plan_id(built)
    grown = Plan.grow("job", *ids)
    assert Plan("job", built.steps, {}, grows=True) == grown
    for plan in (built, grown):
        memo = plans._memo(plan)
        assert memo is not None
        assert memo.chained
        assert not memo.valid


_SLICE_EDGE = plans._SLICE  # the chain text is written a slice of ids at a time


@pytest.mark.parametrize(
    ("ids", "written"),
    [
        (("only",), True),
        (("a", "b"), True),
        (tuple(f"s{n}" for n in range(2 * _SLICE_EDGE + 1)), True),  # three slices
        (tuple(f"s{n}" for n in range(_SLICE_EDGE)), True),  # exactly one
        # A no-break space does not print (str.isprintable): the encoder decides.
        (("é", "x y", "中文", "😀", "a/b", "<&>", "'", "no\u00a0break"), False),
        (("é", "x y", "中文", "😀", "a/b", "<&>", "'", "~"), True),
        ((*(f"s{n}" for n in range(_SLICE_EDGE + 5)), 'say "hi"'), False),
        (("back\\slash", "b"), False),
    ],
)
def test_a_built_plans_text_is_its_canonical_encoding(ids: tuple[str, ...], written: bool) -> None:
    """The digest of a plan built from ids is made from text written around the ids (issue
    26): it is the canonical encoding, byte for byte, across slice boundaries and for ids of
    any script; an id the canonical encoding escapes (a quote, a backslash) or that does not
    print is left to the encoder, which escapes it."""
    built = Plan.build("job", *ids, owner="ann")
    memo = plans._memo(built)
    assert memo is not None
    assert memo.ids == ids
    canonical = plans._general_bytes(built, None)
    assert written == (plans._chain_text(ids) is not None)
    assert canonical == b"".join(plans._plan_pieces(built, plain=True, ids=ids))
    assert hash_bytes(canonical) == plans.plan_id(built)


def test_a_built_plan_is_checked_by_its_ids_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its shape is not looked at, nor its steps walked for their ids: the memo has them."""
    shapes: list[int] = []
    read_ids: list[str] = []
    real, real_id = plans._chain_or_none, plans._ID

    def counted(steps: tuple[Step, ...], ids: list[str]) -> bool:
        shapes.append(len(steps))
        return real(steps, ids)

    def id_of(step: Step) -> str:
        read_ids.append(step.id)
        return real_id(step)

    monkeypatch.setattr(plans, "_chain_or_none", counted)
    monkeypatch.setattr(plans, "_ID", id_of)
    built = Plan.build("built", "a", "b", "c")
    assert ("a", "b", "c") == planmemo.known(built).ids  # type: ignore[union-attr]
    plans.validate_plan(built)
    assert ([], []) == (shapes, read_ids)
    plans.validate_plan(_chained_plan("made", "a", "b", "c"))  # no vouch: its shape is looked at
    assert [3] == shapes
    assert {"a", "b", "c"} == set(read_ids)  # collected from its steps


@pytest.mark.parametrize(
    ("ids", "refusal"),
    [
        (("a", "b", "a"), "twice"),
        (("a", "x\tb"), "not printable"),
        (("a", ""), "non-empty"),
        (("x" * (plans.MAX_STEP_ID + 1),), "non-empty"),
    ],
)
def test_a_built_plan_of_bad_ids_is_refused_as_any_plan_is(ids: tuple[str], refusal: str) -> None:
    plan = Plan.build("bad", *ids)
    memo = plans._memo(plan)
    assert memo is not None
    assert memo.chained
    for _ in range(2):
        with pytest.raises(castore.UsageError, match=refusal):
            plans.validate_plan(plan)
    assert not memo.valid


def test_a_plan_built_from_steps_or_odd_ids_is_not_vouched_for() -> None:
    odd_id = type("Id", (str,), {})("b")
    with_step = Plan.build("mixed", "a", Step("b", after=("zz",)))
    assert with_step.steps == (Step("a"), Step("b", after=("zz",)))
    memo = plans._memo(with_step)
    assert memo is not None
    assert not memo.chained
    with pytest.raises(castore.UsageError, match="not an earlier step"):
        plans.validate_plan(with_step)
    odd = Plan.build("odd", "a", odd_id)
    assert odd.steps == (Step("a"), Step(odd_id, after=("a",)))
    assert plans._memo(odd) is None


_SHAPES = [
    Plan.build("chain", "a", "b", "c"),
    Plan("flat", (Step("a"), Step("b"), Step("c"))),
    Plan("fan-in", (Step("a"), Step("b"), Step("c", after=("a", "b")))),
    Plan("self", (Step("a"), Step("b", after=("a", "b")), Step("c"))),
    Plan("forward", (Step("a", after=("b",)), Step("b"))),
    Plan("unknown", (Step("a"), Step("b", after=("zz",)))),
    Plan("twice", (Step("a"), Step("b", after=("a",)), Step("a", after=("b",)))),
    Plan("empty-id", (Step(""),)),
    Plan("long-id", (Step("x" * (plans.MAX_STEP_ID + 1)),)),
    Plan("tab", (Step("a\tb"),)),
    Plan("no-steps", ()),
    Plan.grow("grows"),
    Plan("bad-grows", (Step("a"),), grows=False),
    Plan("shifted", (Step("a"), Step("b", after=("a",)), Step("c", after=("a",)))),
]


@pytest.mark.parametrize("plan", _SHAPES, ids=[plan.name for plan in _SHAPES])
def test_the_whole_sequence_check_never_passes_what_the_step_check_refuses(plan: Plan) -> None:
    """`_valid_plain` may say "look closer" (False) for a valid plan, never True for an
    invalid one: the step-by-step `_validate` is the definition."""
    try:
        plans._validate(plan)
    except castore.UsageError:
        assert not plans._valid_plain(plan)
    else:
        if plan.name in ("chain", "flat", "grows"):
            assert plans._valid_plain(plan)  # the shapes it exists for
