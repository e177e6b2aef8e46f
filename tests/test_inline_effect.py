"""The inline effect form of the side-effects guide (docs/howto/side-effects.md) resumes as
written: an exception in the block, a rerun of the same code, one charge in the service's
ledger (or UNRESOLVED when nothing can tell).

The block is taken from that page itself and run against the lab service (a real process
with a durable ledger) in each of its modes; the first run's request is dropped after the
service applied it, or refused before; every later run is the same code again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import castore
from castore.lab.service import (
    ConnectionDropped,
    ServiceClient,
    ServiceProcess,
    ServiceUnavailable,
    applied_counts,
    read_ledger,
    start_service,
)

HOWTO = Path(__file__).resolve().parent.parent / "docs" / "howto" / "side-effects.md"
[BLOCK] = [b for b in re.findall(r"```py\n(.*?)```", HOWTO.read_text(), re.S) if "run.effect(" in b]
TASK = "order-8"
PLAN = castore.Plan.build("checkout", "price", castore.effect("charge", "price"), "email")
KEY = castore.derive_key(TASK, castore.plan_id(PLAN), "charge")


class Payments:
    """The guide's `client`: charge(amount, idempotency_key=...) against the lab service;
    the first call carries an injected fault."""

    def __init__(self, service: ServiceClient, fault: str) -> None:
        self.service = service
        self.fault: str | None = fault
        self.keys: list[str] = []

    def charge(self, amount: int, idempotency_key: str) -> str:
        self.keys.append(idempotency_key)
        fault, self.fault = self.fault, None
        return self.service.apply(idempotency_key, "charge", {"amount": amount}, fault=fault)


def declared(mode: str, service: ServiceClient) -> castore.Service:
    """What the guide's `payments` declares for a lab service mode."""
    if mode == "idempotent":
        return castore.Service("payments", idempotent=True, retention=86400)
    if mode == "lookup":

        def lookup(key: str) -> castore.Reconciled:
            receipt = service.lookup(key)
            return castore.NOT_FOUND if receipt is None else castore.found(receipt)

        return castore.Service("payments", reconcile=lookup)
    return castore.Service("payments")


@pytest.fixture(params=["idempotent", "lookup", "none"])
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, ServiceProcess]]:
    """(mode, the lab service running in it)."""
    with start_service(tmp_path / "ledger.jsonl", request.param) as service:
        yield request.param, service


def run_readme_block(store: castore.Store, payments: castore.Service, client: Payments) -> Any:
    """One run of the worker: open the task, do "price", then the guide's block as written."""
    with store.open_task(TASK, PLAN) as run:
        if run.next_step == "price":
            run.commit_step("price", 4200)
        exec(BLOCK, {"run": run, "payments": payments, "client": client})  # noqa: S102
        return run.receipt("charge")


@pytest.mark.parametrize("fault", ["drop-after-commit", "fail-before-commit"])
def test_rerunning_the_readme_block_after_an_exception_charges_once(
    store: castore.Store, tmp_path: Path, lab: tuple[str, ServiceProcess], fault: str
) -> None:
    """Rerun as written: resubmitted (idempotent), reconciled (lookup: found → skipped, not
    found → submitted again), or OutcomeUnknownError (none); at most one charge, ever."""
    mode, service = lab
    payments = declared(mode, service.client())
    client = Payments(service.client(), fault)
    raised = ConnectionDropped if fault == "drop-after-commit" else ServiceUnavailable
    with pytest.raises(raised):
        run_readme_block(store, payments, client)
    applied = 1 if fault == "drop-after-commit" else 0
    assert ({KEY: 1} if applied else {}) == applied_counts(tmp_path / "ledger.jsonl")
    for _ in range(2):  # the rerun, and a rerun of a finished (or unresolved) task
        if mode == "none":
            with pytest.raises(castore.OutcomeUnknownError) as caught:
                run_readme_block(store, payments, client)
            assert f"castore resolve {TASK} charge" in str(caught.value)
            continue
        receipt = run_readme_block(store, payments, client)
        [entry] = read_ledger(tmp_path / "ledger.jsonl")
        assert (KEY, entry["receipt"]) == (entry["key"], receipt)
    sent = {"idempotent": 2, "lookup": 1 + (1 - applied), "none": 1}[mode]
    assert [KEY] * sent == client.keys  # a skipped block never reached its request
    expected = {KEY: 1} if applied or mode != "none" else {}
    assert expected == applied_counts(tmp_path / "ledger.jsonl")
