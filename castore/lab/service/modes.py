"""The service's state under one lock: mode (dedupe, lookup), injected faults, commits."""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from castore.lab.service.ledger import Ledger
from castore.lab.service.wire import JsonObject


@dataclass
class _Faults:
    """Pending injected faults; each count is consumed by the next /apply requests."""

    drop_after_commit: int = 0
    fail_before_commit: int = 0
    hang_after_commit_s: float = 0.0  # one-shot: only the next /apply hangs


@dataclass(frozen=True)
class _Decision:
    """What one /apply request did and how the handler must (not) answer it."""

    action: str  # "answer", "fail", "drop" or "hang"
    receipt: str = ""
    duplicate: bool = False
    hang_s: float = 0.0


class Service:
    """Mode logic, dedupe and lookup indexes, and fault counters, all under one lock."""

    def __init__(
        self, ledger: Ledger, mode: str, retention_s: float, clock_offset_s: float = 0.0
    ) -> None:
        self.ledger = ledger
        self.mode = mode
        self.retention_s = retention_s
        self.clock_offset_s = clock_offset_s  # a service whose clock is off (clock-skew tests)
        self.lock = threading.Lock()
        self.faults = _Faults()
        self.closed = False
        self._latest: dict[str, JsonObject] = {}
        self._first: dict[str, str] = {}
        for entry in ledger.entries:
            self._index(entry)

    def _index(self, entry: JsonObject) -> None:
        self._latest[entry["key"]] = entry
        self._first.setdefault(entry["key"], entry["receipt"])

    def apply(self, key: str, op: str, payload: Any, header_fault: str | None) -> _Decision:
        """Consume faults, then dedupe or commit; the ledger line is durable before returning."""
        with self.lock:
            action, hang_s = self._take_fault(header_fault)
            if action == "fail" or self.closed:
                return _Decision("fail")
            receipt, duplicate = self._commit(key, op, payload)
            return _Decision(action, receipt, duplicate, hang_s)

    def _take_fault(self, header_fault: str | None) -> tuple[str, float]:
        if header_fault is not None:
            return ("drop" if header_fault == "drop-after-commit" else "fail"), 0.0
        faults = self.faults
        if faults.fail_before_commit > 0:
            faults.fail_before_commit -= 1
            return "fail", 0.0
        if faults.drop_after_commit > 0:
            faults.drop_after_commit -= 1
            return "drop", 0.0
        if faults.hang_after_commit_s > 0:
            hang_s, faults.hang_after_commit_s = faults.hang_after_commit_s, 0.0
            return "hang", hang_s
        return "answer", 0.0

    def _commit(self, key: str, op: str, payload: Any) -> tuple[str, bool]:
        now = time.time() + self.clock_offset_s
        latest = self._latest.get(key)
        # Wall-clock time, not monotonic: the window must survive a service restart.
        if self.mode == "idempotent" and latest and now - latest["time"] < self.retention_s:
            return str(latest["receipt"]), True
        entry: JsonObject = {
            "seq": len(self.ledger.entries) + 1,
            "key": key,
            "op": op,
            "payload": payload,
            "receipt": f"rcpt-{secrets.token_hex(8)}",
            "time": now,
        }
        self.ledger.append(entry)
        self._index(entry)
        return str(entry["receipt"]), False

    def lookup(self, key: str) -> str | None:
        """The receipt of the first application of `key`, if any."""
        with self.lock:
            return self._first.get(key)

    def entries(self) -> list[JsonObject]:
        """A snapshot of the ledger as the server knows it."""
        with self.lock:
            return list(self.ledger.entries)

    def set_faults(self, changes: JsonObject) -> JsonObject:
        """Validate and set fault counters; returns all pending faults."""
        with self.lock:
            for name, value in changes.items():
                setattr(self.faults, name, value)
            return asdict(self.faults)

    def shut(self) -> None:
        """Close the ledger once no application is in flight; later requests get 503."""
        with self.lock:
            self.closed = True
            self.ledger.close()
