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

import argparse
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Final
from urllib.parse import parse_qs, quote, urlsplit

HOST: Final = "127.0.0.1"
MODES: Final = ("idempotent", "lookup", "none")
FAULT_HEADER: Final = "X-Castore-Fault"
HEADER_FAULTS: Final = ("drop-after-commit", "fail-before-commit")
MAX_BODY_BYTES: Final = 1 << 20
READY_POLL_S: Final = 0.005

JsonObject = dict[str, Any]


# --------------------------------------------------------------------------- errors


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


# --------------------------------------------------------------------------- ledger reading


def read_ledger(path: str | os.PathLike[str]) -> list[JsonObject]:
    """Read a ledger file directly, without the server; an incomplete final line is ignored."""
    ledger = Path(path)
    entries, _ = _parse_ledger(ledger.read_bytes(), ledger)
    return entries


def applied_counts(path: str | os.PathLike[str]) -> dict[str, int]:
    """How many times each key was applied, according to the ledger file itself."""
    return dict(Counter(str(entry["key"]) for entry in read_ledger(path)))


def _parse_ledger(data: bytes, path: Path) -> tuple[list[JsonObject], int]:
    """Return the complete entries and the byte length they span (a torn tail is excluded)."""
    # A kill mid-append leaves a prefix of one line with no newline; every line before it
    # was fsynced whole, so only that final fragment may be dropped.
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    return [_parse_line(line, path, number) for number, line in enumerate(lines, 1)], end


def _parse_line(line: bytes, path: Path, number: int) -> JsonObject:
    """Decode one complete ledger line or say exactly where the ledger is corrupt."""
    try:
        entry = json.loads(line)
    except ValueError as exc:
        raise LedgerCorruptError(
            f"{path}: line {number} is not JSON ({exc}); the ledger was damaged outside the "
            "service, inspect it by hand"
        ) from exc
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("seq"), int)
        and isinstance(entry.get("key"), str)
        and isinstance(entry.get("receipt"), str)
        and isinstance(entry.get("time"), int | float)
    ):
        raise LedgerCorruptError(
            f"{path}: line {number} is not a ledger entry with int seq, str key, str receipt "
            "and numeric time; the ledger was damaged outside the service, inspect it by hand"
        )
    return entry


# --------------------------------------------------------------------------- server side


class _Ledger:
    """The service's ground truth: an append-only, fsynced JSON-lines file and its entries."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries = self._recover(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        _fsync_dir(path.parent)

    @staticmethod
    def _recover(path: Path) -> list[JsonObject]:
        """Load an existing ledger and cut a torn tail, so the next append starts a clean line."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        entries, end = _parse_ledger(data, path)
        if end < len(data):
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, end)
                os.fsync(fd)
            finally:
                os.close(fd)
        return entries

    def append(self, entry: JsonObject) -> None:
        """Write one line and fsync it; on failure roll the file back to its last whole line."""
        line = json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
        encoded = line.encode()
        data = memoryview(encoded)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
            os.fsync(self._fd)
        except OSError:
            # A half-written line would turn into mid-file corruption at the next append.
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(encoded)
        self.entries.append(entry)

    def close(self) -> None:
        """Release the file descriptor."""
        os.close(self._fd)


def _fsync_dir(directory: Path) -> None:
    """Make a newly created ledger file's directory entry durable too."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


class _Service:
    """Mode logic, dedupe and lookup indexes, and fault counters, all under one lock."""

    def __init__(self, ledger: _Ledger, mode: str, retention_s: float) -> None:
        self.ledger = ledger
        self.mode = mode
        self.retention_s = retention_s
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
        now = time.time()
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


class _BadRequest(Exception):
    """A client error the handler turns into a 4xx answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Server(ThreadingHTTPServer):
    """A threading HTTP server bound to loopback that carries the service state."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int, service: _Service) -> None:
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
    def _service(self) -> _Service:
        server = self.server
        if not isinstance(server, _Server):
            raise TypeError("the handler only runs inside _Server")
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


# --------------------------------------------------------------------------- process entry


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m castore.lab.service", description=__doc__)
    parser.add_argument("--ledger", required=True, type=Path, help="JSON-lines ledger file")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--retention", type=float, default=86400.0, help="dedupe window, seconds")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--ready-file", type=Path, help="receives the port once listening")
    parser.add_argument("--parent-pid", type=int, help="exit when this parent process is gone")
    return parser.parse_args(argv)


def _write_atomically(path: Path, text: str) -> None:
    """Publish a file whole: a reader never sees it half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_for_stop(stop: threading.Event, parent_pid: int | None) -> None:
    # Re-parenting means the spawning process died; an orphaned service would hold its port
    # and ledger forever.
    while not stop.wait(0.2):
        if parent_pid is not None and os.getppid() != parent_pid:
            return


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or the parent's death), then exit 0."""
    args = _parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    service = _Service(_Ledger(args.ledger), args.mode, args.retention)
    server = _Server(args.port, service)
    # serve_forever runs in a thread because shutdown() deadlocks if called from its thread.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    if args.ready_file is not None:
        _write_atomically(args.ready_file, f"{server.server_port}\n")
    _wait_for_stop(stop, args.parent_pid)
    server.shutdown()
    thread.join()
    service.shut()
    server.server_close()
    return 0


