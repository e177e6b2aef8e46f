"""Journaled calls (castore.run.journal): a call runs once, its result is recorded, a replay
returns the recording without calling again; the payload rules apply to the result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import castore
from castore.errors import EncodingError, ReplayDriftError, SecretInPayloadError, UsageError
from castore.run import protocol
from castore.run.journal import INLINE_RESULT_BYTES, args_digest

TASK = "agent-1"
PLAN = castore.Plan.build("agent", "think", "answer", castore.effect("send", "answer"))
# A credential shape (an OpenAI-style key): the guard refuses it in any stored field.
LEAKED = "sk-" + "a1b2c3d4" * 5


class Model:
    """A fake model that counts the calls it serves."""

    def __init__(self, reply: Callable[[str], Any] = lambda prompt: {"content": prompt.upper()}):
        self.calls: list[str] = []
        self._reply = reply

    def complete(self, prompt: str) -> Any:
        self.calls.append(prompt)
        return self._reply(prompt)


def test_call_runs_once_and_replays_recorded_result(store: castore.Store) -> None:
    """A done call returns its recorded result on resume without calling the function."""
    model = Model()
    with store.start(TASK, PLAN) as run:
        assert {"content": "HI"} == run.call("think", model.complete, "hi")
    with store.resume(TASK, PLAN) as run:
        assert {"content": "HI"} == run.call("think", model.complete, "hi")
        assert "answer" == run.next_step
    assert ["hi"] == model.calls


def test_args_digest_is_canonical() -> None:
    """The argument digest ignores keyword order and tells different arguments apart."""
    first = args_digest(("p",), {"a": 1, "b": [2, 3]})
    assert first == args_digest(["p"], {"b": [2, 3], "a": 1})
    assert first != args_digest(("p",), {"a": 1, "b": [2, 4]})
    assert 64 == len(first)


def test_args_digest_refuses_objects_naming_the_argument() -> None:
    """An argument outside the data model is a clear EncodingError naming it."""
    with pytest.raises(EncodingError, match=r"keyword client.*bind other objects"):
        args_digest((), {"client": object()})


def test_large_result_goes_to_a_blob(store: castore.Store) -> None:
    """A result over the inline limit is recorded by reference and replays equal."""
    big = {"content": "x" * (INLINE_RESULT_BYTES + 1)}
    with store.start(TASK, PLAN) as run:
        assert big == run.call("think", lambda: big)
        outcome = run.outcome("think")
        assert None is outcome.result
        assert outcome.result_ref is not None
        assert "blob" == store.objects.kind_of(outcome.result_ref)
    with store.resume(TASK, PLAN) as run:
        assert big == run.call("think", lambda: None)


def test_bytes_result_is_stored_raw(store: castore.Store) -> None:
    """A bytes result is a raw object; a replay returns the same bytes."""
    with store.start(TASK, PLAN) as run:
        assert b"\x00\xffaudio" == run.call("think", lambda: bytearray(b"\x00\xffaudio"))
        ref = run.outcome("think").result_ref
        assert ref is not None
        assert "raw" == store.objects.kind_of(ref)
    with store.resume(TASK, PLAN) as run:
        assert b"\x00\xffaudio" == run.call("think", lambda: b"other")


def test_first_result_is_what_replay_returns(store: castore.Store) -> None:
    """The first call returns the recorded form, so a replay cannot return something else."""
    with store.start(TASK, PLAN) as run:
        first = run.call("think", lambda: {"pair": (1, 2)})
    with store.resume(TASK, PLAN) as run:
        assert first == run.call("think", lambda: None)
    assert {"pair": [1, 2]} == first


def test_unencodable_result_commits_nothing(store: castore.Store) -> None:
    """A result outside the data model is an EncodingError naming the call; nothing is recorded."""
    with store.start(TASK, PLAN) as run:
        seq = run.head.seq
        with pytest.raises(
            EncodingError, match=r"call 'think' of task .*: the result's field 'usage' is a set"
        ):
            run.call("think", lambda: {"usage": {1, 2}})
        assert seq == run.head.seq
        assert not run.done("think")
        assert {"ok": True} == run.call("think", lambda: {"ok": True})


def test_secret_in_result_is_refused_with_the_vouch_advice(store: castore.Store) -> None:
    """A credential in a call's result is refused before any commit, saying how to vouch."""
    with store.start(TASK, PLAN) as run:
        seq = run.head.seq
        with pytest.raises(SecretInPayloadError, match=r"castore\.vouch") as caught:
            run.call("think", lambda: {"content": f"your key is {LEAKED}"})
        assert "$.transition.result.content" in caught.value.path
        assert seq == run.head.seq


