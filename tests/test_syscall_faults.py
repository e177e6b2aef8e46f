"""Faults on the real system calls castore makes, injected by strace into a child process.

tests/test_faults.py fails calls inside castore.medium.fsio (exact, in-process); this file fails the
calls themselves, whichever code makes them: filelock's open, os.listdir's getdents64, gc's
rename, a read of the marker, a close. Each case runs one CLI verb or one library path
under `strace -e inject=SYSCALL:error=ERRNO:when=N`, where N is chosen from a first, traced
run of the same case (calls are counted per process and per syscall, as strace counts them),
so that the fault lands on a call whose arguments name a path in the store, never in
Python's startup. Then:
- the exit status is a documented one (docs/reference/cli.md, "Exit codes"; 1 only for fsck's
  findings), and stderr is at most one line, never a traceback; the library raises CastoreError
  only;
- nothing is half-published: fsck of the store afterwards finds no error;
- nothing is lost: every task still verifies at least as far as it did before, and as far
  as the child acknowledged.
EINTR, which Python retries (PEP 475), must change nothing at all.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
from helpers import make_every_fanout
from test_faults import strace_or_skip

import castore
from castore.format import codec
from castore.format.layout import encode_task_id
from castore.maintenance.fsck import Severity, check_store

PLAN = castore.Plan.build("sys", "a", "b", castore.effect("charge", "b"), "c")
# Tasks of the template store and how far each got: the floor no fault may lower.
TEMPLATE_HEADS = {"t/1": 1, "u/1": 3}

# The child: a CLI verb, or one library path that prints `ack SEQ` after each commit that
# returned (an acknowledged commit), and `error CLASS ERRNO` for a castore error (exit 17).
CHILD = r"""
import sys
import castore
from castore.cli import main

PLAN = castore.Plan.build("sys", "a", "b", castore.effect("charge", "b"), "c")
PAYMENTS = castore.Service("payments", idempotent=True, retention=86400)
mode, root, *rest = sys.argv[1:]
rest = [arg.replace("{root}", root) for arg in rest]
if mode == "cli":
    sys.exit(main(["--store", root, *rest]))
try:
    if mode == "init":
        castore.Store.init(root + "-new")
        print("init", flush=True)
    elif mode == "start":
        store = castore.Store.open(root)
        with store.start("n/1", PLAN) as run:
            print("ack n/1 0", flush=True)
            run.commit_step("a", {"x": 1})
            print("ack n/1 1", flush=True)
    elif mode == "commit":
        with castore.Store.open(root).resume("t/1", PLAN) as run:
            run.commit_step("b", [1, 2, 3])
            print("ack t/1 2", flush=True)
    elif mode == "effect":
        with castore.Store.open(root).resume("t/1", PLAN) as run:
            run.commit_step("b", 7)
            print("ack t/1 2", flush=True)
            run.perform("charge", PAYMENTS, lambda key: "rcpt-" + key[:8])
            print("ack t/1 4", flush=True)
    elif mode == "blob":
        store = castore.Store.open(root)
        ref = store.put_blob({"unreferenced": True})  # the template's: refreshed, not written
        with store.resume("t/1", PLAN) as run:
            run.commit_step("b", ref)
            print("ack t/1 2", flush=True)
    elif mode == "watch":  # one rescan of the library's watcher (the CLI's has no --once)
        from castore.watch import Watcher
        Watcher(root, lambda alert: None).check_now()
        print("watch", flush=True)
    elif mode == "read":
        store = castore.Store.open(root)
        for task in store.tasks():
            store.status(task)
            store.history(task)
        print("read", flush=True)
except castore.CastoreError as exc:
    print("error", type(exc).__name__, getattr(exc, "errno", None), flush=True)
    print(exc, file=sys.stderr)
    sys.exit(17)
