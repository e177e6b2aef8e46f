"""Power loss, simulated from a recorded list of filesystem operations (STORAGE.md, catalogue).

1. **Record.** A real workload (init, start two tasks, steps, a batch of a blob, a raw object
   and a tree naming both as a result, an effect through `run.perform`, a deduplicated plan
   and blob) runs with the durability-relevant functions of
   the `os` module wrapped: open (a create, or an fd to track), write (bytes and offset), fsync,
   close, link, rename/replace, unlink, mkdir, rmdir, ftruncate, (f)chmod (the task lock file
   is created through filelock and recorded too). Paths are kept relative to a
   base directory that holds the store, so even the store directory's own name is modelled.
   Files are modelled as inodes (a chain slot is a hard link to its object's inode), directories
   by path. After every `TaskSlots.commit` returns (the commit is acknowledged), after
   `put_blob` returns and after `Store.init` returns, a marker op is appended. At the end the
   model's "everything applied" tree must equal the real tree (names, bytes, hard links), so an
   operation the recorder missed fails the recording itself.

2. **Crash model** (ALICE / CrashMonkey style, POSIX minimum, no ext4 kindness):
   - file data becomes durable only when its inode is fsynced (all earlier writes to it);
   - a directory entry operation (create, link, mkdir, unlink, rmdir, each half of a rename)
     in directory D becomes durable only when D is fsynced (all earlier entry ops in D);
     fsyncing a file never makes its name durable;
   - at a crash after op i, any subset of the non-durable ops may have reached the disk.
   Rather than every subset, each crash point yields these entry-op choices: none (S_min), all
   (S_max), only / all but each directory, and for the 6 newest non-durable ops plus 4 older
   ones (seeded sample) only / all but that op, that op with the ops before it in its own
   directory (reordering across directories: a "half rename/link"), and that op with every op
   before it; for each choice three data variants: everything written ("full"), only fsynced
   bytes ("durable": a non-durable name over a data-less inode), and the last non-fsynced write
   of each file cut in half ("torn"). Identical trees are checked once. Every S_min / S_max
   state and every state with a store marker is checked; of the "interrupted init" states a
   seeded 100 are (when init made the 256 fan-out directories, until 2026-12-04, there
   were ~2,500 of them; init makes none now, and the sample takes them all).

3. **Check** each distinct state, materialised as a real tree (hard links as hard links) with
   castore itself: no store marker = an interrupted init (allowed only before init returned);
   otherwise the marker is whole, every final-named object re-hashes to its name, every task
   with slot 0 verifies (`store.history`), each slot holds the snapshot the walk reached at
   its sequence, every blob a snapshot names exists; every acknowledged commit / blob / init
   before the crash point survives; and `castore.maintenance.fsck.check_store` reports no error.

4. **Self-tests**: the same recording and checker with the directory fsync removed
   (`fsio.fsync_dir` a no-op), with only the chain directory's fsync removed, and with the
   temp file's fsync removed (`os.fsync` on a regular file a no-op) must each find a state
   that breaks invariant I or loses an acknowledged commit.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from statebuilder import StateBuilder, materialize
from statebuilder import remove_trees as _remove

import castore
from castore.chain.refs import TaskSlots
from castore.errors import CastoreError
from castore.format.digest import hash_bytes
from castore.format.layout import (
    CHAIN_DIR,
    MARKER_NAME,
    OBJECTS_DIR,
    TASKS_DIR,
    decode_task_id,
    is_object_name,
    parse_slot_name,
)
from castore.maintenance.fsck import Severity, check_store
from castore.medium import fsio, groupflush
from castore.medium.flushpolicy import FlushPolicy

STORE = "store"  # the store's directory name inside the recorded base directory
TASKS = ("job-a", "job-b")
PLAN = castore.Plan.build("power", "fetch", "parse", castore.effect("pay"), "report")
PAY = castore.Service("payments", idempotent=True, retention=3600)
# Distinct states to check at most (all S_min / S_max states are always kept; the rest are a
# seeded sample). The default run checks every distinct state: the cap is a safety net.
MAX_STATES = int(os.environ.get("CASTORE_POWER_MAX_STATES", "4000"))
INIT_SAMPLE = int(os.environ.get("CASTORE_POWER_INIT_SAMPLE", "100"))
SEED = int(os.environ.get("CASTORE_POWER_SEED", "20261130"))
PER_OP_RECENT = 6  # per-op choices at each crash point: the newest non-durable ops ...
PER_OP_SAMPLE = 4  # ... plus this many older ones, a seeded sample

ENTRY_KINDS = frozenset({"create", "link", "mkdir", "unlink", "rmdir"})
ADD_KINDS = frozenset({"create", "link", "mkdir"})
DATA_KINDS = frozenset({"write", "truncate"})


# -- the recorded operation log --------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One recorded operation. Paths are relative to the base directory ('.' is the base)."""

    kind: str  # create link mkdir unlink rmdir write truncate fsync fsync_dir ack ack_blob ack_init
    dir: str | None = None  # the directory an entry op changes, or the one fsync_dir syncs
    name: str | None = None  # the entry's name in `dir`
    ino: int | None = None  # the model inode (create, link, write, truncate, fsync)
    offset: int = 0
    data: bytes = b""
    size: int = 0  # truncate: the new length
    mode: int = 0o644  # create: the file's permission bits
    task: str | None = None
    seq: int | None = None
    oid: str | None = None  # ack: the snapshot id; ack_blob: the blob id

    def describe(self) -> str:
        if self.kind in ENTRY_KINDS:
            where = _join(self.dir or ".", self.name or "")
            return f"{self.kind} {where}" + (f" (inode {self.ino})" if self.ino is not None else "")
        end = self.offset + len(self.data)
        return {
            "write": f"write inode {self.ino} [{self.offset}:{end}]",
            "truncate": f"truncate inode {self.ino} to {self.size}",
            "chmod": f"chmod inode {self.ino} {self.mode:o}",
            "fsync": f"fsync inode {self.ino}",
            "fsync_dir": f"fsync directory {self.dir}",
            "syncfs": "syncfs of the filesystem",
            "ack": f"ack {self.task!r} seq {self.seq} = {self.oid}",
            "ack_blob": f"ack blob {self.oid}",
        }.get(self.kind, self.kind)


