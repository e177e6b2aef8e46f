"""Benchmark what a long history costs: verified resume, status, watch, bytes and inodes per step.

    python tools/bench_history.py [--rounds 3] [--dir PATH] [--quick] [--with-1m]
        [--only resume,disk,watch,status,langgraph] [--watch-lengths 1000,10000] [--watch-pace S]

Builds its stores itself, with fsync switched off while building (reads are measured here, not
durability). Baselines from the same run, when the `bench` extra is installed: LangGraph's
SqliteSaver, `get_tuple` on a thread as long as the castore task, `get_tuple` over 5,000 threads,
and its bytes on disk for the same payload.

Last lines are key=value, with issue 13's targets: resume_100k_ms <= 50, resume_1m_ms <= 500,
resume_1m_rss_mb <= 100, status_5000_s <= 0.5, watch_cpu_ms_per_commit_10k <= 1 (flat in history
length), disk_per_payload <= 2, inodes_per_step <= 0.01 (a finished, hence sealed, task).
`resume_*_again_ms` resumes with the plan object of an earlier resume in the same process
(its validation and digest are remembered per plan object); `resume_*_by_id_ms` resumes by
the plan's id alone (`store.resume(task, plan_id=...)`: the stored plan is read, none built).
`resume_*_plan_digest_ms` is the
part of a resume spent on the digest of the caller's plan, a cost of the long fixed plan rather
than of the chain; `resume_*_chain_ms` is the chain's part
(verify_chain given the caller's plan). `resume_*_grown_ms` and `_grown_rss_mb` resume a task of
as many steps that an agent decided as it ran (`run.append`, a growing plan): its caller passes
no steps, so that resume costs the history alone. `inodes_per_step_task` leaves out the 258
directories every store has from init (fan-out and tasks/), which do not grow with steps.
`--quick` divides every size by 10 (keys keep their names, values are for the smaller sizes: a
smoke run, not a result). The stores are
format v2: runs seal every 4,096 commits and a finished task is sealed whole. The 1M-step store
takes several minutes to build, so it is built only with `--with-1m`.
`--only` runs some of the measurements (each builds its own store). `--watch-lengths` gives the
chain lengths at which the watcher's CPU per commit is measured (`watch_cpu_ms_per_commit_10k=`
for 10,000 steps, `_1k` for 1,000): the same figure at two lengths shows whether it is flat.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore import Plan, Store

PAYLOAD_WORDS = "the agent read the page, kept three facts and chose the next tool to call; "
TASK = "history"


def payload(i: int) -> str:
    """About 200 characters of plain text: what one agent step typically records."""
    return f"step {i}: " + (PAYLOAD_WORDS * 3)[: 200 - len(f"step {i}: ")]


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Building a million-step store with real fsyncs would take an hour and measure nothing."""
    saved = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = saved


def plan_of(steps: int, shape: str = "fixed") -> Plan:
    """The caller's plan: `steps` steps fixed up front, or (`grown`) an agent's growing plan,
    whose steps are decided as it runs and which the caller passes empty on resume."""
    if shape == "grown":
        return Plan.grow(TASK)
    return Plan.build(TASK, *(f"s{i}" for i in range(steps)))


def new_store(root: str) -> Store:
    """A new store: format v2, where runs seal."""
    store = Store.init(root)
    assert store.format_version >= 2, "the bench measures format v2"
    return store


def build_task(
    root: str, task: str, steps: int, *, store: Store | None = None, shape: str = "fixed"
) -> Store:
    """A store (created if `store` is None) holding task `task` with `steps` committed steps,
    finished: sealed every 4,096 commits as it ran, then whole by its SEAL commit at close.
    `shape` "grown": each step decided and recorded by one `run.append`, then `finish`."""
    store = store or new_store(root)
    with no_fsync(), store.start(task, plan_of(steps, shape)) as run:
        if shape == "grown":
            for index in range(steps):
                run.append(f"s{index}", payload(index))
            run.finish()
        else:
            for step in run.pending():
                run.commit_step(step, payload(run.head.seq))
    return store