"""

LIBRARY_ERROR = 17  # the child's status for a CastoreError (any other exception: 1)
OLD = 1_000_000_000  # an mtime in 2001: older than any grace period


def make_template(root: Path) -> None:
    """t/1 at seq 1 (next: b); u/1 at seq 3 with its charge SUBMITTED and no answer (for
    resolve); an unreferenced old blob and an old temp file, for gc to remove."""
    store = castore.Store.init(root)
    payments = castore.Service("payments", idempotent=True, retention=86400)
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", {"n": 1})
    with store.start("u/1", PLAN) as run:
        run.commit_step("a", 1)
        run.commit_step("b", 2)
        with pytest.raises(ConnectionError), run.effect("charge", payments):
            raise ConnectionError("the answer was lost")
    ref = store.put_blob({"unreferenced": True})
    os.utime(store.objects.path(ref.blob), (OLD, OLD))
    leftover = root / "objects" / "00" / ".tmp-host-1-000000000000"
    leftover.parent.mkdir(exist_ok=True)
    leftover.write_bytes(b"partial")
    os.utime(leftover, (OLD, OLD))
    assert TEMPLATE_HEADS == {task: store.verify(task).head.seq for task in store.tasks()}


@attrs.frozen
class Case:
    """The `pick` call on a store path of `syscall` fails with `err` in the child (`mode`)."""

    mode: str  # "cli" or a library path of CHILD
    argv: tuple[str, ...]
    syscall: str
    err: str
    pick: str = "middle"  # first, middle or last of the calls that name a store path

    @property
    def commits(self) -> bool:
        """Whether the case writes a snapshot, whose id is random."""
        return self.mode in ("start", "commit", "effect", "blob") or self.argv[:1] == ("resolve",)

    @property
    def id(self) -> str:
        verb = self.argv[0] if self.argv else self.mode
        return f"{verb}-{self.syscall}-{self.err}-{self.pick}"


# Exit statuses a verb may end with under a fault besides its fault-free one (docs/reference/cli.md
# "Exit codes"): 7 for an I/O error; fsck reports what it could not read as findings (1).
FAULT_EXITS = {"fsck": {1, 7}, "gc": {2, 7}}
CLI_CASES = {
    "status": ("status",),
    "log": ("log", "t/1"),
    "show": ("show", "t/1@1"),
    "fsck": ("fsck", "--jobs", "1"),
    "gc": ("gc", "--grace", "0"),
    "resolve": (
        "resolve",
        "u/1",
        "charge",
        "--not-done",
        "--reason",
        "refused",
        "--submitter-ended",
    ),
    "init": ("init", "{root}-new"),
}


def _cases() -> Iterator[Case]:
    reads = [("openat", "EACCES"), ("read", "EIO"), ("getdents64", "EIO"), ("close", "EIO")]
    for verb in ("status", "log", "show", "fsck"):
        for syscall, err in reads:
            yield Case("cli", CLI_CASES[verb], syscall, err)
    yield Case("cli", CLI_CASES["status"], "openat", "EIO", "first")  # the marker
    yield Case("cli", CLI_CASES["show"], "newfstatat", "EACCES", "last")
    for syscall, err in [
        ("openat", "EACCES"),
        ("getdents64", "EIO"),
        ("linkat", "EIO"),  # gc sets objects aside by link, fsync, unlink
        ("unlink", "EIO"),
        ("fsync", "EIO"),
    ]:
        yield Case("cli", CLI_CASES["gc"], syscall, err)
    for syscall, err in [
        ("openat", "EACCES"),
        ("write", "ENOSPC"),
        ("fsync", "EIO"),
        ("linkat", "EIO"),
        ("flock", "EIO"),
        ("close", "EIO"),
    ]:
        yield Case("cli", CLI_CASES["resolve"], syscall, err)
    for syscall, err in [("mkdir", "EACCES"), ("fsync", "EIO"), ("linkat", "ENOSPC")]:
        yield Case("cli", CLI_CASES["init"], syscall, err, "last")
    for mode, syscall, err, pick in [
        ("start", "mkdir", "ENOSPC", "middle"),
        ("start", "openat", "EACCES", "last"),
        ("start", "fsync", "EIO", "last"),
        ("commit", "openat", "EACCES", "first"),
        ("commit", "openat", "EACCES", "last"),
        ("commit", "read", "EIO", "middle"),
        ("commit", "write", "ENOSPC", "middle"),
        ("commit", "fsync", "EIO", "last"),
        ("commit", "linkat", "EIO", "last"),
        ("effect", "fsync", "EIO", "middle"),
        ("effect", "linkat", "ENOSPC", "last"),
        ("effect", "unlink", "EIO", "last"),
        ("blob", "write", "ENOSPC", "first"),
        ("blob", "openat", "EACCES", "middle"),
        ("blob", "utimensat", "EIO", "first"),
        ("watch", "openat", "EACCES", "middle"),
        ("watch", "getdents64", "EIO", "last"),
        ("watch", "read", "EIO", "middle"),
        ("read", "getdents64", "EIO", "first"),
        ("read", "read", "EIO", "last"),
    ]:
        yield Case(mode, (), syscall, err, pick)
    # close() is not retried (PEP 475: the descriptor is gone either way); after a read
    # that is harmless, so it must change nothing either.
    for verb, syscall in [
        ("status", "read"),
        ("status", "close"),
        ("resolve", "fsync"),
        ("resolve", "openat"),
    ]:
        yield Case("cli", CLI_CASES[verb], syscall, "EINTR")
    yield Case("commit", (), "write", "EINTR")


CASES = list(_cases())

T = TypeVar("T")

# One traced line of strace -f -y: "PID name(args) = result".
_LINE = re.compile(r"^(\d+) +([a-z0-9_]+)\((.*)$")


# The parts of a store path that differ from run to run: a temp file's name, an object's id
# (a snapshot's is random) and so its fan-out directory.
_RANDOM_PARTS = [
    (re.compile(r"/\.tmp-[^/\"<>]*"), "/.tmp-*"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "<id>"),
    (re.compile(r"objects/[0-9a-f]{2}\b"), "objects/<fan-out>"),
]


def store_files(line: str, root: str) -> list[str]:
    """The store paths a traced call names in its arguments, relative to `root`, their random
    parts masked: what a call of the traced run and one of the faulted run must share to be
    the same call."""
    arguments = line.rsplit(") = ", 1)[0]  # the result's descriptor is named too (-y)
    masked = []
    for found in re.findall(re.escape(root) + r'/[^"<>]*', arguments):
        path = found[len(root) + 1 :]
        for pattern, mask in _RANDOM_PARTS:
            path = pattern.sub(mask, path)
        masked.append(path)
    return masked


def traced_calls(log: Path, syscall: str, root: str) -> list[tuple[int, str]]:
    """(ordinal, line) of each of the first process's `syscall` calls that name a path under
    `root`, its ordinal 1-based among all its `syscall` calls (strace -y prints the path of
    every descriptor argument too; the child runs in / so that AT_FDCWD never names it)."""
    ordinals: list[tuple[int, str]] = []
    count, first = 0, None
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match is None or "resumed>" in line:
            continue
        pid, name, rest = match.groups()
        first = first or pid
        if pid != first or name != syscall:
            continue
        count += 1
        if root + "/" in rest:
            ordinals.append((count, line))
    return ordinals


def child_env() -> dict[str, str]:
    """The child's environment: hash seed fixed, so that two runs make the same calls."""
    return {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def run_child(
    case: Case, root: Path, log: Path, inject: str | None = None, trace: str = ""
) -> subprocess.CompletedProcess[str]:
    strace = strace_or_skip()
    command = [strace, "-f", "-qq", "-y", "-o", str(log), "-e", f"trace={trace or case.syscall}"]
    if inject is not None:
        command += ["-e", inject]
    argv = [sys.executable, "-c", CHILD, case.mode, str(root), *case.argv]
    return subprocess.run(
        command + argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env=child_env(),
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "store"
    make_template(root)
    return root


def fresh_store(template: Path, where: Path, case: Case | None = None) -> Path:
    """A copy of the template store (hard links between slots and objects kept). For a case
    that commits, with every fan-out directory made (as castore before format v2 did at init):
    a snapshot's id is random (its run and its time), and its put into a fan-out not yet there
    makes a mkdir and two more openat calls, so the traced run and the faulted run would count
    calls differently and the fault land elsewhere, or nowhere (about one run in seven). The
    other cases keep the template as it is, so that a fault in the middle of fsck's or gc's
    calls lands on a fan-out that holds objects, not on one of 250 empty ones."""
    root = where / "store"
    subprocess.run(["cp", "-a", str(template), str(root)], check=True)
    if case is not None and case.commits:
        make_every_fanout(root)
    return root


DryRuns = dict[tuple[str, tuple[str, ...]], tuple[int, Path]]


@pytest.fixture(scope="module")
def dry_runs() -> DryRuns:
    """(mode, argv) -> (exit status, directory) of its fault-free traced run, made once
    for all the cases of that verb or path (the syscalls of every case are traced)."""
    return {}


def fault_free(
    case: Case, template: Path, runs: DryRuns, factory: pytest.TempPathFactory
) -> tuple[int, list[tuple[int, list[str]]]]:
    """The case run without a fault: its exit status and, for each of its `syscall` calls on
    store paths, its ordinal and the store files it names (`store_files`)."""
    key = (case.mode, case.argv)
    if key not in runs:
        where = factory.mktemp("dry")
        root = fresh_store(template, where, case)
        traced = ",".join(sorted({each.syscall for each in CASES}))
        result = run_child(case, root, where / "trace.log", trace=traced)
        assert result.returncode in (0, 6), result.stderr  # status exits 6: u/1 is in flight
        runs[key] = (result.returncode, where)
    code, where = runs[key]
    calls = traced_calls(where / "trace.log", case.syscall, str(where))
    return code, [(ordinal, store_files(line, str(where))) for ordinal, line in calls]


def pick(calls: list[T], which: str) -> T:
    return {"first": calls[0], "last": calls[-1]}.get(which, calls[len(calls) // 2])


def acknowledged(stdout: str) -> dict[str, int]:
    """task -> the highest seq the child printed `ack` for."""
    acks: dict[str, int] = {}
    for line in stdout.splitlines():
        word, *rest = line.split()
        if word == "ack":
            acks[rest[0]] = max(acks.get(rest[0], -1), int(rest[1]))
    return acks


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_failed_syscall_fails_clearly_and_loses_nothing(
    case: Case,
    template: Path,
    tmp_path: Path,
    dry_runs: DryRuns,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The fault lands on a store path; the exit status is documented, stderr one line
    (never a traceback); fsck then finds no error; every task verifies as far as before
    and as far as the child acknowledged. EINTR changes nothing."""
    (tmp_path / "hit").mkdir()
    baseline, calls = fault_free(case, template, dry_runs, tmp_path_factory)
    assert calls, f"{case.id}: no {case.syscall} call names a store path"
    nth, meant = pick(calls, case.pick)
    root = fresh_store(template, tmp_path / "hit", case)
    log = tmp_path / "hit.log"
    result = run_child(case, root, log, f"inject={case.syscall}:error={case.err}:when={nth}")
    injected = [line for line in log.read_text().splitlines() if "(INJECTED)" in line]
    assert 1 == len(injected), f"{case.id}: strace injected {len(injected)} faults"
    # The very call the traced run chose (the same file, random names aside), not merely a
    # call on the store: a shift in the count would otherwise go unseen.
    assert meant == store_files(injected[0], str(root.parent)), (
        f"the fault landed on another call than the one chosen: {injected[0]}, not {meant}"
    )

    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) <= 1, result.stderr
    verb = case.argv[0] if case.mode == "cli" else case.mode
    if case.err == "EINTR":
        assert baseline == result.returncode, result.stderr  # retried, as if nothing happened
    elif case.mode == "cli":
        allowed = {baseline} | FAULT_EXITS.get(verb, {7})
        assert result.returncode in allowed, (result.returncode, result.stderr)
        if result.returncode not in (baseline, 1):
            assert result.stderr.startswith("castore: error: "), result.stderr
    else:
        assert result.returncode in (0, LIBRARY_ERROR), result.stderr
        if result.returncode == LIBRARY_ERROR:
            word, _class, code = result.stdout.splitlines()[-1].split()
            assert ("error", str(getattr(errno, case.err))) == (word, code)

    store = castore.Store.open(root)
    errors = [f for f in check_store(root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors
    heads = {task: store.verify(task).head.seq for task in store.tasks()}
    for task, floor in {**TEMPLATE_HEADS, **acknowledged(result.stdout)}.items():
        assert heads.get(task, -1) >= floor, (task, heads)


# -- named paths: the faults of the issue, injected on exactly one path (strace -P) --------------


@attrs.frozen
class Named:
    """`syscall` on exactly `relpath` fails with `err` while the CLI runs `argv`; stderr
    must say `says`."""

    argv: tuple[str, ...]
    relpath: str
    syscall: str
    err: str
    says: str


TARGETED = [
    Named(CLI_CASES["resolve"], "tasks/u/1/lock", "openat", "EACCES", "check the permissions"),
    Named(CLI_CASES["status"], "tasks", "openat", "EACCES", "check the permissions"),
    Named(CLI_CASES["status"], "castore.json", "openat", "EACCES", "check the permissions"),
    # Plain status reads HEAD's slot by its path; --verify lists the chain directory too.
    Named(("status", "--verify"), "tasks/t/1/chain", "openat", "EIO", "Input/output error"),
    Named(CLI_CASES["status"], "tasks/t/1/chain/0000000000000001", "openat", "EIO", "Input/o"),
    Named(CLI_CASES["log"], "tasks/t/1/chain/0000000000000001", "openat", "EIO", "Input/output"),
]


@pytest.mark.parametrize("named", TARGETED, ids=lambda n: f"{n.argv[0]}-{n.relpath}-{n.err}")
def test_a_fault_on_a_named_path_is_one_line_exit_7(
    template: Path, tmp_path: Path, named: Named
) -> None:
    """EACCES on the lock file, tasks/ or the marker, EIO on the chain directory or a slot:
    exit 7 with one line naming the path and the system's reason, and what to check."""
    root = fresh_store(template, tmp_path)
    target = root / encode(named.relpath)
    strace = strace_at(target)
    strace.append(f"inject={named.syscall}:error={named.err}")
    result = subprocess.run(
        [*strace, sys.executable, "-c", CHILD, "cli", str(root), *named.argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env=child_env(),
    )
    assert 7 == result.returncode, result.stderr
    assert 1 == len(result.stderr.splitlines()), result.stderr
    assert result.stderr.startswith("castore: error: ")
    assert str(target) in result.stderr
    assert named.says in result.stderr


def strace_at(path: Path) -> list[str]:
    """strace, ready for an `inject=` that applies only to calls naming `path` (-P)."""
    return [strace_or_skip(), "-f", "-qq", "-o", os.devnull, "-P", str(path), "-e"]


def encode(relpath: str) -> str:
    """`relpath` with its task id spelled as the store spells task directories."""
    parts = relpath.split("/")
    if parts[0] == "tasks" and len(parts) > 2:
        task = "/".join(parts[1:3])
        return "/".join(["tasks", encode_task_id(task), *parts[3:]])
    return relpath


def test_resume_in_an_unwritable_store_raises_store_io_error(
    template: Path, tmp_path: Path
) -> None:
    """Library: resume where the lock file cannot be opened (EACCES) raises StoreIOError
    (a CastoreError and an OSError) naming the lock file, not a raw PermissionError."""
    root = fresh_store(template, tmp_path)
    lock = root / encode("tasks/t/1/lock")
    script = (
        "import sys, castore\n"
        "plan = castore.Plan.build('sys', 'a', 'b', castore.effect('charge', 'b'), 'c')\n"
        "try:\n"
        "    castore.Store.open(sys.argv[1]).resume('t/1', plan)\n"
        "except castore.StoreIOError as exc:\n"
        "    print(type(exc).__name__, exc.errno, exc.path, isinstance(exc, OSError))\n"
    )
    result = subprocess.run(
        [*strace_at(lock), "inject=openat:error=EACCES", sys.executable, "-c", script, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=child_env(),
    )
    assert (0, "") == (result.returncode, result.stderr)
    assert f"StoreIOError {errno.EACCES} {lock} True\n" == result.stdout


@pytest.mark.parametrize("syscall", ["linkat", "fsync", "mkdirat"])
def test_quarantine_that_cannot_move_exits_7_and_keeps_the_object(
    template: Path, tmp_path: Path, syscall: str
) -> None:
    """`fsck --quarantine` whose link, fsync or mkdir fails (EIO): exit 7 with one line
    naming the path, never a traceback; the damaged object is still where fsck found it or
    in quarantine/, never gone."""
    root = fresh_store(template, tmp_path)
    store = castore.Store.open(root)
    damaged = Path(store.objects.path(store.objects.put("blob", codec.encode_value([1, 2]))))
    damaged.chmod(0o644)
    damaged.write_bytes(damaged.read_bytes()[:-2])
    damaged.chmod(0o444)
    command = [strace_or_skip(), "-f", "-qq", "-o", os.devnull, "-e"]
    command.append(f"inject={syscall}:error=EIO")
    if syscall == "linkat":  # quarantine moves by link, fsync, unlink, relative to dir fds
        command += ["-P", str(damaged.parent)]
    else:  # the calls quarantine makes after the check: the first one under quarantine/
        command += ["-P", str(root / "quarantine")]
    result = subprocess.run(
        [*command, sys.executable, "-c", CHILD, "cli", str(root), "fsck", "--quarantine"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env=child_env(),
    )
    assert 7 == result.returncode, (result.stdout, result.stderr)
    assert 1 == len(result.stderr.splitlines()), result.stderr
    assert result.stderr.startswith("castore: error: ")
    kept = [damaged] if damaged.exists() else list((root / "quarantine").rglob(damaged.name))
    assert 1 == len(kept)