def _join(directory: str, name: str) -> str:
    return name if directory == "." else f"{directory}/{name}"


def _split(rel: str) -> tuple[str, str]:
    parent, name = os.path.split(rel)
    return parent or ".", name


_REAL_SYNCFS = fsio.syncfs
_REAL = {
    name: getattr(os, name)
    for name in (
        "open",
        "write",
        "fsync",
        "fdatasync",
        "close",
        "link",
        "rename",
        "replace",
        "unlink",
        "remove",
        "mkdir",
        "rmdir",
        "ftruncate",
        "symlink",
        "fchmod",
        "chmod",
    )
}


class Recorder:
    """Wraps the `os` functions castore writes through; records what touches the base dir.

    Patching the `os` module itself (not only `castore.medium.fsio.os`) also catches the fan-out
    mkdirs in `Store.init` and anything castore may add outside fsio later.
    """

    def __init__(
        self, base: str, *, drop_file_fsync: bool = False, drop_syncfs: bool = False
    ) -> None:
        self.base = os.path.realpath(base)
        self.ops: list[Op] = []
        self.names: dict[str, tuple[str, int | None]] = {".": ("dir", None)}
        self.fds: dict[int, tuple[str, Any, int]] = {}  # fd -> ("dir", rel | "file", ino; st_ino)
        self.next_ino = 0
        self.drop_file_fsync = drop_file_fsync  # self-test: the file fsync "removed from the code"
        self.drop_syncfs = drop_syncfs  # self-test: the shared flush of a round removed
        umask = os.umask(0)
        os.umask(umask)
        self.umask = umask

    # -- paths and descriptors
    def rel(self, path: Any, dir_fd: int | None = None) -> str | None:
        if isinstance(path, int):
            return None  # an fd given as a path: only fd-based calls track those
        full = os.fsdecode(os.fspath(path))
        if dir_fd is not None and (dir_fd in self.fds or not os.path.isabs(full)):
            raise AssertionError(f"the power-loss recorder does not model dir_fd ({full!r})")
        full = os.path.abspath(full)
        if full == self.base:
            return "."
        if full.startswith(self.base + os.sep):
            return os.path.relpath(full, self.base)
        return None

    def tracked(self, fd: Any) -> tuple[str, Any, int] | None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        entry = self.fds.get(fd)
        if entry is None:
            return None
        try:
            same = os.fstat(fd).st_ino == entry[2]
        except OSError:
            same = False
        if not same:  # closed behind our back and the number reused by someone else
            del self.fds[fd]
            return None
        return entry

    def file_ino(self, rel: str) -> int:
        entry = self.names.get(rel)
        if entry is None or entry[0] != "file":
            raise AssertionError(f"recording incomplete: {rel!r} was never created in the model")
        assert entry[1] is not None
        return entry[1]

    # -- the wrappers
    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        rel = self.rel(path, dir_fd)
        existed = rel is not None and os.path.lexists(os.path.join(self.base, rel))
        fd: int = _REAL["open"](path, flags, mode, dir_fd=dir_fd)
        self.fds.pop(fd, None)
        if rel is None:
            return fd
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            self.fds[fd] = ("dir", rel, info.st_ino)
            return fd
        if not existed:
            ino = self.next_ino
            self.next_ino += 1
            self.names[rel] = ("file", ino)
            parent, name = _split(rel)
            self.ops.append(Op("create", parent, name, ino, mode=mode & 0o7777 & ~self.umask))
        else:
            ino = self.file_ino(rel)
            if flags & os.O_TRUNC and flags & (os.O_WRONLY | os.O_RDWR):
                self.ops.append(Op("truncate", ino=ino, size=0))
        self.fds[fd] = ("file", ino, info.st_ino)
        return fd

    def write(self, fd: int, data: Any) -> int:
        entry = self.tracked(fd)
        offset = os.lseek(fd, 0, os.SEEK_CUR) if entry is not None else 0
        written: int = _REAL["write"](fd, data)
        if entry is not None:
            assert entry[0] == "file"
            chunk = bytes(memoryview(data).cast("B")[:written])
            self.ops.append(Op("write", ino=entry[1], offset=offset, data=chunk))
        return written

    def fsync(self, fd: Any) -> None:
        self._sync("fsync", fd)

    def fdatasync(self, fd: Any) -> None:
        self._sync("fdatasync", fd)

    def _sync(self, real: str, fd: Any) -> None:
        entry = self.tracked(fd)
        if entry is not None and entry[0] == "file" and self.drop_file_fsync:
            return
        # Recorded before the call: what other threads do while it runs is not covered by it.
        if entry is not None:
            if entry[0] == "dir":
                self.ops.append(Op("fsync_dir", dir=entry[1]))
            else:
                self.ops.append(Op("fsync", ino=entry[1]))
        _REAL[real](fd)

    def syncfs(self, fd: int) -> None:
        """One flush of the whole filesystem (a group commit's round): everything before it."""
        if self.drop_syncfs:
            return
        self.ops.append(Op("syncfs"))
        _REAL_SYNCFS(fd)

    def close(self, fd: int) -> None:
        self.fds.pop(fd, None)
        _REAL["close"](fd)

    def ftruncate(self, fd: int, length: int) -> None:
        entry = self.tracked(fd)
        _REAL["ftruncate"](fd, length)
        if entry is not None:
            self.ops.append(Op("truncate", ino=entry[1], size=length))

    def link(self, src: Any, dst: Any, **kw: Any) -> None:
        _REAL["link"](src, dst, **kw)
        self._linked(src, dst, kw)

    def _linked(self, src: Any, dst: Any, kw: dict[str, Any]) -> None:
        rel_src = self.rel(src, kw.get("src_dir_fd"))
        rel_dst = self.rel(dst, kw.get("dst_dir_fd"))
        if rel_dst is None:
            if rel_src is not None:
                raise AssertionError(f"a link or rename out of the store: {src!r} -> {dst!r}")
            return
        if rel_src is None:
            raise AssertionError(f"a link or rename into the store from outside: {src!r}")
        ino = self.file_ino(rel_src)
        self.names[rel_dst] = ("file", ino)
        parent, name = _split(rel_dst)
        self.ops.append(Op("link", parent, name, ino))

    def rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename("rename", src, dst, kw)

    def replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename("replace", src, dst, kw)

    def _rename(self, real: str, src: Any, dst: Any, kw: dict[str, Any]) -> None:
        rel_src = self.rel(src, kw.get("src_dir_fd"))
        if rel_src is not None and self.names.get(rel_src, ("?",))[0] == "dir":
            raise AssertionError(
                f"the power-loss recorder does not model renaming a directory ({src!r})"
            )
        _REAL[real](src, dst, **kw)
        # The two halves of a rename are two entry ops: a crash may keep either one.
        self._linked(src, dst, kw)
        if rel_src is not None:
            self._unlinked(rel_src)

    def unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        rel = self.rel(path, dir_fd)
        _REAL["unlink"](path, dir_fd=dir_fd)
        if rel is not None:
            self._unlinked(rel)

    def _unlinked(self, rel: str) -> None:
        self.names.pop(rel, None)
        parent, name = _split(rel)
        self.ops.append(Op("unlink", parent, name))

    def mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        rel = self.rel(path, dir_fd)
        _REAL["mkdir"](path, mode, dir_fd=dir_fd)
        if rel is not None:
            self.names[rel] = ("dir", None)
            parent, name = _split(rel)
            self.ops.append(Op("mkdir", parent, name))

    def rmdir(self, path: Any, *, dir_fd: int | None = None) -> None:
        rel = self.rel(path, dir_fd)
        _REAL["rmdir"](path, dir_fd=dir_fd)
        if rel is not None:
            self.names.pop(rel, None)
            parent, name = _split(rel)
            self.ops.append(Op("rmdir", parent, name))

    def fchmod(self, fd: int, mode: int) -> None:
        entry = self.tracked(fd)
        _REAL["fchmod"](fd, mode)
        if entry is not None and entry[0] == "file":
            self.ops.append(Op("chmod", ino=entry[1], mode=mode & 0o7777))

    def chmod(self, path: Any, mode: int, **kw: Any) -> None:
        rel = self.rel(path, kw.get("dir_fd"))
        _REAL["chmod"](path, mode, **kw)
        if rel is not None and self.names.get(rel, ("?",))[0] == "file":
            self.ops.append(Op("chmod", ino=self.file_ino(rel), mode=mode & 0o7777))

    def symlink(self, src: Any, dst: Any, *args: Any, **kw: Any) -> None:
        if self.rel(dst, kw.get("dir_fd")) is not None:
            raise AssertionError(f"castore made a symlink in the store: {dst!r}")
        _REAL["symlink"](src, dst, *args, **kw)

    @contextmanager
    def installed(self) -> Iterator[Recorder]:
        with pytest.MonkeyPatch.context() as mp:
            for name in (
                "open",
                "write",
                "fsync",
                "fdatasync",
                "close",
                "ftruncate",
                "fchmod",
                "chmod",
            ):
                mp.setattr(os, name, getattr(self, name))
            for name in ("link", "rename", "replace", "unlink", "mkdir", "rmdir", "symlink"):
                mp.setattr(os, name, getattr(self, name))
            mp.setattr(os, "remove", self.unlink)
            mp.setattr(fsio, "syncfs", self.syncfs)
            original_commit = TaskSlots.commit
            ops = self.ops

            def commit(
                slots: TaskSlots, data: bytes, seq: int, expected_parent: str, *rest: Any
            ) -> str:
                oid = original_commit(slots, data, seq, expected_parent, *rest)
                ops.append(Op("ack", task=slots.task_id, seq=seq, oid=oid))
                return oid

            mp.setattr(TaskSlots, "commit", commit)
            yield self


