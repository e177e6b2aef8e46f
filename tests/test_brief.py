"""The resume brief (issue 14 item 4): content, determinism, the budget, cost, hostile content."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

import castore
from castore.chain.objects import ObjectStore
from castore.format.effects import Service
from castore.format.records import Plan, Step, effect
from castore.maintenance.sealing import seal_task
from castore.run import brief
from tests.helpers import cli, flip_bit, rewrite

BANK = Service("bank")  # neither idempotent nor reconcilable: an interruption is UNRESOLVED
AWS_KEY = "AKIA" + "ABCDEFGHIJKLMNOP"  # the shape the secret guard knows


def _plain_plan(count: int) -> Plan:
    return Plan.build("report", *[f"s{i}" for i in range(count)])


def _run_steps(run: castore.Run, steps: range) -> None:
    for i in steps:
        run.commit_step(f"s{i}", {"n": i})


def _interrupted(store: castore.Store, task: str = "order-17") -> castore.Run:
    """A task with three steps done and its charge SUBMITTED when its sender died."""
    plan = Plan.build("checkout", "a", "b", "c", effect("charge", "c"), Step("publish"))
    run = store.start(task, plan, env="env:v1")
    _run_steps_named(run, ["a", "b", "c"])
    with pytest.raises(RuntimeError), run.effect("charge", BANK):
        raise RuntimeError("the connection dropped after the request left")
    return run


def _run_steps_named(run: castore.Run, steps: list[str]) -> None:
    for step in steps:
        run.commit_step(step, {"step": step})


def test_brief_states_task_plan_steps_next_effects_and_env(store: castore.Store) -> None:
    """The brief names task, plan and digest, steps done with results, the next step, the
    open effect with state, key and action, and the environment anchor."""
    run = _interrupted(store)
    made = run.brief()
    record = run.head.effect("charge")
    assert record is not None
    assert f"task order-17, seq {run.head.seq}" in made.text
    assert f"plan checkout: fixed, 5 steps, digest {run.plan_id}" in made.text
    assert "done: 3 of 5 steps" in made.text
    assert "next: step charge (effect SUBMITTED, position 3) -> mark-unresolved" in made.text
    assert f"effect charge SUBMITTED, key {record.key}, age 0.0 s, attempts 1" in made.text
    assert '  c (seq 3): {"step":"c"}' in made.text
    assert "env anchor: env:v1" in made.text
    assert "SUBMITTED" == made.data["effects"][0]["state"]
    assert record.key == made.data["effects"][0]["key"]
    assert ["a", "b", "c"] == [item["step"] for item in made.data["recent"]]
    assert {"step": "c"} == made.data["recent"][-1]["result"]


def test_same_state_gives_same_bytes_from_run_store_and_cli(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's brief, the store's (HEAD read, or the whole chain verified) and the CLI's
    are byte for byte the same, and the same again later: no wall clock in them."""
    run = _interrupted(store)
    expected = run.brief().text
    run.close()
    assert expected == store.brief("order-17").text
    assert expected == store.brief("order-17", verify=True).text
    code, out, _ = cli(capsys, "--store", str(store.root), "brief", "order-17")
    assert (0, expected) == (code, out)
    code, out, _ = cli(capsys, "--store", str(store.root), "brief", "order-17", "--json")
    assert (0, {"type": "brief", **store.brief("order-17").data}) == (code, json.loads(out))
    assert 1 == out.count("\n")


