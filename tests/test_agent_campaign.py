"""The sample agent under fire: small campaigns, sync and async, in every service mode, judged
again here from the ledger and the model's bill; the fake model itself; and the proof that the
judge catches a re-billed call, a duplicate and a differing answer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import castore
from castore.lab import agent_judge, fakemodel
from castore.lab.agent_campaign import AgentSettings, Lab, check_task, recorded, run_campaign
from castore.lab.agent_judge import Attempt
from castore.lab.fakemodel import FakeModel, read_model_log
from castore.lab.service import applied_counts, read_ledger

ROOT = Path(__file__).resolve().parent.parent
RUNS = 2
SEED = 3


def conversation(seed: str) -> list[fakemodel.Reply]:
    """Every reply of the model to a conversation fed its tools' results (no castore)."""
    messages: list[fakemodel.Message] = [{"role": "user", "content": "go"}]
    replies = []
    while True:
        reply = fakemodel.decide(seed, messages)
        replies.append(reply)
        if "answer" in reply:
            return replies
        messages.append({"role": "assistant", "content": reply})
        tool, args = reply["tool"], reply["args"]
        if tool in fakemodel.EFFECTS:
            observed = {"receipt": "r-1"}
        else:
            observed = (fakemodel.lookup if tool == "lookup" else fakemodel.stock)(args["sku"])
        messages.append({"role": "tool", "content": {"tool": tool, **observed}})


def test_fake_model_is_deterministic_and_varies_with_the_seed() -> None:
    """The same seed gives the same replies; seeds give conversations of several lengths."""
    assert conversation("7") == conversation("7")
    lengths = {len(conversation(str(seed))) for seed in range(40)}
    assert len(lengths) >= 4
    kinds = {r.get("tool") for seed in range(40) for r in conversation(str(seed))}
    assert {*fakemodel.TOOLS, *fakemodel.EFFECTS, None} == kinds


def test_fake_model_bills_each_call_and_survives_a_torn_line(tmp_path: Path) -> None:
    """Every call is a whole line of the bill; a torn tail left by a kill is cut, not glued."""
    log = tmp_path / "model.jsonl"
    messages: list[fakemodel.Message] = [{"role": "user", "content": "go"}]
    model = FakeModel("1", log)
    first = model.complete("t", "think-0", messages)
    model.close()
    with log.open("ab") as handle:
        handle.write(b'{"task":"t","st')  # a kill in the middle of a write
    assert 1 == len(read_model_log(log))
    again = FakeModel("1", log)
    assert first == again.complete("t", "think-0", messages)
    again.close()
    digest = fakemodel.messages_digest(messages)
    expected = [{"task": "t", "step": "think-0", "args": digest, "pid": os.getpid()}] * 2
    assert expected == read_model_log(log)
    assert log.read_bytes().endswith(b"}\n")


def test_judge_tells_rebilled_calls_from_inflight_repeats() -> None:
    """A call repeated after its result was committed is re-billed; one repeated because the
    kill came before the commit is an in-flight repeat; a bill no attempt made is stray."""
    line = {"task": "t", "args": "d"}
    log = [
        {**line, "step": "think-0", "pid": 1},
        {**line, "step": "think-1", "pid": 1},  # killed before think-1 was committed
        {**line, "step": "think-1", "pid": 2},
        {**line, "step": "think-0", "pid": 3},  # think-0 was committed: paid twice
        {**line, "step": "think-0", "pid": 9},
    ]
    attempts = [
        Attempt("t", 1, frozenset()),
        Attempt("t", 2, frozenset({"think-0"})),
        Attempt("t", 3, frozenset({"think-0", "think-1"})),
    ]
    bills = agent_judge.judge_bills(log, attempts)
    assert (5, 1, 1, 1) == (bills.calls, bills.rebilled, bills.inflight_repeats, bills.stray)
    clean = agent_judge.judge_bills(log[:3], attempts[:2])
    assert (0, 1, []) == (clean.rebilled, clean.inflight_repeats, clean.problems)