# -- the workload ----------------------------------------------------------------------------------


def workload(base: Path, ops: list[Op]) -> None:
    """What castore does for a caller: every kind of object write and commit it has."""
    store = castore.Store.init(base / STORE)
    ops.append(Op("ack_init"))
    for task in TASKS:  # the second start finds the plan object present (EEXIST path)
        run = store.start(task, PLAN)  # with its lock file, as workers run
        run.commit_step("fetch", {"task": task, "rows": 3})
        # A batch (one data flush, one name flush for all), and the same blob twice across
        # the two tasks: deduplicated. The second task commits inside the block: its
        # snapshot joins the batch, whose flushes come before the slot's link.
        inside = task == TASKS[-1]
        with store.batch():
            blob = store.put_blob({"rows": ["x" * 64] * 40})
            raw = store.put_raw(task.encode() * 100)
            tree = store.put_tree({"blob": blob, "raw": raw})
            if inside:
                run.commit_step("parse", tree)
        for ref in (blob.blob, raw.raw, tree.tree):
            ops.append(Op("ack_blob", oid=ref))
        if not inside:
            run.commit_step("parse", tree)
        receipt = run.perform("pay", PAY, lambda key: f"receipt-{key}")
        assert receipt.startswith("receipt-")
        run.commit_step("report", "done")
        assert run.finished
        run.close()


