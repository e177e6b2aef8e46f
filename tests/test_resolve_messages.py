"""`castore resolve TASK STEP` on a step with nothing to decide says what the step is: not in
the plan (listing the effect steps), a plain step, an effect settled already, or not sent."""

from __future__ import annotations

import pytest
from helpers import cli, tree_snapshot

import castore

TASK = "order-3"
PLAN = castore.Plan.build(
    "checkout", "price", castore.effect("charge", "price"), castore.effect("email", "charge")
)


def _charged(store: castore.Store) -> None:
    """ "price" done, "charge" CONFIRMED (receipt ch_1), "email" PLANNED at the frontier."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("price", 4200)
        run.perform("charge", castore.Service("payments"), lambda key: "ch_1")


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            "nosuch",
            "task 'order-3' has no step 'nosuch' in its plan (its effect steps: charge, email)",
        ),
        ("price", "step 'price' of task 'order-3' is a plain step, not an effect step"),
        (
            "charge",
            "effect 'charge' of task 'order-3' is settled already: CONFIRMED with receipt 'ch_1'",
        ),
        ("email", "effect 'email' of task 'order-3' is PLANNED, not in flight"),
    ],
    ids=["not-in-plan", "plain-step", "settled", "not-sent"],
)
def test_resolve_says_why_there_is_nothing_to_decide(
    store: castore.Store, capsys: pytest.CaptureFixture[str], step: str, message: str
) -> None:
    """Library and CLI: UsageError (exit 2), one line naming what the step is, nothing written."""
    _charged(store)
    before = tree_snapshot(store.root)
    with pytest.raises(castore.UsageError) as caught:
        store.resolve(TASK, step, not_done=True, reason="checked", who="ana@ops")
    assert str(caught.value).startswith(message), str(caught.value)
    assert "castore status" in str(caught.value)
    assert "is not open" not in str(caught.value)
    code, out, err = cli(
        capsys, "--store", str(store.root), "resolve", TASK, step, "--confirmed", "r"
    )
    assert (2, "") == (code, out)
    assert message in err
    assert 1 == len(err.strip().splitlines())
    assert before == tree_snapshot(store.root)


GROWN = "ticket-9"


def _grown(store: castore.Store) -> None:
    """A growing plan: plain 'think-1' done, effect 'refund-1' CONFIRMED (receipt re_1),
    plain 'lookup-2' done, effect 'email-2' decided (PLANNED), 'note-3' nowhere."""
    with store.start(GROWN, castore.Plan.grow("support")) as run:
        run.call("think-1", lambda: {"tool": "refund"})
        run.perform("refund-1", castore.Service("payments"), lambda key: "re_1")
        run.append("lookup-2", {"status": "paid"})
        run.at("email-2", effect=True)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("note-3", "task 'ticket-9' has no step 'note-3': its plan grows, and no step of that id"),
        ("think-1", "step 'think-1' of task 'ticket-9' is a plain step, not an effect step"),
        ("lookup-2", "step 'lookup-2' of task 'ticket-9' is a plain step, not an effect step"),
        (
            "refund-1",
            "effect 'refund-1' of task 'ticket-9' is settled already: CONFIRMED with receipt "
            "'re_1'",
        ),
        ("email-2", "effect 'email-2' of task 'ticket-9' is PLANNED, not in flight"),
    ],
    ids=["never-decided", "journaled-call", "appended", "settled", "decided-not-sent"],
)
def test_resolve_on_a_growing_plan_says_what_the_step_is(
    store: castore.Store, capsys: pytest.CaptureFixture[str], step: str, message: str
) -> None:
    """A growing plan's steps are told apart as a fixed plan's are (not all 'no step')."""
    _grown(store)
    before = tree_snapshot(store.root)
    with pytest.raises(castore.UsageError) as caught:
        store.resolve(GROWN, step, not_done=True, reason="checked", who="ana@ops")
    assert str(caught.value).startswith(message), str(caught.value)
    code, out, err = cli(
        capsys, "--store", str(store.root), "resolve", GROWN, step, "--confirmed", "r"
    )
    assert (2, "") == (code, out)
    assert message in err
    assert 1 == len(err.strip().splitlines())
    assert before == tree_snapshot(store.root)
