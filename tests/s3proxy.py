"""A fault-injecting HTTP proxy between castore and an S3 server, for the ambiguity tests.

`FaultProxy(upstream)` listens on 127.0.0.1 and relays each request to the server, one
request per connection (it asks the server to close after answering, so a response ends at
end of file). `arm(Fault(...))` makes the next matching requests fail in a chosen way:

- `drop_response`: the server gets the request and answers (a PUT commits), the client gets
  nothing: the connection closes, as a lost answer does;
- `reset_request`: the connection closes half-way through the request's body, which the
  server never gets whole (nothing is committed);
- `reset_response`: the server answers, the client gets the headers and half the body;
- `delay`: the request waits `seconds` before it is relayed (a slow network, a timeout);
- `status`: the proxy answers `status` itself (503 SlowDown, 500), the server never sees it.

`FaultProxy(upstream, strip=("if-none-match",))` removes those headers from every request: an
endpoint that ignores the condition, as some S3-compatible servers have (moto does not check
signatures, so the request still passes; RGW does, so this works on moto only).

Every relayed request is logged (method, path, what happened) for the tests to check.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error.</Message></Error>"
)
_CONFLICT = (  # AWS: another conditional write of the key is in flight
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conflicting operation occurred.</Message></Error>"
)


@dataclass
class Fault:
    """What to do to the next `times` requests whose method and path match."""

    action: str  # drop_response, reset_request, reset_response, delay, status
    method: str = "PUT"
    path: str = ".*"  # a regex searched in the request's path
    times: int = 1
    seconds: float = 0.0
    status: int = 503

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method == self.method and re.search(self.path, path) is not None


@dataclass
class Logged:
    method: str
    path: str
    done: str  # relayed, or the fault's action


@dataclass
class FaultProxy:
    upstream: str
    log: list[Logged] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    strip: tuple[str, ...] = ()  # lower-case header names removed from every request

    def __post_init__(self) -> None:
        parsed = urlparse(self.upstream)
        self._target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name="s3proxy", daemon=True)
        self._thread.start()

    def arm(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def close(self) -> None:
        self._stopped = True
        self._server.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.times -= 1
                    return fault
        return None

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                head, body = _read_request(client)
            except (OSError, ValueError):
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, path = request_line.split(" ")[:2]
            fault = self._fault_for(method, path)
            done = fault.action if fault is not None else "relayed"
            self.log.append(Logged(method, path, done))
            if fault is not None and fault.action == "status":
                _answer(client, fault.status)
                return
            if fault is not None and fault.action == "reset_request":
                return  # closed half-way: the server never sees the request
            if fault is not None and fault.action == "delay":
                time.sleep(fault.seconds)
            response = self._relay(_closing(_without(head, self.strip)), body)
            if fault is not None and fault.action == "drop_response":
                return  # the server answered (and committed); the client hears nothing
            if fault is not None and fault.action == "reset_response":
                client.sendall(response[: len(response) // 2 + 1])
                return
            try:
                client.sendall(response)
            except OSError:
                return

    def _relay(self, head: bytes, body: bytes) -> bytes:
        with socket.create_connection(self._target, timeout=30) as server:
            server.sendall(head + body)
            chunks = []
            while chunk := server.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def _read_request(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("the client closed before a whole request")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    head += b"\r\n\r\n"
    match = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    length = int(match.group(1)) if match else 0
    if re.search(rb"(?im)^transfer-encoding:\s*chunked", head):
        raise ValueError("chunked request bodies are not relayed by this proxy")
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("the client closed mid-body")
        rest += chunk
    return head, rest[:length]


def _closing(head: bytes) -> bytes:
    """The request's head asking the server to close after it answers."""
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines[:-2], b"Connection: close", b"", b""])


def _without(head: bytes, names: tuple[str, ...]) -> bytes:
    """The request's head without the headers `names` (lower case)."""
    keep = [
        line
        for line in head.split(b"\r\n")
        if line.split(b":", 1)[0].strip().lower().decode("latin-1") not in names
    ]
    return b"\r\n".join(keep)


def _answer(client: socket.socket, status: int) -> None:
    body = {503: _SLOWDOWN, 409: _CONFLICT}.get(status, _INTERNAL)
    reason = {503: "Slow Down", 500: "Internal Server Error", 409: "Conflict"}.get(status, "Error")
    client.sendall(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
