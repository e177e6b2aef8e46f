"""A test worker whose clock is its own: a host whose clock is set apart from the others.

    CASTORE_TEST_CLOCK_OFFSET_MS=7200000 python tests/clock_worker.py STORE URL RETENTION_S

The offset (ms, may be negative) is added to the wall clock and given to the store as its
`clock=`. The worker opens task "charge-1", commits "prep", and performs "pay" against the lab
service at URL, declared idempotent with RETENTION_S. It prints one JSON line: the next action
it found for "pay" and why, then what happened ("confirmed" with the receipt, or "unresolved"
with the reason). Exit 0 when confirmed, 6 when the outcome is unknown. CASTORE_CRASH_AT kills
it at a named point, as for every crash test.
"""

from __future__ import annotations

import json
import os
import sys
import time

import castore
from castore.lab.service import ServiceClient

TASK = "charge-1"
PLAN = castore.Plan.build("charge", "prep", castore.effect("pay", "prep"), "after")
OFFSET_ENV = "CASTORE_TEST_CLOCK_OFFSET_MS"


def main(store_path: str, url: str, retention_s: str) -> int:
    offset = int(os.environ.get(OFFSET_ENV, "0"))
    store = castore.Store.open(
        store_path, create=True, clock=lambda: time.time_ns() // 1_000_000 + offset
    )
    client = ServiceClient(url)
    service = castore.Service("payments", idempotent=True, retention=int(retention_s))
    report: dict[str, object] = {}
    with store.open_task(TASK, PLAN) as run:
        if run.next_step == "prep":
            run.commit_step("prep", {"amount": 4200})
        action = run.next_action("pay")
        report.update(action=action.action.value, reason=action.reason)
        try:
            receipt = run.perform(
                "pay", service, lambda key: client.apply(key, "pay", {"amount": 4200})
            )
        except castore.OutcomeUnknownError as exc:
            report.update(outcome="unresolved", error=str(exc))
            print(json.dumps(report), flush=True)
            return 6
        report.update(outcome="confirmed", receipt=receipt)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
