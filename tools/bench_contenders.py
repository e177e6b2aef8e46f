"""The contenders tools/bench.py times: castore's commit and effect, LangGraph's put, the flush
floors, 8 concurrent agents of each, and the flush count of a child process under strace.

Each contender is set up once (outside the timing) and then asked for one batch per round;
a batch returns its per-call latencies in µs, or its throughput for the concurrent ones.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue as queue_module
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore import Plan, Service, Store, effect, found
from castore.aio import AsyncStore
from castore.run.run import Run

AGENTS = 8
FLOOR_BYTES = 600  # about the size of castore's snapshot of one small step
FLOOR_SPAN = 4 << 20  # the preallocated file the flush floor rewrites in place
FLUSH_CALLS = ("fsync", "fdatasync", "syncfs")


def timed(call: Callable[[], object], batch: int) -> list[float]:
    """µs of each of `batch` calls."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(batch):
        start = clock()
        call()
        out.append((clock() - start) / 1000)
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


# -- floors ------------------------------------------------------------------------------
class FlushFloor:
    """One flush and nothing else: pwrite FLOOR_BYTES into a preallocated file + fdatasync.

    The file's blocks are written and fsynced up front, so a commit's fdatasync flushes data
    only (no extent conversion, no size change, no journal commit for metadata)."""

    def __init__(self, root: str) -> None:
        self.fd = os.open(os.path.join(root, "floor.dat"), os.O_RDWR | os.O_CREAT, 0o644)
        chunk = b"\0" * (1 << 20)
        for offset in range(0, FLOOR_SPAN, len(chunk)):
            os.pwrite(self.fd, chunk, offset)
        os.fsync(self.fd)
        self.payload = os.urandom(FLOOR_BYTES)
        self.offset = 0

    def commit(self) -> None:
        os.pwrite(self.fd, self.payload, self.offset)
        os.fdatasync(self.fd)
        self.offset = (self.offset + FLOOR_BYTES) % (FLOOR_SPAN - FLOOR_BYTES)


