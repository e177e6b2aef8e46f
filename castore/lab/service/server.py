"""The HTTP side: a loopback server and the handler that routes the five endpoints."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from castore.lab.service.modes import Service
from castore.lab.service.wire import FAULT_HEADER, HEADER_FAULTS, HOST, JsonObject

MAX_BODY_BYTES: Final = 1 << 20


class _BadRequest(Exception):
    """A client error the handler turns into a 4xx answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Server(ThreadingHTTPServer):
    """A threading HTTP server bound to loopback that carries the service state."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int, service: Service) -> None:
        self.service = service
        super().__init__((HOST, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), a reverse DNS lookup that can stall for
        # seconds on a machine with broken DNS; loopback needs no name.
        socketserver.TCPServer.server_bind(self)
        self.server_name = HOST
        self.server_port = self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    """Routes the five endpoints; every answer is a JSON body."""

    server_version = "castore-lab-service/1"

    def log_message(self, format: str, *args: Any) -> None:
        # Per-request lines would bury the errors that start_service surfaces from stderr.
        return

    @property
    def _service(self) -> Service:
        server = self.server
        if not isinstance(server, Server):
            raise TypeError("the handler only runs inside Server")
        return server.service

    def do_GET(self) -> None:
        """GET /health, /ledger and /lookup?key=K."""
        url = urlsplit(self.path)
        if url.path == "/health":
            self._send(200, {"ok": True, "mode": self._service.mode, "pid": os.getpid()})
        elif url.path == "/ledger":
            self._send(200, self._service.entries())
        elif url.path == "/lookup":
            self._lookup(parse_qs(url.query).get("key", []))
        else:
            self._send(404, {"error": f"no route GET {url.path}"})

    def do_POST(self) -> None:
        """POST /apply and /control."""
        path = urlsplit(self.path).path
        try:
            body = self._read_json_object()
            if path == "/apply":
                self._apply(body)
            elif path == "/control":
                self._send(200, self._service.set_faults(_validate_faults(body)))
            else:
                self._send(404, {"error": f"no route POST {path}"})
        except _BadRequest as exc:
            self._send(exc.status, {"error": str(exc)})

    def _lookup(self, keys: list[str]) -> None:
        if self._service.mode != "lookup":
            self._send(501, {"error": f"lookup is not offered in mode {self._service.mode}"})
        elif len(keys) != 1:
            self._send(400, {"error": "give exactly one ?key="})
        else:
            receipt = self._service.lookup(keys[0])
            if receipt is None:
                self._send(404, {"error": "not found"})
            else:
                self._send(200, {"receipt": receipt, "key": keys[0]})

    def _apply(self, body: JsonObject) -> None:
        key, op = body.get("key"), body.get("op")
        if not isinstance(key, str) or not key or not isinstance(op, str):
            raise _BadRequest(400, "body needs a non-empty string key and a string op")
        fault = self.headers.get(FAULT_HEADER)
        if fault is not None and fault not in HEADER_FAULTS:
            raise _BadRequest(400, f"{FAULT_HEADER} must be one of {', '.join(HEADER_FAULTS)}")
        decision = self._service.apply(key, op, body.get("payload"), fault)
        if decision.action == "fail":
            self._send(503, {"error": "injected fault: fail-before-commit"})
        elif decision.action == "drop":
            self._drop_connection()
        else:
            if decision.action == "hang":
                time.sleep(decision.hang_s)  # the fault itself: commit, then answer late
            answer = {"receipt": decision.receipt, "key": key, "duplicate": decision.duplicate}
            self._send(200, answer)

    def _read_json_object(self) -> JsonObject:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise _BadRequest(411, "a JSON body with Content-Length is required") from None
        if not 0 <= length <= MAX_BODY_BYTES:
            raise _BadRequest(413, f"body must be at most {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(self.rfile.read(length), parse_constant=_reject_constant)
        except ValueError as exc:
            raise _BadRequest(400, f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _BadRequest(400, "body must be a JSON object")
        return body

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # The client gave up (its timeout during a hang); what was committed stays committed.
            self.close_connection = True

    def _drop_connection(self) -> None:
        # SO_LINGER 0 makes close() send a RST: the client sees the connection die with no
        # status line at all, exactly like a crash between commit and answer.
        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        # rfile holds a reference to the socket; the fd only closes once both are released.
        self.rfile.close()
        self.request.close()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _validate_faults(body: JsonObject) -> JsonObject:
    """Check a /control body: known fault names with non-negative numbers."""
    counts = {"drop_after_commit", "fail_before_commit"}
    allowed = [*sorted(counts), "hang_after_commit_s"]
    for name, value in body.items():
        if name not in allowed:
            raise _BadRequest(400, f"unknown fault {name!r}; known faults: {', '.join(allowed)}")
        wanted = int if name in counts else (int, float)
        if isinstance(value, bool) or not isinstance(value, wanted) or value < 0:
            raise _BadRequest(400, f"fault {name} needs a non-negative number, got {value!r}")
    return {name: (value if name in counts else float(value)) for name, value in body.items()}
