"""Growing plans (format v2): steps decided at run time, the rolling plan digest, replay."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import attrs
import blake3
import pytest
from sealing import seal_often  # noqa: F401 - a fixture

import castore
import castore.chain.outcomes
from castore import Plan, Position
from castore.format.codec import unframe
from castore.format.fastdecode import decode_canonical
from castore.format.history import illegal_changes
from castore.format.plans import head_digest, roll_digest
from castore.format.records import Grown, Snapshot, Step, TransitionKind
from castore.maintenance.fsck import check_store

ARGS = "a" * 64
SERVICE = castore.Service("payments", idempotent=True, retention=timedelta(hours=1))


def _agent(run: castore.Run) -> list[object]:
    """A small agent loop: a journaled think, a note, an effect, the end."""
    seen: list[object] = []
    if run.at("think-1", args=ARGS) is Position.PENDING:
        run.commit_step("think-1", {"plan": "charge"}, args=ARGS)
    seen.append(run.result("think-1"))
    run.append("note-1", "charging")
    seen.append(run.perform("charge-1", SERVICE, lambda key: f"r-{key}"))
    run.finish()
    return seen


def test_growing_task_commits_resumes_and_replays(store: castore.Store) -> None:
    """A growing task's decisions are durable: a resume replays every position as DONE."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        first = _agent(run)
        assert run.finished
        assert run.head.grown is not None
        assert 3 == run.head.grown.steps
    store.verify("t")
    with store.resume("t", plan) as run:
        assert 0 == run.position
        assert first == _agent(run)
        assert 3 == run.position
    assert store.status("t").finished


def test_growing_waiting_task_is_not_finished(store: castore.Store) -> None:
    """A growing task whose frontier is empty waits for a decision: it is not finished."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        run.append("a", 1)
        assert not run.finished
        assert run.next_step is None
    status = store.status("t")
    assert not status.finished
    assert "run" == status.next_action


def test_plan_digest_rolls_per_decision(store: castore.Store) -> None:
    """d(0) is the plan id; each decision rolls it by the documented formula."""
    plan = Plan.grow("agent", "setup")
    with store.start("t", plan) as run:
        d0 = run.plan_digest
        assert castore.plan_id(plan) == d0
        run.commit_step("setup", None)
        assert d0 == run.plan_digest  # a base step decides nothing
        run.at("think", args=ARGS)
        d1 = roll_digest(d0, Step("think"), ARGS)
        assert d1 == run.plan_digest
        run.commit_step("think", 2, args=ARGS)
        assert d1 == head_digest(run.head)
        run.append("note", 3)
        assert roll_digest(d1, Step("note"), None) == run.plan_digest


def test_decide_snapshot_takes_the_fast_decode_path(store: castore.Store) -> None:
    """A DECIDE snapshot (nested omitted fields) decodes in C, to the record written."""
    with store.start("t", Plan.grow("agent")) as run:
        run.at("pay", effect=True, args=ARGS)
        data = store.objects.read(run.head_id)
        assert run.head == decode_canonical(unframe(data)[1], Snapshot)
        record = run.head.effect("pay")
        assert record is not None
        assert castore.derive_step_key("t", "pay") == record.key


def test_fixed_plan_snapshot_stays_v1(store: castore.Store) -> None:
    """A fixed plan's snapshots keep version 1 frames and no grown field."""
    with store.start("t", Plan.build("p", "a", "b")) as run:
        run.commit_step("a", 1)
        data = store.objects.read(run.head_id)
        assert data.startswith(b"castore 1 snapshot ")
        assert b"grown" not in data
        assert b"decided" not in data


def test_replay_drift_names_position_recorded_and_requested(store: castore.Store) -> None:
    """Asking for another step at a recorded position is PlanDriftError with its fields."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        run.append("search", 1)
        run.append("read", 2)
    with store.resume("t", plan) as run:
        run.at("search")
        with pytest.raises(castore.PlanDriftError) as caught:
            run.at("write")
    error = caught.value
    assert isinstance(error, castore.ReplayDriftError)
    assert (1, "read", "write") == (error.position, error.recorded, error.requested)


def test_replay_args_drift(store: castore.Store) -> None:
    """A journaled call replayed with other arguments is drift naming both digests."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        run.at("ask", args=ARGS)
        run.commit_step("ask", "answer", args=ARGS)
    with store.resume("t", plan) as run, pytest.raises(castore.ReplayDriftError) as caught:
        run.at("ask", args="b" * 64)
    assert (ARGS, "b" * 64) == (caught.value.recorded_args, caught.value.requested_args)


