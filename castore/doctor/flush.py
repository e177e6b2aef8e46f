"""Probe of the flush path: how castore makes commits durable here, and whether syncfs works."""

from __future__ import annotations

import os
import statistics
import time

from castore.doctor.primitives import CREATE_FLAGS, O_CLOEXEC, Context, describe
from castore.doctor.report import Verdict
from castore.errors import UsageError
from castore.medium import flushpolicy, fsio

ROUNDS = 3
"""Timed rounds of syncfs, and of one file's fsync for comparison (the median is reported)."""

_PAGE = b"f" * 4096


class _SyncfsFailed(Exception):
    """syncfs itself failed (not the writes around it); carries the OSError."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def check_flush_path(ctx: Context) -> tuple[Verdict, str]:
    """Never a failure: where castore does not share a syncfs it takes the precise path, which
    the required fsync checks already cover; a syncfs that fails here is a warning to opt out."""
    try:
        policy = flushpolicy.decide(ctx.a)
    except UsageError as exc:
        return "warn", f"{exc}; castore refuses this setting, so fix it before committing here"
    if not policy.shared:
        return "ok", (
            f"{policy.reason}; castore flushes file by file here: a commit is durable through "
            "fsync of its own file and of its chain directory, so the directory-fsync check is "
            "what it relies on"
        )
    try:
        syncfs_s, fsync_s = _time_flushes(ctx.a)
    except _SyncfsFailed as failed:
        return "warn", (
            f"{policy.reason}, but syncfs here failed with {describe(failed.error)}: commits "
            f"that share a flush would fail; set {flushpolicy.ENV}=fsync so that every commit "
            "flushes its own files"
        )
    return "ok", (
        f"{policy.reason} (a lone commit still fsyncs its own files); syncfs here works: "
        f"{_ms(syncfs_s)} against {_ms(fsync_s)} for one file's fsync (median of {ROUNDS}); "
        "it also writes back what other programs wrote to this filesystem, so it costs more "
        f"while they write ({flushpolicy.ENV}=fsync turns sharing off)"
    )


def _time_flushes(directory: str) -> tuple[float, float]:
    """Median seconds of syncfs (with a fresh dirty file) and of one fresh file's fsync."""
    # Opened before anything is written: syncfs reports a write-back error only to descriptors
    # opened before someone first saw it (errseq), so a later one could miss an error.
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    try:
        syncs, fsyncs = [], []
        for n in range(ROUNDS):
            os.close(_dirty_file(os.path.join(directory, f"syncfs-{n}")))
            started = time.perf_counter()
            try:
                fsio.syncfs(dir_fd)
            except OSError as exc:
                raise _SyncfsFailed(exc) from exc
            syncs.append(time.perf_counter() - started)
            fd = _dirty_file(os.path.join(directory, f"fsync-{n}"))
            try:
                started = time.perf_counter()
                os.fsync(fd)
                fsyncs.append(time.perf_counter() - started)
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return statistics.median(syncs), statistics.median(fsyncs)


def _dirty_file(path: str) -> int:
    """A new file holding one page that no flush has covered yet; its open descriptor."""
    fd = os.open(path, CREATE_FLAGS, 0o600)
    try:
        os.write(fd, _PAGE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ms(seconds: float) -> str:
    # tmpfs answers in microseconds: say so rather than print "0.00 ms"
    return f"{seconds * 1000:.2f} ms" if seconds >= 0.000005 else "under 0.01 ms"
