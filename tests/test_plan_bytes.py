"""The plan's bytes (hence its digest, hence every effect key) are the same whichever path
encodes them: the fast one for plain steps, the general one through cattrs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from castore.errors import EncodingError
from castore.format import codec, plans
from castore.format.digest import hash_bytes
from castore.format.records import Plan, Step

step_ids = st.text(min_size=1, max_size=12)


@st.composite
def plan_values(draw: st.DrawFn) -> Plan:
    ids = draw(st.lists(step_ids, min_size=1, max_size=8, unique=True))
    steps = []
    for index, step_id in enumerate(ids):
        after = tuple(draw(st.lists(st.sampled_from(ids[:index]), max_size=2))) if index else ()
        steps.append(Step(step_id, draw(st.booleans()), after))
    meta = draw(
        st.dictionaries(
            st.text(max_size=5),
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**63 - 1)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=5),
            max_size=3,
        )
    )
    return Plan(draw(st.text(max_size=10)), tuple(steps), meta)


@given(plan_values())
def test_fast_and_general_plan_bytes_agree(plan: Plan) -> None:
    """Any plan: the same framed bytes as the general record encoding."""
    assert codec.encode_record("plan", plan) == plans.plan_bytes(plan)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(Step("a\ud800"), id="lone-surrogate"),
        pytest.param(Step(type("Id", (str,), {})("a")), id="str-subclass"),
    ],
)
def test_a_step_outside_the_data_model_is_refused_as_before(step: Step) -> None:
    """What the general path refuses, plan_bytes refuses the same way (never encodes)."""
    with pytest.raises(EncodingError):
        plans.plan_bytes(Plan("p", (step,)))


def test_a_step_of_unusual_types_takes_the_general_path() -> None:
    """A step the fast path cannot vouch for (an int where a bool belongs) is encoded as the
    general path encodes it, not as msgspec would."""
    plan = Plan("p", (Step("a", 1),))  # type: ignore[arg-type]
    assert codec.encode_record("plan", plan) == plans.plan_bytes(plan)


@given(plan_values())
def test_a_plan_encoded_in_slices_is_the_same_bytes(plan: Plan) -> None:
    """Long plans are encoded a slice of steps at a time: with slices of one and two steps the
    bytes and the digest are still the general encoding's."""
    whole = codec.encode_record("plan", plan)
    saved = plans._SLICE
    try:
        for size in (1, 2):
            plans._SLICE = size
            assert whole == plans.plan_bytes(plan)
            fresh = Plan(plan.name, plan.steps, dict(plan.meta))  # no digest remembered
            assert hash_bytes(whole) == plans.plan_id(fresh)
    finally:
        plans._SLICE = saved