class CreateFloor:
    """What any file-per-commit design pays at least: create a file, write FLOOR_BYTES,
    fsync it, fsync its directory."""

    def __init__(self, root: str) -> None:
        self.directory = os.path.join(root, "files")
        os.makedirs(self.directory)
        self.payload = os.urandom(FLOOR_BYTES)
        self.count = 0

    def commit(self) -> None:
        self.count += 1
        path = os.path.join(self.directory, f"{self.count:016d}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, self.payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# -- LangGraph ---------------------------------------------------------------------------
def langgraph_saver(path: str) -> Any:
    """LangGraph's SqliteSaver on its own database, durable (WAL, synchronous=FULL).
    ImportError without the `bench` extra."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute("PRAGMA synchronous=FULL")
    return saver


class LangGraphThread:
    """One LangGraph thread (its own thread_id) checkpointing through `saver.put`."""

    def __init__(self, saver: Any, thread_id: str) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.saver = saver
        self.empty_checkpoint = empty_checkpoint
        self.config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.count = 0

    def put(self) -> None:
        self.count += 1
        checkpoint = self.empty_checkpoint()
        checkpoint["channel_values"] = {"step": f"s{self.count}", "result": {"n": self.count}}
        metadata: Any = {"source": "loop", "step": self.count}
        self.config = self.saver.put(self.config, checkpoint, metadata, {})

    def effect(self, send: Callable[[str], str]) -> None:
        """An effect the LangGraph way with the same guarantee: the intent durable before the
        send, the result durable after it (two puts)."""
        self.put()
        send(f"lg-{self.count}")
        self.put()


class LangGraphAgents:
    """LangGraph under 8 concurrent agents, in the three configurations it can be run in."""

    CONFIGS = ("1thread", "8threads_1saver", "8threads_8dbs")

    def __init__(self, root: str) -> None:
        shared = langgraph_saver(os.path.join(root, "lg8-shared.sqlite"))
        self.single = LangGraphThread(langgraph_saver(os.path.join(root, "lg8-one.sqlite")), "one")
        self.shared = [LangGraphThread(shared, f"agent-{i}") for i in range(AGENTS)]
        self.separate = [
            LangGraphThread(langgraph_saver(os.path.join(root, f"lg8-{i}.sqlite")), f"agent-{i}")
            for i in range(AGENTS)
        ]

    def commits_per_s(self, config: str, batch: int) -> float:
        if config == "1thread":
            start = time.perf_counter()
            for _ in range(AGENTS * batch):
                self.single.put()
            return AGENTS * batch / (time.perf_counter() - start)
        threads = self.shared if config == "8threads_1saver" else self.separate
        return in_threads([thread.put for thread in threads], batch)[0]


def in_threads(commits: Sequence[Callable[[], object]], batch: int) -> tuple[float, list[float]]:
    """Run each `commit` `batch` times in its own thread, all released at once: (commits/s
    over the wall time, every commit's latency in µs)."""
    barrier = threading.Barrier(len(commits) + 1, timeout=120)

    def work(commit: Callable[[], object]) -> list[float]:
        barrier.wait()
        return timed(commit, batch)

    with ThreadPoolExecutor(len(commits)) as pool:
        futures = [pool.submit(work, commit) for commit in commits]
        barrier.wait()
        start = time.perf_counter()
        latencies = [future.result() for future in futures]  # re-raises a thread's error
        elapsed = time.perf_counter() - start
    return len(commits) * batch / elapsed, [value for out in latencies for value in out]


# -- castore -----------------------------------------------------------------------------
def step_committer(run: Run) -> Callable[[], str]:
    """run.commit_step of the next plan step, with a small result."""

    def commit() -> str:
        step = run.next_step
        assert step is not None, "the bench plan ran out of steps"
        return run.commit_step(step, {"n": run.head.seq})

    return commit


def fixed_plan(name: str, steps: int) -> Plan:
    return Plan.build(name, *(f"s{i}" for i in range(steps)))


class Ledger:
    """The trivial service an effect is sent to: an in-memory ledger of keys."""

    def __init__(self) -> None:
        self.applied: dict[str, str] = {}
        self.service = Service("bench-ledger", reconcile=self.lookup)

    def send(self, key: str) -> str:
        return self.applied.setdefault(key, f"r{len(self.applied)}")

    def lookup(self, key: str) -> Any:
        from castore import NOT_FOUND

        return found(self.applied[key]) if key in self.applied else NOT_FOUND


class Effects:
    """One effect per call through run.perform: SUBMITTED commit, send, CONFIRMED commit."""

    def __init__(self, store: Store, steps: int) -> None:
        plan = Plan.build("bench-effects", *(effect(f"e{i}") for i in range(steps)))
        self.run = store.start("bench-effects", plan)
        self.ledger = Ledger()
        self.bare_count = 0

    def perform(self) -> None:
        step = self.run.next_step
        assert step is not None, "the bench plan ran out of effects"
        self.run.perform(step, self.ledger.service, self.ledger.send)

    def bare_send(self) -> None:
        self.bare_count += 1
        self.ledger.send(f"bare-{self.bare_count}")


def castore_agents(store: Store, label: str, batch: int) -> tuple[float, list[float]]:
    """8 threads, each committing `batch` steps to its own new task of one Store."""
    runs = [store.start(f"a8-{label}-{i}", fixed_plan("a8", batch)) for i in range(AGENTS)]
    try:
        return in_threads([step_committer(run) for run in runs], batch)
    finally:
        for run in runs:
            run.close()


PROC_PLAN_STEPS = 50_000  # more than an agent commits in the window on any machine seen


def castore_agents_processes(root: str, label: str, window_s: float) -> tuple[float, float]:
    """8 processes, as the recipe of docs/howto/agents.md runs them (each a new interpreter
    that opens the store itself), each committing to its own new task. Each starts, opens
    the store and makes its first commit before the barrier; all are released at once and
    commit for `window_s` seconds of steady state. (commits/s of all of them, the µs of CPU
    each spent per commit in the window, user + system of all its threads, median of the 8):
    interpreter start-up and store opening are outside both."""
    context = multiprocessing.get_context("spawn")
    go, ready, done = context.Event(), context.Queue(), context.Queue()
    workers = [
        context.Process(
            target=agent_process, args=(root, f"ap-{label}-{i}", window_s, (go, ready, done))
        )
        for i in range(AGENTS)
    ]
    for worker in workers:
        worker.start()
    try:
        gathered(ready, workers, 120)
        go.set()
        reports = gathered(done, workers, 120 + window_s)
    finally:
        for worker in workers:
            worker.join(timeout=60)
    failed = [worker.exitcode for worker in workers if worker.exitcode != 0]
    assert not failed, f"agent processes exited with {failed}"
    commits = sum(count for count, _, _ in reports)
    # Each agent's own window (release to its last commit): the slowest one bounds the rate.
    elapsed = max(seconds for _, seconds, _ in reports)
    cpu = sorted(cpu_s * 1e6 / count for count, _, cpu_s in reports)
    return commits / elapsed, cpu[len(cpu) // 2]


def gathered(queue: Any, workers: list[Any], timeout: float) -> list[Any]:
    """One item from each worker through `queue`, failing at once if a worker died first."""
    items: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(items) < len(workers):
        try:
            items.append(queue.get(timeout=0.2))
        except queue_module.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            assert not dead, f"agent processes exited with {dead}"
            assert time.monotonic() < deadline, "agent processes did not answer in time"
    return items


def agent_process(root: str, task: str, window_s: float, signals: tuple[Any, Any, Any]) -> None:
    """One agent process of castore_agents_processes: its store opened and its first commit
    made (imports, the task's directories) before the release, then commits until
    `window_s` has passed; reports (commits, seconds, CPU seconds) of the window.
    `signals`: the release (an Event), the ready and the done queues."""
    go, ready, done = signals
    store = Store.open(root)
    with store.start(task, fixed_plan("ap", PROC_PLAN_STEPS)) as run:
        commit = step_committer(run)
        commit()
        ready.put(task)
        go.wait()
        start, cpu = time.perf_counter(), time.process_time()
        deadline, count = start + window_s, 0
        while True:
            commit()
            count += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        done.put((count, now - start, time.process_time() - cpu))


def castore_agents_async(store: Store, label: str, batch: int) -> float:
    """8 coroutines on one event loop (castore.aio), each committing `batch` steps to its own
    new task: commits/s over the wall time."""

    async def agents() -> float:
        astore = AsyncStore(store)
        runs = [
            await astore.start(f"aa-{label}-{i}", fixed_plan("aa", batch)) for i in range(AGENTS)
        ]

        async def agent(index: int) -> None:
            arun = runs[index]
            for i in range(batch):
                await arun.commit_step(f"s{i}", {"n": i})

        start = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(AGENTS)))
        elapsed = time.perf_counter() - start
        for arun in runs:
            await arun.close()
        await astore.close()
        return AGENTS * batch / elapsed

    return asyncio.run(agents())


# -- counting flushes ----------------------------------------------------------------------
def strace_counts(command: list[str], out: str, env: dict[str, str]) -> dict[str, int]:
    """Syscall counts (name -> calls, and "total") of `command` and its threads, by
    `strace -f -c`."""
    subprocess.run(
        ["strace", "-f", "-c", "-o", out, *command],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    counts: dict[str, int] = {}
    row = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\S+)\s*$")
    for line in Path(out).read_text().splitlines():
        match = row.match(line)
        if match:
            counts[match.group(2)] = int(match.group(1))
    if "total" not in counts:
        raise RuntimeError(f"no strace summary in {out}: {Path(out).read_text()[:500]}")
    return counts


def per_commit(
    child: Callable[[int], list[str]], base: str, count: int, env: dict[str, str], commits: int
) -> dict[str, float]:
    """flushes and syscalls per commit of child(n) (a process making n units of `commits`
    commits each): the difference between n = 10 + count and n = 10, so start-up, setup and
    the first commits' lazy work cancel out."""
    small, large = 10, 10 + count
    before = strace_counts(child(small), os.path.join(base, f"strace-{small}.txt"), env)
    after = strace_counts(child(large), os.path.join(base, f"strace-{large}.txt"), env)
    n = count * commits

    def diff(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    return {
        "fsyncs": sum(diff(name) for name in FLUSH_CALLS) / n,
        "syncfs": diff("syncfs") / n,
        "syscalls": diff("total") / n,
        # Threads waiting on each other's locks make futex calls by the thousand, varying
        # from run to run: without them the count is the commit's own work.
        "syscalls_nofutex": (diff("total") - diff("futex")) / n,
    }


def store_in_use(root: str) -> Store:
    """A new store (or the one at `root`) as a store in use has it: with its 256 fan-out
    directories. castore makes each on the first put of an id it holds (one mkdir and one
    flush of objects/ more, 256 times in a store's life); a benchmark of a few hundred
    commits on a new store would measure those first uses more than its commits."""
    store = Store.open(root, create=True)
    objects = os.path.join(root, "objects")
    for fanout in range(256):
        os.makedirs(os.path.join(objects, f"{fanout:02x}"), exist_ok=True)
    fd = os.open(objects, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return store


def child_commits(root: str, count: int, agents: int) -> None:
    """The child strace watches: start a store and make `count` commits on each of `agents`
    tasks (one thread each, all at once when more than one)."""
    store = store_in_use(root)
    runs = [store.start(f"t{i}", fixed_plan("strace", count)) for i in range(agents)]
    commits = [step_committer(run) for run in runs]
    if agents == 1:
        timed(commits[0], count - 1)
    else:
        in_threads(commits, count - 1)
    for run in runs:
        run.close()
