"""`castore demo`: a worker killed just after its payment went through, resumed, paying once."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import castore
from castore.crashpoints import ENV_VAR
from castore.format.model import attrs
from castore.lab import worker
from castore.lab.campaign import worker_command
from castore.lab.service import applied_counts, start_service

Say = Callable[[str], None]


@attrs.frozen
class DemoReport:
    task: str
    applied: dict[str, int]
    snapshots: int
    ok: bool


def _run_worker(
    store: Path, task: str, url: str, crash_at: str | None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if crash_at:
        env[ENV_VAR] = crash_at
    command = worker_command(store, task, url, "lookup", blind=False)
    # The sample worker, with paths this demo made: nothing untrusted.
    return subprocess.run(  # noqa: S603
        command, capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _next_task(store: castore.Store) -> str:
    taken = set(store.tasks())
    number = 1
    while f"demo-order-{number}" in taken:
        number += 1
    return f"demo-order-{number}"


def run_demo(path: str | os.PathLike[str], say: Say, command: str = "castore") -> DemoReport:
    """Kill a worker after the service committed its charge, resume it, show the evidence;
    the closing hint runs `command` (how the caller's shell reaches castore)."""
    store = castore.Store.open(path, create=True)
    task = _next_task(store)
    say(f"castore demo: store {store.root}, task {task}")
    with tempfile.TemporaryDirectory(prefix="castore-demo-") as scratch:
        ledger = Path(scratch) / "payments-ledger.jsonl"
        with start_service(ledger, "lookup") as service:
            say("1. The worker runs an order: quote, charge (a payment), reserve, ship, notify,")
            say("   summary.")
            say("   It will be killed right after the payment service commits the charge,")
            say("   before castore can record the receipt: the worst moment.")
            first = _run_worker(Path(store.root), task, service.url, "effect.sent:1")
            killed = first.returncode == -signal.SIGKILL
            say(
                f"   -> worker {'killed by SIGKILL' if killed else f'exited {first.returncode}'}; "
                f"the service's ledger now holds {len(applied_counts(ledger))} operation(s)."
            )
            status = store.status(task)
            charge = next((e for e in status.effects if e.step == "charge"), None)
            if charge is not None:
                say(f"2. castore status: charge is {charge.state} (key {charge.key});")
                say(f"   next action: {charge.next_action} ({charge.reason}).")
            say("3. A new worker resumes the task: castore verifies the chain, asks the payment")
            say("   service by idempotency key, finds the original charge, and continues.")
            second = _run_worker(Path(store.root), task, service.url, None)
            say(
                f"   -> worker exited {second.returncode}: {second.stdout.strip().splitlines()[-1]}"
            )
            applied = applied_counts(ledger)
        chain = store.verify(task)
    say("4. Evidence:")
    plan_digest = castore.plan_id(worker.PLAN)
    counts = {
        name: applied.get(castore.derive_key(task, plan_digest, name), 0) for name in worker.EFFECTS
    }
    for name, count in counts.items():
        say(f"   service ledger: {name} applied {count} time{'s' if count != 1 else ''}")
    say(f"   chain of {task}: {chain.length} snapshots, all verified from HEAD to the plan root")
    ok = killed and second.returncode == worker.EXIT_DONE and all(c == 1 for c in counts.values())
    say("OK: the charge was made once, nothing was lost." if ok else "FAILED: see above.")
    say(f"Look around: {command} --store {shlex.quote(store.root)} log {shlex.quote(task)}")
    return DemoReport(task, counts, chain.length, ok)