def test_large_secret_result_is_refused_too(store: castore.Store) -> None:
    """The guard judges a result headed for a blob as well (it is stored all the same)."""
    big = {"content": LEAKED + " " + "x" * INLINE_RESULT_BYTES}
    with store.start(TASK, PLAN) as run, pytest.raises(SecretInPayloadError):
        run.call("think", lambda: big)


def test_vouched_field_is_recorded_and_replayed(store: castore.Store) -> None:
    """castore.vouch(fn, "$.content") trusts that field: recorded (as a blob) and replayed."""
    reply = {"content": f"example: {LEAKED}", "role": "assistant"}
    with store.start(TASK, PLAN) as run:
        assert reply == run.call("think", castore.vouch(lambda: reply, "$.content"))
        assert run.outcome("think").result_ref is not None
    with store.resume(TASK, PLAN) as run:
        assert reply == run.call("think", castore.vouch(lambda: {}, "$.content"))


def test_vouch_covers_only_named_fields(store: castore.Store) -> None:
    """A vouched field does not let a credential through elsewhere in the result."""
    reply = {"content": "fine", "note": LEAKED}
    with store.start(TASK, PLAN) as run, pytest.raises(SecretInPayloadError, match=r"\$\.note"):
        run.call("think", castore.vouch(lambda: reply, "$.content"))


def test_vouch_whole_result(store: castore.Store) -> None:
    """castore.vouch(fn) trusts the whole result."""
    with store.start(TASK, PLAN) as run:
        assert LEAKED == run.call("think", castore.vouch(lambda: LEAKED))


def test_call_on_an_effect_step_is_refused_before_calling(store: castore.Store) -> None:
    """run.call on an effect step is a UsageError and the function never runs."""
    model = Model()
    with store.start(TASK, PLAN) as run:
        run.commit_step("think")
        run.commit_step("answer")
        with pytest.raises(UsageError, match=r"is an effect"):
            run.call("send", model.complete, "x")
    assert [] == model.calls


def test_call_out_of_order_is_refused_before_calling(store: castore.Store) -> None:
    """A call for a step that is not next is refused and the function never runs."""
    model = Model()
    with store.start(TASK, PLAN) as run, pytest.raises(UsageError, match=r"not the next step"):
        run.call("answer", model.complete, "x")
    assert [] == model.calls


def test_sync_call_of_a_coroutine_function_is_refused(store: castore.Store) -> None:
    """Run.call refuses an async function (it would record a coroutine)."""

    async def complete() -> str:
        return "never"

    with store.start(TASK, PLAN) as run, pytest.raises(UsageError, match=r"castore\.aio"):
        run.call("think", complete)


def test_perform_steps_yields_one_send_after_submitted(store: castore.Store) -> None:
    """The perform generator asks for one send, with the key, once SUBMITTED is durable;
    closing it there (a failed or cancelled send) leaves the effect SUBMITTED."""
    service = castore.Service("mail", idempotent=True, retention=86400)
    with store.start(TASK, PLAN) as run:
        run.commit_step("think")
        run.commit_step("answer")
        steps = protocol.perform_steps(run, "send", service, None)
        request = next(steps)
        newest = max(store.history(TASK), key=lambda entry: entry[1].seq)[1]
        record = newest.effect("send")
        assert record is not None
        assert (castore.EffectState.SUBMITTED, record.key) == (record.state, request.key)
        steps.close()
        assert castore.EffectState.SUBMITTED == run.head.effects[0].state
        assert "r-1" == run.perform("send", service, lambda key: "r-1")