def test_ages_count_to_a_given_now(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`now_ms` / `--now` counts ages to that time and says so; without it, HEAD's time."""
    run = _interrupted(store)
    record = run.head.effect("charge")
    assert record is not None
    later = record.since_ms + 90_000
    made = run.brief(now_ms=later)
    assert 90_000 == made.data["effects"][0]["age_ms"]
    assert "age 1.5 min" in made.text
    assert "(given)" in made.text
    assert "(HEAD's time)" in run.brief().text
    run.close()
    code, out, _ = cli(capsys, "--store", str(store.root), "brief", "order-17", "--now", str(later))
    assert (0, made.text) == (code, out)


def test_unresolved_effect_gives_the_exact_resolve_command(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An UNRESOLVED effect is shown with what a person must do: the `castore resolve`
    commands, which run as printed once RECEIPT is filled in."""
    task = "order 17's"  # a space and a quote: the command must quote them
    run = _interrupted(store, task)
    run.settle(BANK)
    made = run.brief()
    run.close()
    where = f"castore resolve {shlex.quote(task)} charge"
    assert f"    {where} --confirmed RECEIPT" in made.text
    assert f"    {where} --not-done --reason TEXT" in made.text
    assert "UNRESOLVED effect charge" in made.text
    assert [f"{where} --confirmed RECEIPT", f"{where} --not-done --reason TEXT"] == made.data[
        "unresolved"
    ][0]["resolve"]
    argv = shlex.split(made.data["unresolved"][0]["resolve"][0].replace("RECEIPT", "r-1"))
    code, _, err = cli(capsys, "--store", str(store.root), *argv[1:])
    assert (0, "") == (code, err)
    after = store.brief(task)
    assert [] == after.data["unresolved"]
    assert "charge" == after.data["recent"][-1]["step"]
    assert "r-1" == after.data["recent"][-1]["receipt"]


def test_a_finished_task_says_so(store: castore.Store) -> None:
    """A finished fixed plan: every step done, nothing next."""
    with store.start("done", _plain_plan(3)) as run:
        _run_steps(run, range(3))
        made = run.brief()
    assert "done: 3 of 3 steps, finished" in made.text
    assert "next: nothing, the task is finished" in made.text
    assert made.data["finished"]


def test_a_1000_step_task_briefs_within_2_kib_by_default(store: castore.Store) -> None:
    """Whatever the history, the default brief is at most 512 tokens (2,048 bytes) and states
    its own estimate, ceil(UTF-8 bytes / 4) of the whole text."""
    with store.start("long", _plain_plan(1000)) as run:
        _run_steps(run, range(1000))
        made = run.brief()
    size = len(made.text.encode("utf-8"))
    assert size <= 2048
    assert math.ceil(size / 4) == made.tokens == made.data["tokens"]
    assert f"{made.tokens} tokens estimated as ceil(utf8_bytes / 4), budget 512" in made.text
    assert "last 5 of 1000 done:" in made.text


def test_a_small_budget_drops_items_and_says_so(store: castore.Store) -> None:
    """At the smallest budget the lines every brief has stay, and what did not fit is counted."""
    run = _interrupted(store)
    made = run.brief(budget_tokens=brief.MIN_BUDGET)
    assert len(made.text.encode()) <= 4 * brief.MIN_BUDGET
    assert "next: step charge" in made.text
    assert "env anchor: env:v1" in made.text
    hidden = sum(made.data["omitted"].values())
    assert (hidden > 0) == ("not shown:" in made.text)
    with pytest.raises(castore.UsageError, match="at least 256"):
        run.brief(budget_tokens=brief.MIN_BUDGET - 1)


def test_hostile_results_break_neither_budget_nor_lines(store: castore.Store) -> None:
    """Control characters, a line separator, vouched credentials (a result, the anchor) and a
    huge blob result: each is escaped, withheld or referenced; lines and budget hold."""
    plan = _plain_plan(4)
    allow = ["$.transition.result", "$.env"]
    with store.start("hostile", plan, allow_fields=allow, env=f"host {AWS_KEY}") as run:
        run.commit_step("s0", "red\x1b[31m\nforged line\u2028")
        run.commit_step("s1", {"token": AWS_KEY})
        run.commit_step("s2", store.put_blob("x" * 1_000_000))
        run.commit_step("s3", "y" * 10_000)
        made = run.brief(budget_tokens=brief.MIN_BUDGET)
        full = run.brief()
    for text in (made.text, full.text):
        assert len(text.encode()) <= 4 * brief.MIN_BUDGET
        assert AWS_KEY not in text
        assert "\x1b" not in text
        assert "\u2028" not in text
        assert all(line.isprintable() for line in text.splitlines())
    assert "forged line" not in [line.strip() for line in full.text.splitlines()]
    assert "looks like an AWS access key id" in full.text
    assert "env anchor: (not shown: looks like an AWS access key id)" in full.text
    assert "castore show hostile@4" in full.text  # the 10,000-byte inline result, by place
    assert "result stored by reference: castore show " in full.text


def test_longest_ids_and_texts_fit_the_smallest_budget(tmp_path: Path) -> None:
    """The longest task id, step ids of 4-byte characters, a huge plan name, anchor and
    reason: at MIN_BUDGET the brief still fits, each value clipped."""
    store = castore.Store.init(tmp_path / "store")
    task = "t" * 200
    step = "\U0001f600" * 200
    first = "a" + step[1:]
    plan = Plan("n" * 5000, (Step(first), Step(step, effect=True)))
    run = store.start(task, plan, env="e" * 5000)
    run.commit_step(first, "r" * 150)
    with pytest.raises(RuntimeError), run.effect(step, BANK):
        raise RuntimeError("dropped")
    run.settle(BANK)
    for budget in (brief.MIN_BUDGET, brief.DEFAULT_BUDGET):
        made = run.brief(budget_tokens=budget, now_ms=2**62)
        assert made.tokens <= budget
        assert len(made.text.encode()) <= 4 * budget
    assert "UNRESOLVED effect" in made.text  # its short form, when its commands do not fit
    run.close()


def test_sealed_long_task_briefs_from_the_tail_and_newest_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealed every 8 commits, a 400-step task's brief reads HEAD, the tail and the newest
    packs only (a bounded number of objects) and still shows its five newest steps."""
    monkeypatch.setattr(castore.store, "SEAL_EVERY", 8)
    store = castore.Store.init(tmp_path / "store")
    with store.start("sealed", _plain_plan(400)) as run:
        _run_steps(run, range(399))
        expected = run.brief()
    reads: list[str] = []
    real_read = ObjectStore.read

    def counting(self: ObjectStore, object_id: str) -> bytes:
        reads.append(object_id)
        return real_read(self, object_id)

    monkeypatch.setattr(ObjectStore, "read", counting)
    made = store.brief("sealed")
    assert [f"s{i}" for i in range(394, 399)] == [item["step"] for item in made.data["recent"]]
    assert expected.text == made.text
    assert len(reads) <= 12


def test_cli_errors_are_one_line_with_the_documented_codes(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """No such task: 2; a budget too small or not a number: 2; a broken chain: 3."""
    root = str(store.root)
    for argv, expected in (
        (("brief", "nope"), 2),
        (("brief", "nope", "--budget", "12"), 2),
        (("brief", "nope", "--budget", "many"), 2),
        (("brief", "nope", "--now", "soon"), 2),
    ):
        code, out, err = cli(capsys, "--store", root, *argv)
        assert (expected, "", 1) == (code, out, err.count("\n"))
    with store.start("broken", _plain_plan(3)) as run:
        _run_steps(run, range(2))
        parent = run.head.parent
    assert parent is not None
    rewrite(Path(store.objects.path(parent)), flip_bit)  # its slot too: one inode
    code, out, err = cli(capsys, "--store", root, "brief", "broken")
    assert (3, "", 1) == (code, out, err.count("\n"))
    assert "castore: error: task 'broken'" in err


def test_a_forgotten_task_says_who_ended_it(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tombstone at HEAD: the brief says forgotten, by whom and why, and lists no effect
    (nothing is left to do about them); `--verify` refuses the task as a resume would."""
    plan = Plan.build("p", "a", effect("charge", "a"))
    with store.start("gone", plan) as run:
        run.commit_step("a", 1)
    store.forget("gone", who="ops@example", why="customer cancelled")
    made = store.brief("gone")
    assert ([], []) == (made.data["effects"], made.data["unresolved"])  # its PLANNED charge
    assert "by ops@example: customer cancelled" in made.text
    assert "done" == made.data["next"]["action"]
    assert not made.data["finished"]
    code, out, err = cli(capsys, "--store", str(store.root), "brief", "gone", "--verify")
    assert (5, "", 1) == (code, out, err.count("\n"))


def test_a_growing_task_briefs_its_decided_steps_next_decision_and_finish(
    store: castore.Store,
) -> None:
    """A growing plan: the steps decided so far, the rolling digest at HEAD, "decide" while
    it waits, the decided effect next, and finished only after FINISH (a seal after it too)."""
    plan = Plan.grow("agent")
    bank = Service("bank", idempotent=True, retention=3600)
    with store.start("loop", plan) as run:
        for step in ("think-1", "note-1", "think-2"):
            run.append(step, {"said": step})
        waiting = run.brief()
        assert run.head.grown is not None
        assert (
            f"plan agent: growing, 3 steps so far (3 decided as it ran), digest "
            f"{run.head.grown.digest}" in waiting.text
        )
        assert run.head.grown.digest == waiting.data["plan"]["digest"] != run.plan_id
        assert "done: 3 steps\n" in waiting.text
        assert "next: the plan grows as the task runs" in waiting.text
        assert ("decide", None) == (waiting.data["next"]["action"], waiting.data["next"]["step"])
        run.decide("charge", effect=True)
        decided = run.brief()
        assert "next: step charge (effect PLANNED, position 3) -> submit" in decided.text
        assert 4 == decided.data["plan"]["decided"]
    assert decided.text == store.brief("loop").text
    with store.resume("loop", plan) as run:  # a restarted agent replays, then does the effect
        for step in ("think-1", "note-1", "think-2"):
            assert castore.Position.DONE == run.at(step)
        run.perform("charge", bank, lambda key: f"receipt-{key[:8]}")
        assert not run.brief().data["finished"]
        run.finish()
        finished = run.brief()
    assert "done: 4 steps, finished" in finished.text
    assert "next: nothing, the task is finished" in finished.text
    seal_task(store, "loop")  # a SEAL after FINISH: HEAD's kind no longer says it
    later = store.brief("loop")
    assert "seal" == store.verify("loop").head.transition.kind.value
    assert later.data["finished"]
    assert ["think-1", "note-1", "think-2", "charge"] == [r["step"] for r in later.data["recent"]]
    assert later.data["recent"][-1]["receipt"].startswith("receipt-")


def test_printing_a_brief_prints_its_text(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`print(run.brief())` prints the brief's text, not the record's repr."""
    run = _interrupted(store)
    made = run.brief()
    run.close()
    print(made)
    assert (made.text + "\n", made.text) == (capsys.readouterr().out, str(made))


def test_an_effects_age_counts_from_its_first_submission(tmp_path: Path) -> None:
    """Age is now minus the first submission (not minus the last state change, which makes
    an UNRESOLVED effect at HEAD always 0 s old); never negative; PLANNED: since planned."""
    now = [1_000_000]
    store = castore.Store.open(tmp_path / "s", create=True, clock=lambda: now[0])
    plan = Plan.build("checkout", "a", effect("charge", "a"), effect("refund", "charge"))
    with store.start("order-1", plan) as run:
        run.commit_step("a", 1)
        with pytest.raises(RuntimeError), run.effect("charge", BANK):
            raise RuntimeError("the connection dropped after the request left")
        now[0] += 1500
        run.settle(BANK)
        made = run.brief()
        assert [1500] == [e["age_ms"] for e in made.data["unresolved"]]
        assert "UNRESOLVED effect charge, key " in made.text
        assert "age 1.5 s" in made.text
        early = run.brief(now_ms=1_000_000 - 60_000)  # a clock behind the submission's
        assert [0] == [e["age_ms"] for e in early.data["unresolved"]]
    now[0] += 2000
    store.resolve("order-1", "charge", receipt="ch_1", who="ana@ops")
    with store.resume("order-1", plan) as run:
        planned = run.brief(now_ms=now[0] + 4000)
    assert [("refund", "PLANNED", 4000)] == [
        (e["step"], e["state"], e["age_ms"]) for e in planned.data["effects"]
    ]