# --------------------------------------------------------------------------- client


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


# --------------------------------------------------------------------------- process helper


class ServiceProcess:
    """A running service subprocess; stop() or leaving a `with` block ends it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, stderr: IO[bytes]) -> None:
        self.process = process
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self._stderr = stderr
        self._stderr_text: str | None = None

    @property
    def pid(self) -> int:
        """The service's process id."""
        return self.process.pid

    def client(self, timeout: float = 5.0) -> ServiceClient:
        """A client for this service."""
        return ServiceClient(self.url, timeout)

    def stderr_text(self) -> str:
        """Everything the service wrote to stderr so far."""
        if self._stderr_text is not None:
            return self._stderr_text
        return _read_all(self._stderr)

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, wait, SIGKILL if it will not go; returns the exit code (0 when clean)."""
        _terminate(self.process, timeout)
        return self._finish()

    def kill(self) -> int:
        """SIGKILL with no warning, like a crash; returns the exit code (-9)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        return self._finish()

    def _finish(self) -> int:
        if self._stderr_text is None:
            self._stderr_text = _read_all(self._stderr)
            self._stderr.close()
        return int(self.process.returncode)

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_service(
    ledger: Path,
    mode: str,
    retention_s: float = 86400.0,
    *,
    python: str = sys.executable,
    port: int = 0,
    ready_timeout_s: float = 10.0,
    exit_with_parent: bool = True,
) -> ServiceProcess:
    """Spawn `python -m castore.lab.service` and return once it listens on 127.0.0.1."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    workdir = Path(tempfile.mkdtemp(prefix="castore-service-"))
    ready = workdir / "port"
    argv = [
        python,
        "-m",
        "castore.lab.service",
        "--ledger",
        os.fspath(ledger),
        "--mode",
        mode,
        "--retention",
        str(retention_s),
        "--port",
        str(port),
        "--ready-file",
        str(ready),
    ]
    if exit_with_parent:
        argv += ["--parent-pid", str(os.getpid())]
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by ServiceProcess, closed on stop
    # Our own argv, no shell; a new session keeps a terminal's Ctrl-C (or a campaign killing
    # the worker's process group) from reaching the outside world by accident.
    process = subprocess.Popen(  # noqa: S603
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=_child_env(),
        start_new_session=True,
    )
    try:
        bound = _await_ready(process, ready, stderr, ready_timeout_s)
    except BaseException:
        _terminate(process, 1.0)
        stderr.close()
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return ServiceProcess(process, bound, stderr)


def _child_env() -> dict[str, str]:
    """The parent's environment, with this checkout importable even when not installed."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _await_ready(
    process: subprocess.Popen[bytes], ready: Path, stderr: IO[bytes], timeout_s: float
) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            return int(ready.read_text())
        code = process.poll()
        if code is not None:
            raise ServiceStartError(
                f"the service exited with code {code} before listening; its stderr:\n"
                f"{_read_all(stderr)}"
            )
        time.sleep(READY_POLL_S)
    raise ServiceStartError(
        f"the service did not listen within {timeout_s} s; its stderr so far:\n{_read_all(stderr)}"
    )


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _read_all(stream: IO[bytes]) -> str:
    stream.seek(0)
    return stream.read().decode(errors="replace")


if __name__ == "__main__":
    raise SystemExit(main())