# -- growing plans: the call goes through the replay cursor (run.at) ------------------------
GROWING = castore.Plan.grow("agent-loop")


def test_growing_call_decides_before_calling_and_replays(store: castore.Store) -> None:
    """On a growing plan the call's step and argument digest are durable before the
    function runs; the agent's code rerun from the top replays it without calling."""
    seen: list[tuple[str | None, str | None]] = []

    def model(prompt: str) -> dict[str, str]:
        head = castore.Store.open(store.root).verify(TASK).head
        seen.append((head.frontier.step, head.transition.args))
        return {"content": prompt * 2}

    with store.start(TASK, GROWING) as run:
        assert {"content": "abab"} == run.call("think", model, "ab")
        assert {"content": "cdcd"} == run.call("reflect", model, "cd")
    with store.resume(TASK, GROWING) as run:
        assert {"content": "abab"} == run.call("think", model, "ab")
        assert {"content": "cdcd"} == run.call("reflect", model, "cd")
        assert (2, 2) == (run.position, run.head.grown.steps if run.head.grown else None)
    assert [("think", args_digest(("ab",), {})), ("reflect", args_digest(("cd",), {}))] == seen


def test_growing_call_with_other_arguments_at_a_done_position_is_drift(
    store: castore.Store,
) -> None:
    """A replay that calls a done position with other arguments is ReplayDriftError naming
    both digests, and the function is not called."""
    model = Model()
    with store.start(TASK, GROWING) as run:
        run.call("think", model.complete, "first prompt")
    with store.resume(TASK, GROWING) as run, pytest.raises(castore.PlanDriftError) as caught:
        run.call("think", model.complete, "another prompt")
    assert ["first prompt"] == model.calls
    assert isinstance(caught.value, ReplayDriftError)
    expected = (0, args_digest(("first prompt",), {}), args_digest(("another prompt",), {}))
    assert expected == (
        caught.value.position,
        caught.value.recorded_args,
        caught.value.requested_args,
    )


def test_growing_call_of_another_step_at_a_done_position_is_drift(store: castore.Store) -> None:
    """A replay that asks for another step where a call was recorded is drift."""
    with store.start(TASK, GROWING) as run:
        run.call("think", lambda: 1)
    with store.resume(TASK, GROWING) as run, pytest.raises(ReplayDriftError, match=r"'think'"):
        run.call("plan", lambda: 2)


def test_growing_call_that_failed_runs_again_with_the_same_arguments(
    store: castore.Store,
) -> None:
    """A call whose function raised stays decided, not done: the rerun calls it again (same
    arguments), and other arguments there are drift."""
    model = Model(reply=lambda prompt: {"ok": prompt})
    with store.start(TASK, GROWING) as run:
        with pytest.raises(ZeroDivisionError):
            run.call("think", lambda prompt: 1 / 0, "p")
        assert ("think", False) == (run.next_step, run.done("think"))
    with store.resume(TASK, GROWING) as run, pytest.raises(ReplayDriftError):
        run.call("think", model.complete, "q")
    with store.resume(TASK, GROWING) as run:
        assert {"ok": "p"} == run.call("think", model.complete, "p")
    assert ["p"] == model.calls


def test_fixed_plan_call_with_other_arguments_is_drift(store: castore.Store) -> None:
    """On a fixed plan too (format 2 records the digest), other arguments for a done call
    are drift."""
    with store.start(TASK, PLAN) as run:
        run.call("think", lambda prompt: prompt, "a")
    with store.resume(TASK, PLAN) as run, pytest.raises(ReplayDriftError):
        run.call("think", lambda prompt: prompt, "b")


