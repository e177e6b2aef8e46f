"""A fake remote service with its own durable ledger: the outside world for crash campaigns.

It runs as a separate process (`python -m castore.lab.service`), applies operations, and
appends every application to a JSON-lines ledger that is fsynced before the answer is sent,
so the ledger is the ground truth of what the outside world did. It deliberately imports
nothing from castore: it must not share bugs with the code it judges.

Modes: `idempotent` (dedupe on the key within a retention window, no lookup), `lookup`
(no dedupe, GET /lookup answers the first receipt of a key) and `none` (neither).
Faults are injected on command with POST /control or per request with `X-Castore-Fault`.
"""

from __future__ import annotations

from castore.lab.service.client import ApplyResult, ServiceClient
from castore.lab.service.errors import (
    ConnectionDropped,
    LedgerCorruptError,
    LookupUnsupported,
    RequestRejected,
    ServiceError,
    ServiceStartError,
    ServiceUnavailable,
)
from castore.lab.service.ledger import applied_counts, read_ledger
from castore.lab.service.process import READY_POLL_S, ServiceProcess, start_service
from castore.lab.service.serve import main
from castore.lab.service.server import MAX_BODY_BYTES
from castore.lab.service.wire import FAULT_HEADER, HEADER_FAULTS, HOST, MODES, JsonObject

__all__ = [
    "FAULT_HEADER",
    "HEADER_FAULTS",
    "HOST",
    "MAX_BODY_BYTES",
    "MODES",
    "READY_POLL_S",
    "ApplyResult",
    "ConnectionDropped",
    "JsonObject",
    "LedgerCorruptError",
    "LookupUnsupported",
    "RequestRejected",
    "ServiceClient",
    "ServiceError",
    "ServiceProcess",
    "ServiceStartError",
    "ServiceUnavailable",
    "applied_counts",
    "main",
    "read_ledger",
    "start_service",
]