def record(base: Path, *, rounds: bool = False, **options: Any) -> list[Op]:
    """The workload's op log. `rounds`: every flush is a group commit's shared round (one
    syncfs), as when many agents commit at once, instead of a lone writer's precise fsyncs."""
    base.mkdir()
    recorder = Recorder(str(base), **options)
    with recorder.installed(), pytest.MonkeyPatch.context() as mp:
        if rounds:
            mp.setattr(groupflush, "_BY_DEVICE", {})
            mp.setattr(groupflush, "decide", lambda root: FlushPolicy(True, "ext4", "forced"))
            mp.setattr(groupflush.GroupFlush, "_join", _always_a_round)
        workload(base, recorder.ops)
    return recorder.ops


def _always_a_round(flush: groupflush.GroupFlush) -> tuple[Any, bool]:
    """GroupFlush._join as if another committer were always waiting: a shared round."""
    with flush._lock:
        flush._running = groupflush._Round()  # the workload is one thread: nothing else runs
        return flush._running, False


# -- the crash model -------------------------------------------------------------------------------


Tree = dict[str, tuple[Any, ...]]  # rel path -> ("d",) | ("f", ino)


@dataclass
class Model:
    """Index of an op log: entry ops per directory, data ops per inode, modes."""

    ops: list[Op]
    entry_ops: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    data_ops: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    modes: dict[int, int] = field(default_factory=dict)
    tables: dict[tuple[Any, ...], dict[str, tuple[Any, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for index, op in enumerate(self.ops):
            if op.kind in ENTRY_KINDS:
                assert op.dir is not None
                self.entry_ops[op.dir].append(index)
            if op.kind in DATA_KINDS:
                assert op.ino is not None
                self.data_ops[op.ino].append(index)
            if op.kind in ("create", "chmod"):  # permission bits: not crash-modelled, final
                assert op.ino is not None
                self.modes[op.ino] = op.mode

    def points(self) -> Iterator[CrashPoint]:
        """The state of durability after each prefix ops[:i], i = 0 .. len(ops)."""
        applied_dir: dict[str, int] = defaultdict(int)  # entry ops of D in the prefix
        durable_dir: dict[str, int] = defaultdict(int)  # of which an fsync of D covered
        applied_ino: dict[int, int] = defaultdict(int)
        durable_ino: dict[int, int] = defaultdict(int)
        acks: list[Op] = []
        for i in range(len(self.ops) + 1):
            yield CrashPoint(
                self,
                i,
                dict(applied_dir),
                dict(durable_dir),
                dict(applied_ino),
                dict(durable_ino),
                tuple(acks),
            )
            if i == len(self.ops):
                return
            op = self.ops[i]
            if op.kind in ENTRY_KINDS:
                applied_dir[op.dir] += 1  # type: ignore[index]
            elif op.kind in DATA_KINDS:
                applied_ino[op.ino] += 1  # type: ignore[index]
            elif op.kind == "fsync_dir":
                durable_dir[op.dir] = applied_dir[op.dir]  # type: ignore[index]
            elif op.kind == "fsync":
                durable_ino[op.ino] = applied_ino[op.ino]  # type: ignore[index]
            elif op.kind == "syncfs":
                durable_dir.update(applied_dir)
                durable_ino.update(applied_ino)
            elif op.kind.startswith("ack"):
                acks.append(op)

    def content(self, ino: int, count: int, variant: str, durable: int) -> bytes:
        """The bytes of `ino` after its first `count` data ops, per data variant."""
        indices = self.data_ops[ino][:count]
        if variant == "durable":
            indices = indices[:durable]
        buf = bytearray()
        for position, index in enumerate(indices):
            op = self.ops[index]
            data = op.data
            if variant == "torn" and position == len(indices) - 1 and position >= durable:
                data = data[: len(data) // 2]  # the last non-fsynced write, torn
            if op.kind == "truncate":
                del buf[op.size :]
                buf.extend(b"\0" * (op.size - len(buf)))
                continue
            end = op.offset + len(data)
            if len(buf) < op.offset:
                buf.extend(b"\0" * (op.offset - len(buf)))
            buf[op.offset : end] = data
        return bytes(buf)


@dataclass
class CrashPoint:
    model: Model
    index: int  # crash after ops[:index]
    applied_dir: dict[str, int]
    durable_dir: dict[str, int]
    applied_ino: dict[int, int]
    durable_ino: dict[int, int]
    acks: tuple[Op, ...]  # acknowledged before the crash

    def nondurable_entries(self) -> dict[str, list[int]]:
        found = {}
        for directory, count in self.applied_dir.items():
            durable = self.durable_dir.get(directory, 0)
            if count > durable:
                found[directory] = self.model.entry_ops[directory][durable:count]
        return found

    def nondurable_data(self) -> bool:
        return any(n > self.durable_ino.get(ino, 0) for ino, n in self.applied_ino.items())

    def choices(self) -> Iterator[tuple[str, frozenset[int]]]:
        """(label, the non-durable entry ops that reached the disk) for this crash point."""
        per_dir = self.nondurable_entries()
        every = sorted(i for ops in per_dir.values() for i in ops)
        yield "S_min", frozenset()
        yield "S_max", frozenset(every)
        if len(per_dir) > 1:
            for directory, ops in per_dir.items():
                yield f"only dir {directory}", frozenset(ops)
                yield f"all but dir {directory}", frozenset(every) - frozenset(ops)
        if len(every) > 1:
            # Per-op choices: the newest ops, plus a seeded sample of the older ones (a
            # crash point can follow dozens of unsynced names: one state each is too many).
            recent = every[-PER_OP_RECENT:]
            older = every[:-PER_OP_RECENT]
            rng = random.Random(SEED * 1_000_003 + self.index)
            picked = sorted(recent + rng.sample(older, min(PER_OP_SAMPLE, len(older))))
            for index in picked:
                own = per_dir[self.model.ops[index].dir]  # type: ignore[index]
                yield f"only op {index}", frozenset({index})
                yield f"all but op {index}", frozenset(every) - {index}
                yield (
                    f"op {index} after its dir, other dirs dropped",
                    frozenset(i for i in own if i <= index),
                )
                yield f"in order through op {index}", frozenset(i for i in every if i <= index)

    def variants(self) -> tuple[str, ...]:
        return ("full", "durable", "torn") if self.nondurable_data() else ("full",)

    def tree(self, chosen: frozenset[int]) -> Tree:
        """The directory tree reachable from the base with the durable + chosen entry ops."""
        tables: dict[str, dict[str, tuple[Any, ...]]] = {}
        for directory, count in self.applied_dir.items():
            durable = self.durable_dir.get(directory, 0)
            entry_ops = self.model.entry_ops[directory]
            kept = frozenset(i for i in entry_ops[durable:count] if i in chosen)
            cache_key = (directory, durable, count, kept)
            table = self.model.tables.get(cache_key)
            if table is None:
                table = {}
                for index in (*entry_ops[:durable], *sorted(kept)):
                    op = self.model.ops[index]
                    assert op.name is not None
                    if op.kind in ADD_KINDS:
                        table[op.name] = ("d",) if op.kind == "mkdir" else ("f", op.ino)
                    else:
                        table.pop(op.name, None)
                self.model.tables[cache_key] = table
            tables[directory] = table
        tree: Tree = {}
        pending = ["."]
        while pending:
            directory = pending.pop()
            for name, target in tables.get(directory, {}).items():
                path = _join(directory, name)
                tree[path] = target
                if target == ("d",):
                    pending.append(path)
        return tree

    def contents(self, tree: Tree, variant: str) -> dict[int, bytes]:
        inos = {target[1] for target in tree.values() if target[0] == "f"}
        return {
            ino: self.model.content(
                ino, self.applied_ino.get(ino, 0), variant, self.durable_ino.get(ino, 0)
            )
            for ino in inos
        }


def state_key(tree: Tree, contents: dict[int, bytes]) -> frozenset[tuple[Any, ...]]:
    digests = {ino: hashlib.sha256(data).digest() for ino, data in contents.items()}
    return frozenset(
        (path, target[1], digests[target[1]]) if target[0] == "f" else (path,)
        for path, target in tree.items()
    )


# -- checking one state with castore ---------------------------------------------------------------


@dataclass
class Verdict:
    store: bool = False  # a marker exists and the store opens
    problems: list[str] = field(default_factory=list)  # invariant I violations
    fsck_errors: list[str] = field(default_factory=list)
    histories: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task -> ids, oldest first
    good_objects: set[str] = field(default_factory=set)  # final names whose bytes re-hash


def check_state(base: Path) -> Verdict:
    verdict = Verdict()
    root = base / STORE
    _check_objects(root, verdict)
    if not (root / MARKER_NAME).exists():
        return verdict  # an interrupted init: not a store (allowed only before init returned)
    try:
        store = castore.Store.open(root)
    except CastoreError as exc:
        verdict.problems.append(f"{MARKER_NAME} is there but the store does not open: {exc}")
        return verdict
    verdict.store = True
    tasks_dir = root / TASKS_DIR
    if not tasks_dir.is_dir():
        verdict.problems.append("the marker is there but tasks/ is not")
        return verdict
    for name in sorted(os.listdir(tasks_dir)):
        chain = tasks_dir / name / CHAIN_DIR
        if (chain / f"{0:016d}").exists():  # else an interrupted start (FORMAT.md §10.2)
            _check_task(store, decode_task_id(name), chain, verdict)
    for finding in check_store(root, jobs=1):
        if finding.severity is Severity.ERROR:
            verdict.fsck_errors.append(f"{finding.code} {finding.path}: {finding.message}")
    return verdict


def _check_objects(root: Path, verdict: Verdict) -> None:
    """Every final-named object file re-hashes to its name (never a partial file)."""
    objects = os.path.join(root, OBJECTS_DIR)
    if not os.path.isdir(objects):
        return
    for fanout in os.scandir(objects):
        if not fanout.is_dir(follow_symlinks=False):
            continue
        for item in os.scandir(fanout.path):
            if not is_object_name(item.name):
                continue
            with open(item.path, "rb") as handle:
                data = handle.read()
            if hash_bytes(data) == item.name:
                verdict.good_objects.add(item.name)
            else:
                verdict.problems.append(
                    f"{OBJECTS_DIR}/{fanout.name}/{item.name}: a final-named object whose "
                    f"bytes do not re-hash to its name ({len(data)} bytes)"
                )


def _check_task(store: castore.Store, task: str, chain: Path, verdict: Verdict) -> None:
    """The chain verifies, each slot holds the chain's snapshot, every named blob is there."""
    try:
        history = store.history(task)
    except CastoreError as exc:
        verdict.problems.append(f"task {task!r} does not verify: {exc}")
        return
    ids = tuple(oid for oid, _ in reversed(history))
    verdict.histories[task] = ids
    for item in sorted(chain.iterdir()):
        seq = parse_slot_name(item.name)
        if seq is None:
            continue
        held = hash_bytes(item.read_bytes())
        if seq >= len(ids) or held != ids[seq]:
            verdict.problems.append(
                f"task {task!r}: slot {seq} holds {held}, not the chain's snapshot"
            )
    for oid, snapshot in history:
        ref = snapshot.transition.result_ref
        if ref is not None and ref not in verdict.good_objects:
            verdict.problems.append(f"task {task!r}: snapshot {oid} names missing blob {ref}")


def lost_acks(verdict: Verdict, acks: tuple[Op, ...]) -> list[str]:
    """Acknowledged before the crash, missing after it."""
    lost = []
    for ack in acks:
        if ack.kind == "ack_init" and not verdict.store:
            lost.append("Store.init returned, but the state is not a store (no usable marker)")
        elif ack.kind == "ack_blob" and ack.oid not in verdict.good_objects:
            lost.append(f"put_blob returned {ack.oid}, which is missing or damaged")
        elif ack.kind == "ack":
            ids = verdict.histories.get(ack.task or "", ())
            if ack.seq is None or len(ids) <= ack.seq or ids[ack.seq] != ack.oid:
                lost.append(f"acknowledged commit {ack.task!r} seq {ack.seq} ({ack.oid}) is lost")
    return lost


# -- exploring every crash point -------------------------------------------------------------------


@dataclass
class Failure:
    point: int
    label: str
    variant: str
    after: str  # the op the crash came after
    what: list[str]

    def __str__(self) -> str:
        return (
            f"crash after op {self.point - 1} ({self.after}), state {self.label!r} / "
            f"data {self.variant!r}: " + "; ".join(self.what[:4])
        )


@dataclass
class Exploration:
    ops: int = 0
    points: int = 0
    specs: int = 0  # (point, choice, variant) triples before deduplication
    states: int = 0  # distinct trees checked
    sampled_out: int = 0
    rebuilt: int = 0  # states built from nothing, not by changing the one before (statebuilder)
    seconds: float = 0.0
    invariant: list[Failure] = field(default_factory=list)
    acks: list[Failure] = field(default_factory=list)
    fsck: list[Failure] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.ops} ops, {self.points} crash points, {self.specs} crash states "
            f"({self.states} distinct trees checked, {self.rebuilt} built from nothing, "
            f"{self.sampled_out} sampled out) "
            f"in {self.seconds:.1f}s"
        )


def crash_states(model: Model) -> Iterator[tuple[CrashPoint, str, str, Tree, dict[int, bytes]]]:
    """Every (crash point, entry choice, data variant) with its tree and inode contents."""
    for point in model.points():
        seen_here: set[frozenset[int]] = set()
        for label, chosen in point.choices():
            if chosen in seen_here:
                continue
            seen_here.add(chosen)
            tree = point.tree(chosen)
            for variant in point.variants():
                yield point, label, variant, tree, point.contents(tree, variant)


def explore(
    ops: list[Op], scratch: Path, *, stop_at_first: bool = False, checker_writes: bool = False
) -> Exploration:
    """Enumerate the crash states of `ops`, check each distinct tree once, judge every
    (crash point, state) pair against what was acknowledged before that point.

    `stop_at_first` (the self-tests) checks states as they come, unsampled, and stops at the
    first broken invariant or lost acknowledgement. `checker_writes`: check_state may change
    a state (gc healing it), so each is built from nothing (statebuilder.py)."""
    started = time.monotonic()
    model = Model(ops)
    result = Exploration(ops=len(ops), points=len(ops) + 1)
    marker = f"{STORE}/{MARKER_NAME}"
    specs: list[tuple[CrashPoint, str, str, frozenset[Any]]] = []
    states: dict[frozenset[Any], tuple[Tree, dict[int, bytes]]] = {}
    verdicts: dict[frozenset[Any], Verdict] = {}
    builder = StateBuilder(str(scratch), model.modes, checker_writes=checker_writes)

    def judge(point: CrashPoint, label: str, variant: str, key: frozenset[Any]) -> None:
        fresh = key not in verdicts
        if fresh:
            verdicts[key] = check_state(Path(builder.build(*states[key])))
        verdict = verdicts[key]
        after = ops[point.index - 1].describe() if point.index else "nothing"
        if fresh and verdict.problems:
            result.invariant.append(Failure(point.index, label, variant, after, verdict.problems))
        if fresh and verdict.fsck_errors:
            result.fsck.append(Failure(point.index, label, variant, after, verdict.fsck_errors))
        lost = lost_acks(verdict, point.acks)
        if lost:
            result.acks.append(Failure(point.index, label, variant, after, lost))

    try:
        must: set[frozenset[Any]] = set()  # S_min / S_max states and every state with a marker
        for point, label, variant, tree, contents in crash_states(model):
            key = state_key(tree, contents)
            states.setdefault(key, (tree, contents))
            result.specs += 1
            essential = label in ("S_min", "S_max") or marker in tree
            if stop_at_first:
                if essential:
                    judge(point, label, variant, key)
                if result.invariant or result.acks:
                    break
                continue
            if essential:
                must.add(key)
            specs.append((point, label, variant, key))
        if not stop_at_first:
            # Interrupted-init states (no marker) are only checked for partial objects: a
            # seeded sample will do.
            rng = random.Random(SEED)
            order = sorted((k for k in states if k not in must), key=lambda k: sorted(map(repr, k)))
            keep = must | set(rng.sample(order, min(INIT_SAMPLE, len(order))))
            if len(keep) > MAX_STATES:
                keep = set(rng.sample(sorted(keep, key=lambda k: sorted(map(repr, k))), MAX_STATES))
            result.sampled_out = len(states) - len(keep)
            for point, label, variant, key in specs:
                if key in keep:
                    judge(point, label, variant, key)
        builder.check_last()
    finally:
        builder.close()
    result.states = len(verdicts)
    result.rebuilt = builder.rebuilt
    result.seconds = time.monotonic() - started
    return result


def real_tree(base: Path) -> tuple[Tree, dict[int, bytes], dict[int, int]]:
    """The real tree as the model sees it, with real inode numbers."""
    tree: Tree = {}
    contents: dict[int, bytes] = {}
    modes: dict[int, int] = {}
    for directory, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, base)
            info = os.lstat(full)
            if stat.S_ISDIR(info.st_mode):
                tree[rel] = ("d",)
            else:
                assert stat.S_ISREG(info.st_mode), f"{rel}: not a regular file"
                tree[rel] = ("f", info.st_ino)
                contents[info.st_ino] = Path(full).read_bytes()
                modes[info.st_ino] = stat.S_IMODE(info.st_mode)
    return tree, contents, modes


def same_shape(
    a: Tree, a_contents: dict[int, bytes], b: Tree, b_contents: dict[int, bytes]
) -> list[str]:
    """Differences between two trees, up to a renaming of inodes."""
    diffs = [f"only in model: {p}" for p in sorted(set(a) - set(b))]
    diffs += [f"only on disk: {p}" for p in sorted(set(b) - set(a))]
    group_a: dict[Any, set[str]] = defaultdict(set)
    group_b: dict[Any, set[str]] = defaultdict(set)
    for path in sorted(set(a) & set(b)):
        if a[path][0] != b[path][0]:
            diffs.append(f"{path}: a {a[path][0]} in the model, a {b[path][0]} on disk")
        elif a[path][0] == "f":
            if a_contents[a[path][1]] != b_contents[b[path][1]]:
                diffs.append(f"{path}: bytes differ")
            group_a[a[path][1]].add(path)
            group_b[b[path][1]].add(path)
    if sorted(map(sorted, group_a.values())) != sorted(map(sorted, group_b.values())):
        diffs.append("hard links differ")
    return diffs


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Op], Path]:
    base = tmp_path_factory.mktemp("power") / "base"
    return record(base), base