def test_pending_decision_resumes_as_pending(store: castore.Store) -> None:
    """A step decided before a stop is PENDING on resume, with its decision's checks."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        assert Position.PENDING == run.at("ask", args=ARGS)
    with store.resume("t", plan) as run:
        with pytest.raises(castore.ReplayDriftError):
            run.at("ask", args="c" * 64)
        assert Position.PENDING == run.at("ask", args=ARGS)
        run.commit_step("ask", "answer", args=ARGS)


def test_repeated_step_id_is_refused(store: castore.Store) -> None:
    """Deciding a step id the task already has is StepRepeatedError naming its position."""
    with store.start("t", Plan.grow("agent", "setup")) as run:
        run.commit_step("setup", None)
        run.append("x", 1)
        with pytest.raises(castore.StepRepeatedError) as caught:
            run.append("x", 2)
        with pytest.raises(castore.StepRepeatedError):
            run.at("setup")
        assert ("x", 1) == (caught.value.step, caught.value.first)
        assert run.head.grown is not None
        assert 1 == run.head.grown.steps


def test_empty_plans(store: castore.Store) -> None:
    """An empty growing plan starts; an empty fixed plan is still refused."""
    with store.start("g", Plan.grow("agent")) as run:
        assert run.grows
    with pytest.raises(castore.UsageError, match="no steps"):
        store.start("f", Plan.build("empty"))


def test_v1_store_refuses_growing_plan(tmp_path: Path) -> None:
    """A format-1 store refuses a growing plan with a clear error, writing nothing."""
    root = castore.Store.init(tmp_path / "s").root
    marker = Path(root) / "castore.json"
    marker.write_bytes(b'{"format":"castore","version":1}\n')
    store = castore.Store.open(root)
    with pytest.raises(castore.UsageError, match="upgrade"):
        store.start("t", Plan.grow("agent"))
    assert [] == store.tasks()


def test_forged_growth_is_illegal(store: castore.Store) -> None:
    """A link that decides a step without rolling the digest right is an illegal change."""
    with store.start("t", Plan.grow("agent")) as run:
        parent = run.head
        run.append("a", 1)
        child = run.head
    assert [] == illegal_changes(parent, child)
    assert child.grown is not None
    forged = attrs.evolve(child, grown=Grown(child.grown.steps, "0" * 64))
    assert illegal_changes(parent, forged)
    undecided = attrs.evolve(child, transition=attrs.evolve(child.transition, decided=None))
    assert illegal_changes(parent, undecided)


def test_finish_refused_while_effect_open(store: castore.Store) -> None:
    """finish() is refused while a decided effect is open, naming it."""
    with store.start("t", Plan.grow("agent")) as run:
        run.at("pay", effect=True)
        with pytest.raises(castore.UsageError, match="pay"):
            run.finish()
        assert TransitionKind.DECIDE is run.head.transition.kind


def test_fixed_plan_at_replays(store: castore.Store) -> None:
    """`at` works on a fixed plan: DONE for done steps, drift for another step."""
    plan = Plan.build("p", "a", "b")
    with store.start("t", plan) as run:
        assert Position.PENDING == run.at("a")
        run.commit_step("a", 1)
    with store.resume("t", plan) as run:
        assert Position.DONE == run.at("a")
        with pytest.raises(castore.ReplayDriftError):
            run.at("c")


def test_step_key_and_digest_follow_the_documented_formulas() -> None:
    """The per-step key and the rolling digest are the byte formulas of FORMAT.md 7.3/7.9."""
    assert "cas-71871c7a394114b4d6da2c246ef65920562c90ca" == castore.derive_step_key("t", "pay")
    d0 = "0" * 64
    entry = b'{"args":null,"effect":true,"id":"pay"}'
    expected = blake3.blake3(b"castore-plan-step\0" + d0.encode() + b"\0" + entry).hexdigest()
    assert expected == roll_digest(d0, Step("pay", effect=True), None)


def _sealed_agent(run: castore.Run, steps: int) -> list[object]:
    """A loop of journaled calls and effects, the sealing thread drained after each."""
    seen: list[object] = []
    for i in range(steps):
        if i % 3 == 2:
            seen.append(run.perform(f"pay-{i}", SERVICE, lambda key: f"r-{key}"))
        else:
            if run.at(f"ask-{i}", args=f"{i:064x}") is Position.PENDING:
                run.commit_step(f"ask-{i}", f"answer-{i}", args=f"{i:064x}")
            seen.append(run.result(f"ask-{i}"))
        if run._sealer is not None:
            run._sealer.drain()
    return seen


@pytest.mark.usefixtures("seal_often")
def test_sealed_growing_task_resumes_and_replays(store: castore.Store) -> None:
    """A growing task sealed into packs many times over resumes and replays every position
    from its packs (outcome index and args), then goes on."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        first = _sealed_agent(run, 30)
    chain = store.verify("t")
    assert 3 <= len(chain.outcomes.pack_refs)
    with store.resume("t", plan) as run:
        assert first == _sealed_agent(run, 30)
        run.append("after", 1)
        assert 31 == run.position
        with pytest.raises(castore.StepRepeatedError) as caught:
            run.append("ask-1", 2)  # its outcome is in the oldest pack
        assert 1 == caught.value.first


