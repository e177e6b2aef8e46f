"""The fake service's errors: ServiceError and what a client or a start can run into.

ServiceError
├── ServiceUnavailable    5xx or no connection: applied or not is unknown
├── ConnectionDropped     sent, but no answer came: outcome unknown
├── LookupUnsupported     GET /lookup answered 501
├── RequestRejected       4xx: nothing was applied
├── LedgerCorruptError    (also ValueError) a complete ledger line that is not an entry
└── ServiceStartError     the process did not come up
"""

from __future__ import annotations


class ServiceError(Exception):
    """Root of the fake service's errors (the outside world's, not castore's error tree)."""


class ServiceUnavailable(ServiceError):
    """A 5xx answer or no connection: whether the operation was applied is NOT implied."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ConnectionDropped(ServiceError):
    """The request was sent but no answer came (reset, disconnect, timeout): outcome unknown."""


class LookupUnsupported(ServiceError):
    """The service runs in a mode without GET /lookup (it answered 501)."""


class RequestRejected(ServiceError):
    """The service answered 4xx: the request itself was malformed; nothing was applied."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class LedgerCorruptError(ServiceError, ValueError):
    """A complete ledger line that is not a valid entry (a torn final line is not this)."""


class ServiceStartError(ServiceError):
    """The service process did not come up; the message carries its stderr."""