@pytest.fixture(scope="module")
def exploration(
    recording: tuple[list[Op], Path], tmp_path_factory: pytest.TempPathFactory
) -> Exploration:
    with scratch_dir(tmp_path_factory.mktemp("states")) as scratch:
        result = explore(recording[0], scratch)
    print(f"\npower loss: {result.summary()}")
    return result


@pytest.fixture(scope="module")
def recording_rounds(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Op], Path]:
    base = tmp_path_factory.mktemp("power-rounds") / "base"
    return record(base, rounds=True), base


@pytest.fixture(scope="module")
def exploration_rounds(
    recording_rounds: tuple[list[Op], Path], tmp_path_factory: pytest.TempPathFactory
) -> Exploration:
    with scratch_dir(tmp_path_factory.mktemp("states-rounds")) as scratch:
        result = explore(recording_rounds[0], scratch)
    print(f"\npower loss, group commit rounds: {result.summary()}")
    return result


@contextmanager
def scratch_dir(fallback: Path) -> Iterator[Path]:
    """Where crash states are built: tmpfs if there is one (each state is ~260 directories
    and metadata ops on a disk cost 10x more), else `fallback`."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        path = tempfile.mkdtemp(prefix="castore-power-", dir=shm)
        try:
            yield Path(path)
        finally:
            _remove([path])
    else:
        yield fallback


def _report(failures: list[Failure], limit: int = 12) -> str:
    """One line per distinct problem: where it first showed up and in how many states."""
    first: dict[str, Failure] = {}
    count: dict[str, int] = defaultdict(int)
    for failure in failures:
        for what in failure.what:
            first.setdefault(what, failure)
            count[what] += 1
    lines = [
        f"- {what}\n    in {count[what]} state(s), first: {first[what]}"
        for what in list(first)[:limit]
    ]
    if len(first) > limit:
        lines.append(f"... and {len(first) - limit} more distinct problems")
    return "\n".join(lines)


# -- tests: the model itself -----------------------------------------------------------------------


def test_model_drops_what_no_fsync_covered(tmp_path: Path) -> None:
    """A hand-made log: unsynced data, unsynced names, a synced name over unsynced data,
    hard links as one inode, a rename's two halves."""
    ops = [
        Op("mkdir", ".", "d"),
        Op("fsync_dir", dir="."),
        Op("create", "d", "a", 0, mode=0o444),
        Op("write", ino=0, offset=0, data=b"abcdefgh"),
        Op("create", "d", "b", 1),
        Op("write", ino=1, offset=0, data=b"12345678"),
        Op("fsync", ino=1),
        Op("link", "d", "b2", 1),
        Op("fsync_dir", dir="d"),
        Op("link", ".", "c", 1),  # another directory, never synced
        Op("unlink", "d", "b"),  # never synced either
    ]
    model = Model(ops)
    points = list(model.points())
    end = points[-1]
    s_min = end.tree(frozenset())
    assert s_min == {"d": ("d",), "d/a": ("f", 0), "d/b": ("f", 1), "d/b2": ("f", 1)}
    assert end.contents(s_min, "durable") == {0: b"", 1: b"12345678"}  # a: name, no data
    assert end.contents(s_min, "torn")[0] == b"abcd"
    assert end.contents(s_min, "full")[0] == b"abcdefgh"
    labels = dict(end.choices())
    assert end.tree(labels["only op 10"]) == {k: v for k, v in s_min.items() if k != "d/b"}
    assert "c" in end.tree(labels["only op 9"])
    assert "d/b" in end.tree(labels["only op 9"])
    # Before the first fsync of '.', even the directory may be gone.
    assert points[1].tree(frozenset()) == {}
    materialize(str(tmp_path / "m"), s_min, end.contents(s_min, "full"), model.modes)
    assert (tmp_path / "m/d/b").stat().st_ino == (tmp_path / "m/d/b2").stat().st_ino
    assert stat.S_IMODE((tmp_path / "m/d/a").stat().st_mode) == 0o444


