"""What the service and its clients agree on: address, modes, the fault header, JSON bodies."""

from __future__ import annotations

from typing import Any, Final

HOST: Final = "127.0.0.1"
MODES: Final = ("idempotent", "lookup", "none")
FAULT_HEADER: Final = "X-Castore-Fault"
HEADER_FAULTS: Final = ("drop-after-commit", "fail-before-commit")

JsonObject = dict[str, Any]
