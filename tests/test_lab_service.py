"""Tests for the crash lab's fake remote service, checked against its ledger file directly."""

# The project's test style is `assert expected == actual`, which SIM300 calls a Yoda condition.

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from castore.lab.service import (
    ConnectionDropped,
    LedgerCorruptError,
    LookupUnsupported,
    RequestRejected,
    ServiceClient,
    ServiceUnavailable,
    applied_counts,
    read_ledger,
    start_service,
)

DEADLINE_S = 5.0


def wait_until(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    """Poll a condition until it holds, failing after a deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.01)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A fresh ledger path per test."""
    return tmp_path / "ledger.jsonl"


def test_service_runs_as_its_own_process_on_loopback(ledger: Path) -> None:
    """The service is a separate process bound to 127.0.0.1 and exits 0 on SIGTERM."""
    svc = start_service(ledger, "none")
    try:
        health = svc.client().health()
        assert svc.pid == health["pid"]
        assert os.getpid() != svc.pid
        assert f"http://127.0.0.1:{svc.port}" == svc.url
        assert "none" == health["mode"]
    finally:
        code = svc.stop()
    assert 0 == code
    assert [] == read_ledger(ledger)


@pytest.mark.parametrize(("mode", "expected"), [("idempotent", 1), ("lookup", 2), ("none", 2)])
def test_applying_a_key_twice_counts_per_mode(ledger: Path, mode: str, expected: int) -> None:
    """Only idempotent mode dedupes a repeated key; the ledger file says how often it ran."""
    with start_service(ledger, mode) as svc:
        client = svc.client()
        first = client.apply_result("k", "charge", {"amount": 5})
        second = client.apply_result("k", "charge", {"amount": 5})
    assert {"k": expected} == applied_counts(ledger)
    assert (expected == 1) == second.duplicate
    assert (expected == 1) == (first.receipt == second.receipt)
    assert first.receipt.startswith("rcpt-")


def test_ledger_lines_have_the_documented_fields(ledger: Path) -> None:
    """Each application is one JSON line with seq, key, op, payload, receipt and time."""
    with start_service(ledger, "none") as svc:
        client = svc.client()
        receipt = client.apply("k", "charge", {"amount": 5})
        served = client.ledger()
    entries = read_ledger(ledger)
    assert served == entries
    assert 1 == len(entries)
    entry = entries[0]
    assert (1, "k", "charge", {"amount": 5}, receipt) == (
        entry["seq"],
        entry["key"],
        entry["op"],
        entry["payload"],
        entry["receipt"],
    )
    assert isinstance(entry["time"], float)


def test_lookup_finds_the_first_receipt_or_none(ledger: Path) -> None:
    """Lookup mode answers the first application's receipt, and None for an unknown key."""
    with start_service(ledger, "lookup") as svc:
        client = svc.client()
        first = client.apply("k/with spaces?&", "charge", 1)
        client.apply("k/with spaces?&", "charge", 1)
        assert first == client.lookup("k/with spaces?&")
        assert client.lookup("never") is None
    assert {"k/with spaces?&": 2} == applied_counts(ledger)


@pytest.mark.parametrize("mode", ["idempotent", "none"])
def test_lookup_is_unsupported_outside_lookup_mode(ledger: Path, mode: str) -> None:
    """Modes without lookup answer 501, which the client raises as LookupUnsupported."""
    with start_service(ledger, mode) as svc:
        client = svc.client()
        client.apply("k", "charge", 1)
        with pytest.raises(LookupUnsupported):
            client.lookup("k")


def test_idempotent_dedupe_expires_after_retention(ledger: Path) -> None:
    """After the retention window a repeated key is applied again, like a real service."""
    with start_service(ledger, "idempotent", retention_s=0.2) as svc:
        client = svc.client()
        first = client.apply("k", "charge", 1)
        assert first == client.apply("k", "charge", 1)
        receipts = [first]

        def applied_anew() -> bool:
            receipts.append(client.apply("k", "charge", 1))
            return receipts[-1] != first

        wait_until(applied_anew)
    assert {"k": 2} == applied_counts(ledger)


def test_drop_after_commit_commits_but_never_answers(ledger: Path) -> None:
    """The client sees a dropped connection while the service's ledger has the application."""
    with start_service(ledger, "none") as svc:
        client = svc.client()
        assert 1 == client.control(drop_after_commit=1)["drop_after_commit"]
        with pytest.raises(ConnectionDropped):
            client.apply("k", "charge", 1)
        assert {"k": 1} == applied_counts(ledger)
        receipt = client.apply("k2", "charge", 1)
    assert {"k": 1, "k2": 1} == applied_counts(ledger)
    assert receipt == read_ledger(ledger)[-1]["receipt"]


def test_drop_after_commit_by_header(ledger: Path) -> None:
    """The per-request fault header drops just that request after committing it."""
    with start_service(ledger, "idempotent") as svc:
        client = svc.client()
        with pytest.raises(ConnectionDropped):
            client.apply("k", "charge", 1, fault="drop-after-commit")
        retried = client.apply_result("k", "charge", 1)
    assert {"k": 1} == applied_counts(ledger)
    assert retried.duplicate
    assert read_ledger(ledger)[0]["receipt"] == retried.receipt


@pytest.mark.parametrize("by_header", [False, True])
def test_fail_before_commit_answers_503_and_applies_nothing(ledger: Path, by_header: bool) -> None:
    """An injected failure is a 503 answer with nothing in the ledger."""
    with start_service(ledger, "none") as svc:
        client = svc.client()
        if not by_header:
            client.control(fail_before_commit=1)
        with pytest.raises(ServiceUnavailable) as raised:
            client.apply("k", "charge", 1, fault="fail-before-commit" if by_header else None)
        assert 503 == raised.value.status
        assert {} == applied_counts(ledger)
        client.apply("k", "charge", 1)
    assert {"k": 1} == applied_counts(ledger)


def test_hang_after_commit_times_the_client_out(ledger: Path) -> None:
    """A commit followed by a slow answer surfaces as ConnectionDropped on client timeout."""
    with start_service(ledger, "none") as svc:
        svc.client().control(hang_after_commit_s=2.0)
        with pytest.raises(ConnectionDropped):
            svc.client(timeout=0.2).apply("k", "charge", 1)
        assert {"k": 1} == applied_counts(ledger)
        assert 0 == svc.stop()


def test_control_rejects_unknown_faults(ledger: Path) -> None:
    """A typo in a fault name is a 400, not a silently ignored setting."""
    with start_service(ledger, "none") as svc:
        client = svc.client()
        with pytest.raises(RequestRejected) as raised:
            client.control(drop_after_comit=1)
        assert 400 == raised.value.status
        with pytest.raises(RequestRejected):
            client.control(drop_after_commit=-1)


def test_restart_keeps_dedupe_in_idempotent_mode(ledger: Path) -> None:
    """A restarted idempotent service reloads its ledger and still dedupes old keys."""
    with start_service(ledger, "idempotent") as svc:
        first = svc.client().apply("k", "charge", 1)
    with start_service(ledger, "idempotent") as svc:
        again = svc.client().apply_result("k", "charge", 1)
        svc.client().apply("k2", "charge", 1)
    assert (first, True) == (again.receipt, again.duplicate)
    assert {"k": 1, "k2": 1} == applied_counts(ledger)
    assert [1, 2] == [entry["seq"] for entry in read_ledger(ledger)]


def test_restart_keeps_lookup_in_lookup_mode(ledger: Path) -> None:
    """A restarted lookup service still knows the receipt of an earlier application."""
    with start_service(ledger, "lookup") as svc:
        first = svc.client().apply("k", "charge", 1)
    with start_service(ledger, "lookup") as svc:
        assert first == svc.client().lookup("k")


def test_torn_last_line_is_ignored_but_a_corrupt_middle_line_raises(ledger: Path) -> None:
    """Only an incomplete final line (no newline) is tolerated by the independent reader."""
    good = [
        {"seq": n, "key": f"k{n}", "op": "op", "payload": None, "receipt": f"r{n}", "time": 1.0}
        for n in (1, 2)
    ]
    lines = [json.dumps(entry) + "\n" for entry in good]
    ledger.write_text("".join(lines) + '{"seq": 3, "key": "k')
    assert good == read_ledger(ledger)
    assert {"k1": 1, "k2": 1} == applied_counts(ledger)
    ledger.write_text(lines[0] + '{"seq": 2, "key\n' + lines[1])
    with pytest.raises(LedgerCorruptError, match="line 2"):
        read_ledger(ledger)


def test_restart_on_a_torn_ledger_cuts_the_tail_and_appends_cleanly(ledger: Path) -> None:
    """The service drops a torn tail before appending, so the ledger never corrupts mid-file."""
    with start_service(ledger, "lookup") as svc:
        svc.client().apply("k1", "charge", 1)
    with ledger.open("a") as torn:
        torn.write('{"seq": 2, "key": "half')
    with start_service(ledger, "lookup") as svc:
        svc.client().apply("k2", "charge", 1)
    assert [(1, "k1"), (2, "k2")] == [(e["seq"], e["key"]) for e in read_ledger(ledger)]


def test_sigkill_mid_run_leaves_a_readable_ledger(ledger: Path) -> None:
    """Killing the service under load loses no confirmed application and keeps the file readable."""
    confirmed: list[str] = []
    svc = start_service(ledger, "none")
    client = svc.client(timeout=2.0)

    def hammer(worker: int) -> None:
        for n in range(10_000):
            try:
                confirmed.append(client.apply(f"w{worker}-{n}", "charge", n))
            except (ConnectionDropped, ServiceUnavailable):
                return

    workers = [threading.Thread(target=hammer, args=(w,)) for w in range(4)]
    for worker in workers:
        worker.start()
    wait_until(lambda: len(confirmed) >= 40)
    assert -9 == svc.kill()
    for worker in workers:
        worker.join(DEADLINE_S)
    entries = read_ledger(ledger)
    assert set(confirmed) <= {entry["receipt"] for entry in entries}
    assert list(range(1, len(entries) + 1)) == [entry["seq"] for entry in entries]


def test_orphaned_service_exits_when_its_parent_dies(tmp_path: Path) -> None:
    """A service whose spawning process died stops by itself instead of leaking."""
    script = (
        "import sys; from pathlib import Path; from castore.lab.service import start_service; "
        "svc = start_service(Path(sys.argv[1]), 'none'); print(svc.pid, svc.url, flush=True); "
        "sys.stdin.read()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "ledger.jsonl")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert parent.stdout is not None
    pid_text, url = parent.stdout.readline().split()
    assert "none" == ServiceClient(url.decode()).health()["mode"]
    parent.kill()
    parent.wait()
    wait_until(lambda: _gone(int(pid_text)))


def _gone(pid: int) -> bool:
    """True once a process no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"