def test_the_recording_is_the_real_write_path(recording: tuple[list[Op], Path]) -> None:
    """The model, with every op applied, is exactly the tree castore left on disk (names,
    bytes, hard links): the recorder missed nothing. And the log has what a commit does."""
    ops, base = recording
    model = Model(ops)
    end = list(model.points())[-1]
    tree = end.tree(frozenset(i for ops_ in end.nondurable_entries().values() for i in ops_))
    contents = end.contents(tree, "full")
    disk, disk_contents, disk_modes = real_tree(base)
    assert same_shape(tree, contents, disk, disk_contents) == []
    for path, target in tree.items():
        if target[0] == "f":
            assert model.modes[target[1]] == disk_modes[disk[path][1]], path
    kinds = {op.kind for op in ops}
    assert {"create", "write", "fsync", "link", "unlink", "mkdir", "fsync_dir"} <= kinds
    acks = [op for op in ops if op.kind == "ack"]
    # per task: start, fetch, parse, pay SUBMITTED, pay CONFIRMED, report
    assert [(a.task, a.seq) for a in acks] == [(t, s) for t in TASKS for s in range(6)]
    # Every acknowledged commit: slot linked, then the chain directory fsynced, then the ack.
    for index, op in enumerate(ops):
        if op.kind == "ack":
            chain = f"{STORE}/{TASKS_DIR}/{op.task}/{CHAIN_DIR}"
            assert ops[index - 1] == Op("fsync_dir", dir=chain)
            assert ops[index - 2].kind == "link"
            assert ops[index - 2].dir == chain