def chain_verify_ms(store: Store, task: str, steps: int, rounds: int) -> float:
    """Best of `rounds`: what a resume spends on the chain itself (HEAD to the plan root,
    tail link by link, packs by digest), given the caller's plan and its digest."""
    from castore.chain.verify import verify_chain
    from castore.format.plans import plan_id

    plan = plan_of(steps)
    expected = (plan_id(plan), plan)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        verify_chain(store.objects, store._slots(task), expected, keep_tail=True)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def plan_digest_ms(steps: int, rounds: int) -> float:
    """Best of `rounds`: the digest of the caller's plan, which every resume computes (the
    gate compares it with the task's): what a long fixed plan costs, apart from the chain."""
    from castore.format.plans import plan_id

    best = float("inf")
    for _ in range(rounds):
        plan = plan_of(steps)  # a new object each round: its digest is not remembered yet
        start = time.perf_counter()
        plan_id(plan)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def resume_by_id_ms(store: Store, task: str, steps: int, rounds: int) -> float:
    """Best of `rounds`: resume by the plan's id (`store.resume(task, plan_id=...)`): the
    plan is read and checked from the store, a new object each round, none is built."""
    plan_id = store.put_plan(plan_of(steps))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        with store.resume(task, plan_id=plan_id) as run:
            elapsed = time.perf_counter() - start
            assert run.finished
        best = min(best, elapsed)
    return best * 1000


def resume_ms(
    store: Store, task: str, steps: int, rounds: int, shape: str = "fixed", *, again: bool = False
) -> float:
    """Best of `rounds`: open the task, verify HEAD back to the plan root, pass the gate (the
    caller's plan made anew each round, outside the timing, as a new process would; `again`:
    one plan object resumed with every round, as a process that resumes its task again does,
    after a first resume outside the timing)."""
    best = float("inf")
    kept = plan_of(steps, shape)
    if again:
        with store.resume(task, kept):
            pass
    for _ in range(rounds):
        plan = kept if again else plan_of(steps, shape)
        start = time.perf_counter()
        with store.resume(task, plan) as run:
            elapsed = time.perf_counter() - start
            assert run.finished
        best = min(best, elapsed)
    return best * 1000


