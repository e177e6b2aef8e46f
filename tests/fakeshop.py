"""A fake payment service for effect tests: it applies every request it gets (it deduplicates
nothing, so a second send of one key is a second payment) and can be asked by key."""

from __future__ import annotations

import threading

import castore

DEADLINE_S = 20.0  # how long a test waits for a condition before it fails


class Ledger:
    """The service's ledger: `sent` every request that reached it or was tried, `applied`
    every application (a key twice is a duplicate payment)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.applied: list[str] = []

    def apply(self, key: str) -> str:
        self.sent.append(key)
        self.applied.append(key)
        return f"receipt-{len(self.applied)}"

    def lookup(self, key: str) -> castore.Reconciled:
        if key in self.applied:
            return castore.found(f"receipt-{self.applied.index(key) + 1}")
        return castore.NOT_FOUND

    def service(self) -> castore.Service:
        """The service as castore sees it: not idempotent, but it can be asked by key."""
        return castore.Service("shop", reconcile=self.lookup)

    def send_then_drop(self, key: str) -> str:
        """The request is applied; the connection drops before the answer comes back."""
        self.apply(key)
        raise ConnectionError(f"connection reset after sending {key}")

    def drop_before(self, key: str) -> str:
        """The connection drops before the request reaches the service."""
        self.sent.append(key)
        raise ConnectionError(f"connection refused sending {key}")


class HeldSend:
    """A sync send that, once running (in a pool thread, or in another run's thread), waits
    for `release` before its request reaches the service (a slow network): it is still
    sending, after its awaiter was cancelled or while another run resumes the task, for as
    long as the test says."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()

    def __call__(self, key: str) -> str:
        self.entered.set()
        try:
            if not self.release.wait(DEADLINE_S):
                raise TimeoutError("the test never released the held send")
            return self.ledger.apply(key)
        finally:
            self.returned.set()