def _flushes_between(ops: list[Op], task: str, seq: int) -> list[str]:
    """The flushes from the ack of `task`'s seq - 1 to the ack of its seq, but for the one
    that makes a new fan-out directory durable (once per fan-out in a store's life)."""
    acks = {(op.task, op.seq): i for i, op in enumerate(ops) if op.kind == "ack"}
    start = acks[(task, seq - 1)] + 1
    window = ops[start : acks[(task, seq)]]
    objects = f"{STORE}/{OBJECTS_DIR}"
    return [
        op.kind
        for index, op in enumerate(window, start)
        if op.kind in ("fsync", "fsync_dir", "syncfs")
        and not (
            op.dir == objects and (ops[index - 1].kind, ops[index - 1].dir) == ("mkdir", objects)
        )
    ]


def test_a_plain_commit_makes_two_flushes(recording: tuple[list[Op], Path]) -> None:
    """A commit with an inline result (the last step, 'report') syncs its snapshot's temp
    file and the chain directory, and not the fan-out directory (FORMAT.md 9.3)."""
    ops, _ = recording
    for task in TASKS:
        assert ["fsync", "fsync_dir"] == _flushes_between(ops, task, 5)


def test_a_group_commit_round_is_two_syncfs(recording_rounds: tuple[list[Op], Path]) -> None:
    """In shared rounds the same commit is two syncfs: one before its slot, one after."""
    ops, _ = recording_rounds
    for task in TASKS:
        assert ["syncfs", "syncfs"] == _flushes_between(ops, task, 5)
    for index, op in enumerate(ops):
        if op.kind == "ack":
            assert ops[index - 1] == Op("syncfs")
            assert ops[index - 2].kind == "link"
            assert ops[index - 2].dir == f"{STORE}/{TASKS_DIR}/{op.task}/{CHAIN_DIR}"


