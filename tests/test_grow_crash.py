"""An agent loop on a growing plan, SIGKILLed between a decision and its work and inside an
effect: restarted until it finishes, it redoes no recorded work and applies no effect twice."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import spawn_child

import castore
from castore.run.settings import derive_step_key

TASK = "agent/1"
ROUNDS = 3
DEADLINE = 60.0

# The child: a loop of a journaled "model" call and an effect per round, then finish. Every
# piece of work is appended (fsynced) to a log outside castore before it is committed, and
# the fake service applies a key once (it is idempotent), logging every request it receives.
AGENT = """
import json, os, sys
from datetime import timedelta
import castore
from castore import Position

root, log_path = sys.argv[1], sys.argv[2]

def log(**entry):
    with open(log_path, "a") as out:
        out.write(json.dumps(entry) + "\\n")
        out.flush()
        os.fsync(out.fileno())

def send(key):
    log(kind="send", key=key)
    return "receipt-" + key

service = castore.Service("shop", idempotent=True, retention=timedelta(hours=1))
plan = castore.Plan.grow("agent")
with castore.Store.open(root).open_task(sys.argv[3], plan) as run:
    answers = []
    for i in range(int(sys.argv[4])):
        args = format(i, "064x")
        if run.at(f"think-{i}", args=args) is Position.PENDING:
            log(kind="think", step=f"think-{i}")
            run.commit_step(f"think-{i}", f"answer-{i}", args=args)
        answers.append(run.result(f"think-{i}"))
        answers.append(run.perform(f"buy-{i}", service, send))
    run.finish()
print(json.dumps(answers), flush=True)
"""


def _run_agent(
    children: list[subprocess.Popen[str]], root: str, log: Path, crash: str | None
) -> subprocess.Popen[str]:
    proc = spawn_child(children, AGENT, root, str(log), TASK, str(ROUNDS), crash=crash)
    proc.wait(DEADLINE)
    return proc


def _log(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expected() -> list[str]:
    found = []
    for i in range(ROUNDS):
        found += [f"answer-{i}", "receipt-" + derive_step_key(TASK, f"buy-{i}")]
    return found


@pytest.mark.parametrize(
    "crash",
    [
        "grow.decided:1",  # think-0 decided, its model call not made
        "grow.decided:2",  # buy-0 decided (PLANNED, key durable), nothing submitted
        "grow.decided:4",  # buy-1 decided
        "effect.submitted:1",  # buy-0 SUBMITTED, its request not sent
        "effect.sent:2",  # buy-1 applied by the service, CONFIRMED not committed
        "commit.done:3",  # think-0's result durable (seq 2), not acknowledged
        "commit.before_link:3",  # think-0's model call made, its result not committed
    ],
)
def test_killed_agent_resumes_without_redoing_recorded_work(
    store: castore.Store, children: list[subprocess.Popen[str]], tmp_path: Path, crash: str
) -> None:
    """Killed at `crash`, then restarted: same answers as an uninterrupted run, every model
    call made at most once more than recorded (only the one in flight at the kill), every
    effect sent with its one stable key and applied once."""
    log = tmp_path / "log.jsonl"
    killed = _run_agent(children, store.root, log, crash)
    assert -signal.SIGKILL == killed.returncode, killed.communicate()[1]
    before = _log(log)
    committed = set(store.verify(TASK).outcomes)
    done = _run_agent(children, store.root, log, None)
    out, err = done.communicate()
    assert 0 == done.returncode, err
    assert _expected() == json.loads(out)
    entries = _log(log)
    thinks = [e["step"] for e in entries if e["kind"] == "think"]
    in_flight = {e["step"] for e in before if e["kind"] == "think"} - committed
    assert sorted(set(thinks)) == [f"think-{i}" for i in range(ROUNDS)]
    # Only a model call in flight at the kill (made, its result not committed) is made again.
    assert len(in_flight) == len(thinks) - ROUNDS
    keys = [e["key"] for e in entries if e["kind"] == "send"]
    assert {derive_step_key(TASK, f"buy-{i}") for i in range(ROUNDS)} == set(keys)
    sent_in_flight = {e["key"] for e in before if e["kind"] == "send"} - {
        derive_step_key(TASK, step) for step in committed
    }
    assert len(sent_in_flight) == len(keys) - ROUNDS  # resent with the same key, applied once
    store.verify(TASK)
    assert store.status(TASK).finished