@pytest.mark.usefixtures("seal_often")
def test_drift_at_a_sealed_position_names_the_recorded_step(store: castore.Store) -> None:
    """The error path finds the step recorded at a position deep in the packs."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        _sealed_agent(run, 20)
    with store.resume("t", plan) as run, pytest.raises(castore.ReplayDriftError) as caught:
        run.at("something-else")
    assert (0, "ask-0") == (caught.value.position, caught.value.recorded)


def test_effect_kind_drift(store: castore.Store) -> None:
    """A plain step replayed as an effect (or the reverse) is drift that says so."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        run.append("look", 1)
    with store.resume("t", plan) as run, pytest.raises(castore.ReplayDriftError) as caught:
        run.perform("look", SERVICE, lambda key: "r")
    assert "a plain step was recorded, an effect is asked for" in str(caught.value)


def test_cursor_past_a_pending_step_is_refused(store: castore.Store) -> None:
    """Asking for the next step while the decided one is not done is a UsageError."""
    with store.start("t", Plan.grow("agent")) as run:
        run.at("a")
        with pytest.raises(castore.UsageError, match="decided and not done"):
            run.at("b")
        assert run.head.grown is not None
        assert 1 == run.head.grown.steps


def test_finished_task_refuses_more_and_finish_repeats(store: castore.Store) -> None:
    """After finish, a new step is refused; finish again commits nothing."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        run.append("a", 1)
        head = run.finish()
        assert head == run.finish()
        with pytest.raises(castore.UsageError, match="finished"):
            run.at("b")
    with store.resume("t", plan) as run:
        assert Position.DONE == run.at("a")
        assert run.head_id == run.finish()


def test_grown_past_the_limit_is_refused(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A growing plan past MAX_GROWN_STEPS is PlanTooLongError; nothing is committed."""
    monkeypatch.setattr(castore.format.limits, "MAX_GROWN_STEPS", 2)
    with store.start("t", Plan.grow("agent")) as run:
        run.append("a", 1)
        run.at("b")
        run.commit_step("b", 2)
        seq = run.head.seq
        with pytest.raises(castore.PlanTooLongError, match="2 steps"):
            run.append("c", 3)
        assert seq == run.head.seq


