"""ServiceClient: a small blocking HTTP client for the fake service."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from castore.lab.service.errors import (
    ConnectionDropped,
    LookupUnsupported,
    RequestRejected,
    ServiceError,
    ServiceUnavailable,
)
from castore.lab.service.wire import FAULT_HEADER, JsonObject


@dataclass(frozen=True)
class ApplyResult:
    """The service's answer to one POST /apply."""

    receipt: str
    key: str
    duplicate: bool


class ServiceClient:
    """A small blocking client; one fresh connection per request, each with a timeout."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None or url.port is None:
            raise ValueError(f"base_url must look like http://127.0.0.1:PORT, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._host, self._port = url.hostname, url.port

    def apply(self, key: str, op: str, payload: object, *, fault: str | None = None) -> str:
        """Apply an operation and return its receipt (the original one for a deduped key)."""
        return self.apply_result(key, op, payload, fault=fault).receipt

    def apply_result(
        self, key: str, op: str, payload: object, *, fault: str | None = None
    ) -> ApplyResult:
        """Like apply(), but also says whether the service treated it as a duplicate."""
        headers = {FAULT_HEADER: fault} if fault is not None else {}
        body = {"key": key, "op": op, "payload": payload}
        status, answer = self._request("POST", "/apply", body, headers)
        if status != 200:
            raise self._error(status, answer, f"apply {key!r}")
        return ApplyResult(_str_field(answer, "receipt"), key, bool(answer.get("duplicate")))

    def lookup(self, key: str) -> str | None:
        """The receipt of the first application of `key`, or None if it was never applied."""
        status, answer = self._request("GET", f"/lookup?key={quote(key, safe='')}")
        if status == 200:
            return _str_field(answer, "receipt")
        if status == 404:
            return None
        if status == 501:
            raise LookupUnsupported(f"{self.base_url} offers no lookup; it runs without one")
        raise self._error(status, answer, f"lookup {key!r}")

    def ledger(self) -> list[JsonObject]:
        """The ledger as the server reports it (read_ledger() reads the file directly)."""
        status, answer = self._request("GET", "/ledger")
        if status != 200 or not isinstance(answer, list):
            raise self._error(status, answer, "read the ledger")
        return [entry for entry in answer if isinstance(entry, dict)]

    def control(self, **faults: float) -> JsonObject:
        """Set injected faults, e.g. control(drop_after_commit=1); returns all pending faults."""
        status, answer = self._request("POST", "/control", faults)
        if status != 200:
            raise self._error(status, answer, "set faults")
        return dict(answer)

    def health(self) -> JsonObject:
        """The service's liveness answer (mode and pid)."""
        status, answer = self._request("GET", "/health")
        if status != 200:
            raise self._error(status, answer, "check health")
        return dict(answer)

    def _request(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **(headers or {})}
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise ServiceUnavailable(
                    f"cannot connect to {self.base_url} ({exc}); the request was not sent, "
                    "check that the service is running"
                ) from exc
            try:
                conn.request(method, path, body=data, headers=sent)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise ConnectionDropped(
                    f"{method} {path} to {self.base_url} got no answer ({exc!r}); the service "
                    "may or may not have applied it, find out before retrying"
                ) from exc
        finally:
            conn.close()
        return response.status, _decode(raw)

    def _error(self, status: int, answer: Any, doing: str) -> ServiceError:
        detail = answer.get("error") if isinstance(answer, dict) else answer
        message = f"{self.base_url} could not {doing}: HTTP {status}: {detail}"
        if status >= 500:
            return ServiceUnavailable(f"{message}; it may or may not have applied it", status)
        if status >= 400:
            return RequestRejected(message, status)
        return ServiceError(f"{message}; unexpected answer")


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


def _str_field(answer: Any, name: str) -> str:
    value = answer.get(name) if isinstance(answer, dict) else None
    if not isinstance(value, str):
        raise ServiceError(f"answer {answer!r} has no string {name!r}; is this the lab service?")
    return value