def check_files(lab: Lab) -> None:
    """Judge again from the files alone: each key applied once, each bill a journaled call."""
    counts = applied_counts(lab.ledger)
    assert {} == {key: n for key, n in counts.items() if n != 1}
    store = castore.Store.open(lab.store_path)
    bills = Counter((e["task"], e["step"]) for e in read_model_log(lab.model_log))
    for index in range(lab.tally.runs):
        task = f"agent-{SEED}-{index}"
        assert True is store.status(task).finished
        chain = store.verify(task)
        thoughts = {step for step in chain.outcomes if step.startswith("think-")}
        assert thoughts == {step for t, step in bills if t == task}
        assert lab.expected[index] == recorded(lab, chain.outcomes["answer"])


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", ["idempotent", "lookup", "none"])
def test_small_agent_campaign_bills_and_applies_once(
    tmp_path: Path, mode: str, use_async: bool
) -> None:
    """Killed at random and at named points, the agent finishes with the uninterrupted answer,
    every effect applied once and no committed model call billed again."""
    lab = run_campaign(tmp_path, RUNS, AgentSettings(mode, SEED, use_async=use_async))
    tally = lab.tally
    assert (0, 0, 0) == (tally.duplicates, tally.rebilled, tally.differ), tally.problems
    assert (0, 0, 0) == (tally.lost, tally.corrupt, tally.other), tally.problems
    assert RUNS == tally.runs
    assert tally.kills >= RUNS
    check_files(lab)


def test_judge_catches_a_doctored_bill_ledger_and_answer(tmp_path: Path) -> None:
    """Fed a bill with a committed call paid again, a ledger with an operation applied twice
    and a wrong reference answer, the judge reports each: it can fail."""
    lab = run_campaign(tmp_path, 1, AgentSettings("lookup", SEED))
    assert True is lab.tally.ok, lab.tally.problems
    task = f"agent-{SEED}-0"
    done = frozenset(castore.Store.open(lab.store_path).verify(task).outcomes)
    log = read_model_log(lab.model_log)
    rebill = {**next(e for e in log if e["task"] == task), "pid": 999_999}
    bills = agent_judge.judge_bills([*log, rebill], [*lab.attempts, Attempt(task, 999_999, done)])
    assert 1 == bills.rebilled
    ledger = read_ledger(lab.ledger)
    assert (0, []) == agent_judge.duplicates(ledger)
    surplus, problems = agent_judge.duplicates([*ledger, ledger[0]])
    assert 1 == surplus
    assert [f"key {ledger[0]['key']} applied 2 times"] == problems
    check_task(lab, 0, {"text": "another answer"}, ledger)
    assert 1 == lab.tally.differ


def test_an_agent_that_asks_before_the_journal_is_caught_rebilling(tmp_path: Path) -> None:
    """A broken agent that calls the model before castore answers from the journal pays again
    for committed calls: the campaign reports rebilled > 0 from the model's bill."""
    lab = run_campaign(tmp_path, 3, AgentSettings("idempotent", SEED, pay_first=True))
    assert lab.tally.restarts > 0
    assert lab.tally.rebilled > 0, lab.tally
    assert False is lab.tally.ok
    assert 0 == lab.tally.differ


def test_agent_campaign_tool_ends_with_the_issue_line(tmp_path: Path) -> None:
    """tools/agent_campaign.py's last line is `agent runs= kills= duplicates= rebilled=
    inflight_repeats= differ= unresolved=` and it exits 0."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "agent_campaign.py"), "--runs", "1", "--seed", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert 0 == result.returncode, result.stdout + result.stderr
    words = result.stdout.strip().splitlines()[-1].split()
    assert "agent" == words[0]
    report = dict(word.split("=") for word in words[1:])
    keys = ["runs", "kills", "duplicates", "rebilled", "inflight_repeats", "differ", "unresolved"]
    assert keys == list(report)
    assert ("1", "0", "0", "0") == (
        report["runs"],
        report["duplicates"],
        report["rebilled"],
        report["differ"],
    )
