"""The durable JSON-lines ledger: fsynced appends, torn-tail recovery, and reading it back."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from castore.lab.service.errors import LedgerCorruptError
from castore.lab.service.wire import JsonObject


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


class Ledger:
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