def test_status_and_fsck_of_growing_tasks(store: castore.Store) -> None:
    """status tells steps decided and the plan digest; fsck finds nothing wrong."""
    with store.start("t", Plan.grow("agent", "setup")) as run:
        run.commit_step("setup", None)
        run.at("pay", effect=True)
        digest = run.plan_digest
    status = store.status("t")
    assert (1, digest, "pay", False) == (
        status.decided,
        status.plan_digest,
        status.step,
        status.finished,
    )
    assert "submit" == status.next_action
    with store.start("fixed", Plan.build("p", "a")) as run:
        pass
    assert "decided" not in store.status("fixed").to_dict()
    assert [] == [f.code for f in check_store(store.root, jobs=1)]


def test_fork_of_a_growing_task_replays_its_outcomes(store: castore.Store) -> None:
    """A fork carries a growing task's decisions and outcomes (with their positions and
    argument digests): it replays them as DONE and decides on; its effect gets a new key."""
    plan = Plan.grow("agent")
    with store.start("src", plan) as run:
        run.at("ask", args=ARGS)
        run.commit_step("ask", "answer", args=ARGS)
        run.append("note", 1)
        run.at("pay", effect=True)
        seq = run.head.seq
    store.fork(("src", seq), "copy")
    with store.resume("copy", plan) as run, pytest.raises(castore.ReplayDriftError):
        run.at("ask", args="b" * 64)  # the carried outcome has its argument digest
    with store.resume("copy", plan) as run:
        assert Position.DONE == run.at("ask", args=ARGS)
        assert Position.DONE == run.at("note", args=ARGS)  # recorded without: not compared
        record = run.head.effect("pay")
        assert record is not None
        assert castore.derive_step_key("copy", "pay") == record.key
        assert "r" == run.perform("pay", SERVICE, lambda key: "r")
        run.finish()
    store.verify("copy")


def test_override_cannot_change_a_growing_plan(store: castore.Store) -> None:
    """A plan override of a growing task is refused; an environment override still works."""
    plan = Plan.grow("agent")
    with store.start("t", plan, env="env:1") as run:
        run.append("a", 1)
    with pytest.raises(castore.UsageError, match="grows"):
        store.override("t", who="ann", why="new plan", plan=Plan.grow("agent", "x"))
    store.override("t", who="ann", why="moved", env="env:2")
    with store.resume("t", plan, env="env:2") as run:
        assert Position.DONE == run.at("a")


def test_resolve_a_growing_effect_moves_on(store: castore.Store) -> None:
    """A person's decision on a decided effect confirms it; the task waits for the next."""
    plan = Plan.grow("agent")

    def send(key: str) -> str:
        assert castore.derive_step_key("t", "pay") == key
        raise TimeoutError("the service did not answer")  # it stays SUBMITTED

    with store.start("t", plan) as run, pytest.raises(TimeoutError):
        run.perform("pay", SERVICE, send)
    store.resolve("t", "pay", receipt="r-1", who="ann")
    with store.resume("t", plan) as run:
        assert "r-1" == run.perform("pay", SERVICE, lambda key: "never")
        assert run.next_step is None


@pytest.mark.usefixtures("seal_often")
def test_replay_from_the_start_reads_each_pack_a_bounded_number_of_times(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay from position 0 with more packs than the index cache holds reads each pack
    a few times, not once per position (the look-up goes to the one pack holding the step)."""
    plan = Plan.grow("agent")
    with store.start("t", plan) as run:
        for i in range(80):
            run.append(f"s{i}", i)
            if run._sealer is not None:
                run._sealer.drain()
    monkeypatch.setattr(castore.chain.outcomes, "_CACHED_STEPS", 16)  # two packs' indexes
    reads: list[str] = []
    original = castore.chain.outcomes.Outcomes._read

    def counted(
        self: castore.chain.outcomes.Outcomes, pack: castore.chain.outcomes.PackRef
    ) -> object:
        reads.append(pack.id)
        return original(self, pack)

    monkeypatch.setattr(castore.chain.outcomes.Outcomes, "_read", counted)
    with store.resume("t", plan) as run:
        packs = len(run._outcomes.pack_refs)
        for i in range(80):
            assert Position.DONE == run.at(f"s{i}")
    assert 8 <= packs
    assert len(reads) <= 4 * packs