# -- tests: castore's write path -------------------------------------------------------------------


@pytest.fixture(scope="module", params=["lone writer", "group commit rounds"])
def any_exploration(request: pytest.FixtureRequest) -> Exploration:
    """Both write paths: a lone writer's precise fsyncs, and the shared syncfs rounds."""
    name = "exploration" if request.param == "lone writer" else "exploration_rounds"
    result: Exploration = request.getfixturevalue(name)
    return result


def test_invariant_I_holds_in_every_power_loss_state(any_exploration: Exploration) -> None:
    exploration = any_exploration
    assert exploration.states > 100, exploration.summary()
    if exploration.invariant:
        pytest.fail(
            f"{exploration.summary()}\ninvariant I broken in {len(exploration.invariant)} "
            f"state(s):\n{_report(exploration.invariant)}",
            pytrace=False,
        )


def test_no_acknowledged_commit_is_lost_in_any_power_loss_state(
    any_exploration: Exploration,
) -> None:
    exploration = any_exploration
    if exploration.acks:
        pytest.fail(
            f"{exploration.summary()}\nacknowledged work lost in {len(exploration.acks)} "
            f"crash state(s):\n{_report(exploration.acks)}",
            pytrace=False,
        )


def test_fsck_reports_no_error_in_any_power_loss_state(any_exploration: Exploration) -> None:
    """Leftovers of a power loss are harmless (FORMAT.md §13: temp files, unreachable objects,
    a task directory without slot 0, a snapshot whose object name was lost): fsck may report
    them, never as errors."""
    exploration = any_exploration
    if exploration.fsck:
        pytest.fail(
            f"{exploration.summary()}\nfsck errors in {len(exploration.fsck)} state(s):\n"
            f"{_report(exploration.fsck)}",
            pytrace=False,
        )


# -- self-tests: the checker fails when a durability step is removed -------------------------------


def _broken(tmp_path: Path, **options: Any) -> Exploration:
    ops = record(tmp_path / "base", **options)
    (tmp_path / "states").mkdir()
    with scratch_dir(tmp_path / "states") as scratch:
        result = explore(ops, scratch, stop_at_first=True)
    for failure in result.invariant + result.acks:
        print(f"\nself-test caught: {failure}")
    return result


def test_self_test_without_the_directory_fsync_the_checker_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsio, "fsync_dir", lambda directory: None)
    result = _broken(tmp_path)
    assert result.acks or result.invariant, f"no failure found: {result.summary()}"


def test_self_test_without_the_chain_directory_fsync_an_acked_commit_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the commit's own fsync (refs.TaskSlots.commit step 4) removed."""
    real = fsio.fsync_dir

    def fsync_dir(directory: str) -> None:
        if os.path.basename(directory) != CHAIN_DIR:
            real(directory)

    monkeypatch.setattr(fsio, "fsync_dir", fsync_dir)
    result = _broken(tmp_path)
    assert result.acks, f"no acknowledged commit lost: {result.summary()}"
    assert "acknowledged commit" in " ".join(result.acks[0].what), str(result.acks[0])


def test_self_test_without_the_temp_file_fsync_the_checker_fails(tmp_path: Path) -> None:
    """os.fsync on the temp file (fsio.write_temp, the only file fsync) removed."""
    result = _broken(tmp_path, drop_file_fsync=True)
    assert result.acks or result.invariant, f"no failure found: {result.summary()}"


def test_self_test_without_the_shared_syncfs_the_checker_fails(tmp_path: Path) -> None:
    """The syncfs of a group commit round (groupflush.GroupFlush) and of a batch
    (store.batch) removed."""
    result = _broken(tmp_path, rounds=True, drop_syncfs=True)
    assert result.acks or result.invariant, f"no failure found: {result.summary()}"