def resume_rss_mb(root: str, steps: int, shape: str = "fixed") -> float:
    """Peak RSS that resuming adds, in a fresh process that opens the store and builds the
    caller's plan first: the kernel's high-water mark is reset to the current RSS just before
    the resume (/proc/self/clear_refs, Linux 4.0+) and read after it."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", "resume", root, str(steps), shape],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def child(mode: str, root: str, steps: int, shape: str) -> None:
    store = Store.open(root)
    plan = plan_of(steps, shape)
    Path("/proc/self/clear_refs").write_text("5\n")  # VmHWM := VmRSS
    before = _status_kib("VmHWM")
    if mode == "resume":
        with store.resume(TASK, plan):
            pass
    print(_status_kib("VmHWM") - before)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def disk_usage(root: str) -> tuple[int, int]:
    """(bytes allocated, inodes) under `root`, each inode counted once however many names."""
    seen: dict[int, int] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            info = os.lstat(os.path.join(directory, name))
            seen[info.st_ino] = info.st_blocks * 512
    return sum(seen.values()), len(seen)


def cli(*args: str) -> float:
    """Wall seconds of one `castore` command, run as a user runs it: with its modules'
    bytecode cached (an installed package has it; PYTHONDONTWRITEBYTECODE, set on some
    machines, would make every run compile castore's ~160 modules again, ~0.1 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "castore", *args],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled_cpu(pid: int, quiet_s: float = 0.5, limit_s: float = 30.0) -> float:
    """The process's CPU time once it has stopped using any for `quiet_s` seconds."""
    deadline = time.monotonic() + limit_s
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu_seconds(pid)
        if now == last:
            return now
        last = now
    return last


def watch_cpu_ms_per_commit(root: str, steps: int, commits: int, pace: float = 0.0) -> float:
    """CPU a real `castore watch` spends per commit while one agent appends to a long chain,
    one commit every `pace` seconds (0: as fast as it can, so the watcher's debounce folds
    several commits into one check; a pace above the debounce makes each commit its own)."""
    store = Store.open(root)
    task = "watched"
    plan = plan_of(steps + commits)
    with no_fsync(), store.start(task, plan) as run:
        for _ in range(steps):
            step = run.next_step
            assert step is not None
            run.commit_step(step, payload(run.head.seq))
    watcher = subprocess.Popen(
        [sys.executable, "-m", "castore", "watch", root, "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        before = settled_cpu(watcher.pid)
        started = time.monotonic()
        with store.resume(task, plan) as run:
            for _ in range(commits):
                step = run.next_step
                assert step is not None
                run.commit_step(step, payload(run.head.seq))
                time.sleep(pace)
        # The watcher's full rescan (every 30 s by default) costs the whole history: a window
        # longer than that includes one, and the figure is then no longer per commit alone.
        window = time.monotonic() - started
        after = settled_cpu(watcher.pid)
        print(f"watch at {steps} steps: {commits} commits in {window:.1f} s", file=sys.stderr)
    finally:
        watcher.kill()
        watcher.wait()
    return (after - before) * 1000 / commits


class SqliteThreads:
    """LangGraph's SqliteSaver holding threads of checkpoints with the same payload."""

    def __init__(self, path: str) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.path = path
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.saver.setup()
        self.conn.execute("PRAGMA synchronous=OFF")  # building, as for castore
        self.empty_checkpoint = empty_checkpoint

    def fill(self, thread: str, steps: int) -> None:
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        for i in range(steps):
            checkpoint = self.empty_checkpoint()
            checkpoint["channel_values"] = {"result": payload(i)}
            config = self.saver.put(config, checkpoint, {"source": "loop", "step": i}, {})

    def get_tuple_ms(self, thread: str, rounds: int) -> float:
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            assert self.saver.get_tuple(config) is not None
            best = min(best, time.perf_counter() - start)
        return best * 1000

    def disk_bytes(self) -> int:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(
            os.path.getsize(self.path + suffix)
            for suffix in ("", "-wal")
            if os.path.exists(self.path + suffix)
        )


def sqlite_threads(path: str) -> SqliteThreads | None:
    try:
        return SqliteThreads(path)
    except ImportError:
        print(
            "langgraph-checkpoint-sqlite not installed: pip install -e '.[bench]'", file=sys.stderr
        )
        return None


def measure_resume(base: str, steps: int, label: str, rounds: int) -> dict[str, float]:
    """resume_<label>_ms, its plan digest and chain parts, and its RSS, on a finished task
    of a fixed plan; then resume_<label>_grown_ms and _grown_rss_mb on a finished agent task
    of as many steps decided as it ran (a growing plan: the caller's plan is empty)."""
    root = os.path.join(base, f"resume-{label}")
    store = build_task(root, TASK, steps)
    results = {
        f"resume_{label}_ms": resume_ms(store, TASK, steps, rounds),
        f"resume_{label}_again_ms": resume_ms(store, TASK, steps, rounds, again=True),
        f"resume_{label}_by_id_ms": resume_by_id_ms(store, TASK, steps, rounds),
        f"resume_{label}_plan_digest_ms": plan_digest_ms(steps, rounds),
        f"resume_{label}_chain_ms": chain_verify_ms(store, TASK, steps, rounds),
        f"resume_{label}_rss_mb": resume_rss_mb(root, steps),
    }
    shutil.rmtree(root)
    store = build_task(root, TASK, steps, shape="grown")
    results[f"resume_{label}_grown_ms"] = resume_ms(store, TASK, steps, rounds, "grown")
    results[f"resume_{label}_grown_rss_mb"] = resume_rss_mb(root, steps, "grown")
    shutil.rmtree(root)
    return results


def measure_disk(base: str, steps: int) -> dict[str, float]:
    """Bytes and inodes of a finished (sealed) task of `steps` steps of ~200 B each."""
    root = os.path.join(base, "small")
    build_task(root, TASK, steps)
    allocated, inodes = disk_usage(root)
    empty = os.path.join(base, "empty")
    new_store(empty)
    skeleton = disk_usage(empty)[1]  # the store's own directories, shared by all its tasks
    shutil.rmtree(empty)
    shutil.rmtree(root)
    return {
        "disk_per_payload": allocated / (steps * len(payload(0))),
        "inodes_per_step": inodes / steps,
        "inodes_per_step_task": (inodes - skeleton) / steps,
    }


def measure(base: str, args: argparse.Namespace) -> dict[str, float]:
    scale = 10 if args.quick else 1
    results: dict[str, float] = {}
    long_steps, small_steps, tasks, task_steps = (
        100_000 // scale,
        10_000 // scale,
        5000 // scale,
        50,
    )

    if "resume" in args.only:
        results.update(measure_resume(base, long_steps, "100k", args.rounds))
        print(f"resume of {long_steps} steps: {results['resume_100k_ms']:.1f} ms", file=sys.stderr)

    if args.with_1m:
        results.update(measure_resume(base, 1_000_000 // scale, "1m", args.rounds))

    if "disk" in args.only:
        results.update(measure_disk(base, small_steps))

    if "watch" in args.only:
        for length in args.watch_lengths:
            root = os.path.join(base, f"watch-{length}")
            new_store(root)
            per_commit = watch_cpu_ms_per_commit(root, length // scale, 200, args.watch_pace)
            results[f"watch_cpu_ms_per_commit_{size_label(length)}"] = per_commit
            shutil.rmtree(root)

    if "status" in args.only:
        root = os.path.join(base, "many")
        store = new_store(root)
        for t in range(tasks):
            build_task(root, f"task-{t:05d}", task_steps, store=store)
        cli("--help")  # writes the bytecode cache, if it is missing
        results["status_5000_s"] = min(cli("status", "--store", root) for _ in range(args.rounds))
        shutil.rmtree(root)

    lg = sqlite_threads(os.path.join(base, "lg.sqlite")) if "langgraph" in args.only else None
    if lg is not None:
        lg.fill("long", long_steps)
        results["langgraph_get_tuple_ms"] = lg.get_tuple_ms("long", args.rounds * 10)
        for t in range(tasks):
            lg.fill(f"task-{t:05d}", task_steps)
        start = time.perf_counter()
        for t in range(tasks):
            lg.get_tuple_ms(f"task-{t:05d}", 1)
        results["langgraph_get_tuple_5000_s"] = time.perf_counter() - start
        small = SqliteThreads(os.path.join(base, "lg-small.sqlite"))
        small.fill("small", small_steps)
        results["langgraph_disk_per_payload"] = small.disk_bytes() / (small_steps * len(payload(0)))
    return results


def size_label(steps: int) -> str:
    """10000 -> 10k, 1000000 -> 1m, 500 -> 500: the suffix of a key named after a length."""
    for suffix, size in (("m", 1_000_000), ("k", 1000)):
        if steps >= size and steps % size == 0:
            return f"{steps // size}{suffix}"
    return str(steps)


def csv_of(convert: Any) -> Any:
    def parse(text: str) -> list[Any]:
        return [convert(part) for part in text.split(",") if part]

    return parse


MEASUREMENTS = ("resume", "disk", "watch", "status", "langgraph")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the scratch stores go (default: temp)")
    parser.add_argument("--quick", action="store_true", help="every size divided by 10")
    parser.add_argument("--with-1m", action="store_true", help="also build and resume 1M steps")
    parser.add_argument(
        "--only",
        type=csv_of(str),
        default=list(MEASUREMENTS),
        help=f"comma-separated subset of {','.join(MEASUREMENTS)} (default: all)",
    )
    parser.add_argument(
        "--watch-lengths",
        type=csv_of(int),
        default=[1000, 10_000],
        help="chain lengths at which to measure watch CPU per commit (default: 1000,10000)",
    )
    parser.add_argument(
        "--watch-pace",
        type=float,
        default=0.0,
        help="seconds between the watched agent's commits (default 0: as fast as it can)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.child[3])
        return 0
    unknown = set(args.only) - set(MEASUREMENTS)
    if unknown:
        parser.error(
            f"--only: unknown measurement(s) {sorted(unknown)}; choose from {MEASUREMENTS}"
        )
    base = tempfile.mkdtemp(prefix="castore-bench-history-", dir=args.dir)
    try:
        results = measure(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for key, value in results.items():
        print(f"{key}={value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