def test_growing_agent_loop_replays_calls_and_effects(store: castore.Store) -> None:
    """A loop of calls and an effect on a growing plan, rerun whole after it finished,
    calls nothing and sends nothing again."""
    service = castore.Service("mail", idempotent=True, retention=86400)
    model, sent = Model(), []

    def agent(run: castore.Run) -> str:
        reply = run.call("think-1", model.complete, "draft")
        receipt = run.perform("send-1", service, lambda key: sent.append(key) or "r-1")
        run.append("log-1", {"reply": reply, "receipt": receipt})
        run.finish()
        return receipt

    with store.start(TASK, GROWING) as run:
        first = agent(run)
    with store.resume(TASK, GROWING) as run:
        assert first == agent(run)
        assert run.finished
    assert (["draft"], 1) == (model.calls, len(sent))


def test_growing_unencodable_result_leaves_the_step_decided(store: castore.Store) -> None:
    """On a growing plan a result outside the data model records nothing but the decision:
    the step stays decided, not done, and the rerun calls it again."""
    with store.start(TASK, GROWING) as run:
        with pytest.raises(EncodingError, match=r"the step's decision was \(committed"):
            run.call("think", object)
        assert ("think", False) == (run.next_step, run.done("think"))
    with store.resume(TASK, GROWING) as run:
        assert "ok" == run.call("think", lambda: "ok")


@pytest.mark.parametrize(
    ("result", "error"),
    [(object(), EncodingError), ({"note": LEAKED}, SecretInPayloadError)],
    ids=["unencodable", "credential"],
)
def test_growing_refused_result_says_the_decision_was_committed(
    store: castore.Store, result: object, error: type[Exception]
) -> None:
    """A refused result on a growing plan says the decision was committed at its position
    and to run the same code again, never that nothing was recorded nor to commit a value
    in the call's place; the same code on the reopened task calls the function again."""
    with store.start(TASK, GROWING) as run:
        run.append("look", 1)
        with pytest.raises(error) as caught:
            run.call("think", lambda: result)
        decided = run.head.seq
    message = str(caught.value)
    assert "nothing was recorded" not in message
    assert "commit_step" not in message
    assert "decision was (committed before the call, at position 1" in message
    assert "run the same code on the task again (store.open_task)" in message
    with store.open_task(TASK, GROWING) as run:
        assert (decided, "think") == (run.head.seq, run.next_step)
        assert None is run.append("look", 1)
        assert "ok" == run.call("think", lambda: "ok")


def test_fixed_plan_refused_result_records_nothing(store: castore.Store) -> None:
    """On a fixed plan nothing is committed before the call: the message says so."""
    with store.start(TASK, PLAN) as run:
        seq = run.head.seq
        with pytest.raises(EncodingError) as caught:
            run.call("think", object)
        assert seq == run.head.seq
    assert "nothing was recorded" in str(caught.value)
    assert "commit_step" not in str(caught.value)


def test_growing_call_that_raised_is_not_told_to_commit_a_value(store: castore.Store) -> None:
    """A journaled call that raised leaves its step decided; asked again in that run it is
    called again (retry in place), asking for another step first says to do this one's work
    with the call that decided it, never to commit a value in its place, and the reopened task
    calls the function again."""

    def timeout() -> str:
        raise TimeoutError("the model did not answer")

    with store.start(TASK, GROWING) as run:
        with pytest.raises(TimeoutError):
            run.call("think", timeout)
        with pytest.raises(UsageError) as other:
            run.call("act", lambda: 1)
        with pytest.raises(TimeoutError):
            run.call("think", timeout)  # the same step again: its work runs again
    assert "commit_step" not in str(other.value)
    assert "do its work first, with the call that decided it" in str(other.value)
    with store.open_task(TASK, GROWING) as run:
        assert "ok" == run.call("think", lambda: "ok")
