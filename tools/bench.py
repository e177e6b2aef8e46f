"""Benchmark castore's durable commit and verified resume against baselines from the same run.

    python tools/bench.py [--rounds 7] [--batch 200] [--dir PATH] [--quick]

Baselines, interleaved with castore round by round so machine noise hits all alike:
  floor      the two-file durable floor: an object and a pointer, each written as
             temp file + write + fsync + rename + fsync(directory), with castore's snapshot bytes
  langgraph  LangGraph's SqliteSaver.put (WAL, synchronous=FULL), if the `bench` extra is installed
Resume: open + verify the chain of a task with 100, 1,000 and 10,000 snapshots.
The last lines are key=value pairs; ratios below 1 mean castore is faster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore import Plan, Store
from castore.run import Run


def durable_replace(directory: str, name: str, data: bytes) -> None:
    """The classic durable file write: temp, write, fsync, rename, fsync of the directory."""
    temp = os.path.join(directory, f".tmp-{name}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, os.path.join(directory, name))
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Floor:
    """Two durable file writes per commit: the snapshot object, then the HEAD pointer."""

    def __init__(self, root: str, payload: bytes) -> None:
        self.objects = os.path.join(root, "objects")
        self.refs = os.path.join(root, "refs")
        os.makedirs(self.objects)
        os.makedirs(self.refs)
        self.payload = payload
        self.count = 0

    def commit(self) -> None:
        self.count += 1
        name = f"{self.count:016d}"
        durable_replace(self.objects, name, self.payload)
        durable_replace(self.refs, "HEAD", name.encode())


class LangGraph:
    """LangGraph's SqliteSaver.put, durable (WAL with synchronous=FULL)."""

    def __init__(self, root: str) -> None:
        import sqlite3

        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(os.path.join(root, "lg.sqlite"), check_same_thread=False)
        self.saver = SqliteSaver(conn)
        self.saver.setup()
        conn.execute("PRAGMA synchronous=FULL")
        self.empty_checkpoint = empty_checkpoint
        self.config: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        self.count = 0

    def commit(self) -> None:
        self.count += 1
        checkpoint = self.empty_checkpoint()
        checkpoint["channel_values"] = {"step": f"s{self.count}", "result": {"n": self.count}}
        metadata: Any = {"source": "loop", "step": self.count}
        self.config = self.saver.put(self.config, checkpoint, metadata, {})


def castore_run(root: str, steps: int) -> Run:
    store = Store.init(os.path.join(root, "store"))
    plan = Plan.build("bench", *(f"s{i}" for i in range(steps)))
    return store.start("bench", plan)


def timed_batch(commit: Callable[[], None], batch: int) -> float:
    """Mean microseconds per commit over one batch."""
    start = time.perf_counter_ns()
    for _ in range(batch):
        commit()
    return (time.perf_counter_ns() - start) / batch / 1000


def bench_commit(base: str, rounds: int, batch: int) -> dict[str, float]:
    run = castore_run(os.path.join(base, "c"), rounds * batch + 10)
    payload = run._slots.read(0)
    floor = Floor(os.path.join(base, "f"), payload)
    contenders: dict[str, Callable[[], None]] = {"floor": floor.commit}
    try:
        os.makedirs(os.path.join(base, "l"))
        contenders["langgraph"] = LangGraph(os.path.join(base, "l")).commit
    except ImportError:
        print(
            "langgraph-checkpoint-sqlite not installed: pip install -e '.[bench]'", file=sys.stderr
        )

    def castore_commit() -> None:
        step = run.next_step
        assert step is not None
        run.commit_step(step, {"n": run.head.seq})

    contenders["castore"] = castore_commit
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, commit in contenders.items():
            samples[name].append(timed_batch(commit, batch))
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_resume(base: str, length: int) -> float:
    """Seconds to resume (open, verify HEAD → plan root, pass the gate) a chain of `length`."""
    root = os.path.join(base, f"r{length}")
    run = castore_run(root, length)
    plan = run.plan
    for _ in range(length - 1):
        step = run.next_step
        assert step is not None
        run.commit_step(step, {"n": run.head.seq})
    run.close()
    store = Store.open(os.path.join(root, "store"))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        resumed = store.resume("bench", plan)
        times.append(time.perf_counter() - start)
        assert resumed.head.seq == length - 1
        resumed.close()
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument(
        "--dir", default=None, help="where to put the scratch stores (default: a temp dir)"
    )
    parser.add_argument("--quick", action="store_true", help="resume only up to 1,000 snapshots")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="castore-bench-", dir=args.dir)
    try:
        commit = bench_commit(base, args.rounds, args.batch)
        lengths = (100, 1000) if args.quick else (100, 1000, 10000)
        resume = {length: bench_resume(base, length) for length in lengths}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'commit (median of rounds)':<28}{'µs':>10}")
    for name, value in commit.items():
        print(f"  {name:<26}{value:>10.1f}")
    print(f"{'resume (best of 3)':<28}{'s':>10}")
    for length, seconds in resume.items():
        print(f"  {length:>6} snapshots{'':<12}{seconds:>10.4f}")
    results = {
        "commit_us": commit["castore"],
        "floor_us": commit["floor"],
        "commit_vs_floor": commit["castore"] / commit["floor"],
    }
    if "langgraph" in commit:
        results["langgraph_put_us"] = commit["langgraph"]
        results["commit_vs_langgraph"] = commit["castore"] / commit["langgraph"]
    for length, seconds in resume.items():
        label = {100: "100", 1000: "1k", 10000: "10k"}[length]
        results[f"resume_{label}_s"] = seconds
    for key, value in results.items():
        print(f"{key}={value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
