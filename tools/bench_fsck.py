"""Benchmark `castore fsck` against the floor of reading and hashing every object file.

    python tools/bench_fsck.py [--dir PATH] [--tasks 200] [--steps 100] [--blob-every 10]
                               [--rounds 3] [--jobs N] [--profile [N]] [--breakdown]

Builds a store (or reuses the one at --dir) of about tasks * (steps + 1) snapshots plus a
blob every --blob-every steps: 200 * 100 gives ≈ 22,000 objects. Then, interleaved round by
round so that machine noise hits both alike, best of --rounds:
  floor  one thread: list the fan-out directories, open, read (os.open/os.read, unbuffered)
         and blake3 every object file (castore.format.digest.hash_bytes), nothing else;
  fsck   castore.maintenance.fsck.check_store with every finding consumed (--jobs processes,
         this one included; default: the CPU count), and once more with jobs=1 for reference.
The last lines are key=value pairs; fsck_vs_floor is fsck's objects/s over the floor's, each
the best of its rounds (the target is ≥ 0.8); the per-round median and range of the same
ratio show how far machine noise moved it. --profile runs check_store(jobs=1) under cProfile
and prints the top costs; --breakdown times loops over every chain slot that each do a little
more of the task pass's work, and prints what each piece adds per slot, and what the calling
process adds per object (listing objects/, matching slots to object files).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore import Plan, Store
from castore.format.codec import intact_body
from castore.format.digest import hash_bytes
from castore.format.fastdecode import canonical_view
from castore.format.layout import CHAIN_DIR, MARKER_NAME, OBJECTS_DIR, TASKS_DIR, decode_task_id
from castore.format.records import Snapshot
from castore.maintenance.fsck import Summary, check_store
from castore.maintenance.fsck.coverage import Coverage
from castore.maintenance.fsck.named import NamedObjects
from castore.maintenance.fsck.tree import walk_objects
from castore.maintenance.fsck.workers import TaskContext, check_tasks
from castore.medium.fsread import open_directory, read_in
from castore.medium.posix import PosixMedium

T = TypeVar("T")


def build_tasks(root: str, first: int, count: int, steps: int, blob_every: int) -> None:
    """Tasks first..first+count-1, each finished: `steps` plain steps, some with blobs."""
    store = Store.open(root)
    plan = Plan.build("bench", *[f"s{i}" for i in range(steps)])
    for number in range(first, first + count):
        with store.start(f"task-{number:05d}", plan) as run:
            for i in range(steps):
                if blob_every and i % blob_every == blob_every - 1:
                    result: object = store.put_blob({"task": number, "step": i, "rows": [i] * 32})
                else:
                    result = {"task": number, "step": i, "value": i * 7}
                run.commit_step(f"s{i}", result)


def build_store(root: str, tasks: int, steps: int, blob_every: int) -> None:
    """A store built with the library, tasks written by a few processes at once."""
    Store.init(root)
    workers = max(1, min(8, (os.cpu_count() or 1) * 2))
    share = -(-tasks // workers)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(build_tasks, root, first, min(share, tasks - first), steps, blob_every)
            for first in range(0, tasks, share)
        ]
        for future in futures:
            future.result()


def floor_pass(root: str) -> int:
    """Open, read and hash every object file, in one thread; returns how many."""
    count = 0
    objects = os.path.join(root, OBJECTS_DIR)
    for fanout in sorted(os.listdir(objects)):
        directory = os.path.join(objects, fanout)
        for name in sorted(os.listdir(directory)):
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
            finally:
                os.close(fd)
            hash_bytes(b"".join(chunks))
            count += 1
    return count


def fsck_pass(root: str, jobs: int | None) -> tuple[int, int]:
    """check_store with every finding consumed; returns (objects checked, findings)."""
    summary = Summary()
    findings = sum(1 for _ in check_store(root, jobs=jobs, summary=summary))
    return summary.objects, findings


def timed(function: Callable[..., T], *args: Any) -> tuple[float, T]:
    started = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - started, value


def breakdown(root: str, rounds: int) -> dict[str, float]:
    """Seconds (best of `rounds`) of loops over every chain slot that each do a little more
    of fsck's work: the system calls alone, then the hash, then framing, decoding and
    re-encoding, and last the whole task pass (chain checks, blobs, bookkeeping)."""
    tasks_dir = os.path.join(root, TASKS_DIR)
    names = sorted(os.listdir(tasks_dir))
    view = canonical_view(Snapshot)

    def slots(level: int) -> None:
        for name in names:
            chain = os.path.join(tasks_dir, name, CHAIN_DIR)
            directory = open_directory(chain)
            try:
                for slot in os.listdir(chain):
                    data, _ = read_in(directory, slot)
                    if level >= 1:
                        hash_bytes(data)
                    if level >= 2:
                        body = intact_body(data, "snapshot")
                        if body is None or view(body) is None:
                            raise SystemExit(f"{chain}/{slot}: damaged; break down a clean store")
            finally:
                os.close(directory)

    medium = PosixMedium(root)
    context = TaskContext(medium, int(time.time() * 1000), 3_600_000)
    named = [(name, decode_task_id(name)) for name in names]
    results = list(check_tasks(context, named, NamedObjects(medium)))

    def main_process() -> None:  # what the caller adds: list objects/, match slots to files
        coverage = Coverage(walk_objects(medium))
        for result in results:
            list(coverage.add_task(result))

    steps: dict[str, Callable[[], object]] = {
        "syscalls": lambda: slots(0),
        "hash": lambda: slots(1),
        "decode": lambda: slots(2),
        "task_pass": lambda: list(check_tasks(context, named, NamedObjects(medium))),
        "main_process": main_process,
    }
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(rounds):
        for key, step in steps.items():
            best[key] = min(best[key], timed(step)[0])
    return best


def profile(root: str, top: int) -> None:
    """cProfile of check_store(jobs=1): where fsck spends its time, by own and total time."""
    profiler = cProfile.Profile()
    profiler.enable()
    fsck_pass(root, 1)
    profiler.disable()
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(top)
        text = out.getvalue()
        print(f"--- profile of check_store(jobs=1), by {order} ---")
        print(text[text.index("   ncalls") :].rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="store to reuse (built there if absent); default: a temp dir")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--blob-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None, help="fsck workers (default: CPUs)")
    parser.add_argument("--profile", type=int, nargs="?", const=25, default=0, metavar="N")
    parser.add_argument(
        "--breakdown", action="store_true", help="also time the task pass piece by piece"
    )
    args = parser.parse_args()

    scratch = None
    if args.dir:
        root = os.path.abspath(args.dir)
    else:
        scratch = tempfile.mkdtemp(prefix="castore-bench-fsck-")
        root = os.path.join(scratch, "store")
    try:
        if not os.path.exists(os.path.join(root, MARKER_NAME)):
            started = time.perf_counter()
            build_store(root, args.tasks, args.steps, args.blob_every)
            print(f"built {root} in {time.perf_counter() - started:.1f}s")
        else:
            print(f"reusing {root}")
        return run(root, args)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def run(root: str, args: argparse.Namespace) -> int:
    jobs = args.jobs or os.cpu_count() or 1
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cpus={os.cpu_count()} fsck_jobs={jobs} load_average_before={load}")
    floor_pass(root)  # warm the page cache once, so every round reads from memory
    rows: list[tuple[float, float, float]] = []
    objects = findings = 0
    for _ in range(args.rounds):
        floor_s, counted = timed(floor_pass, root)
        fsck_s, (objects, findings) = timed(fsck_pass, root, jobs)
        serial_s, _ = timed(fsck_pass, root, 1)
        assert counted == objects, f"floor saw {counted} files, fsck {objects} objects"
        rows.append((floor_s, fsck_s, serial_s))
    print(f"{'round':>5}  {'floor s':>8}  {'fsck s':>8}  {'fsck j=1 s':>10}")
    for number, (floor_s, fsck_s, serial_s) in enumerate(rows, 1):
        print(f"{number:>5}  {floor_s:8.3f}  {fsck_s:8.3f}  {serial_s:10.3f}")
    floor_best = min(r[0] for r in rows)
    fsck_best = min(r[1] for r in rows)
    serial_best = min(r[2] for r in rows)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"findings={findings} (a clean store has none) load_average_after={load}")
    if args.profile:
        profile(root, args.profile)
    if args.breakdown:
        slots = sum(
            len(os.listdir(os.path.join(root, TASKS_DIR, t, CHAIN_DIR)))
            for t in os.listdir(os.path.join(root, TASKS_DIR))
        )
        pieces = breakdown(root, args.rounds)
        previous = 0.0
        for key in ("syscalls", "hash", "decode", "task_pass"):
            print(f"breakdown_{key}_us_per_slot={(pieces[key] - previous) / slots * 1e6:.1f}")
            previous = pieces[key]
        print(f"breakdown_slots={slots}")
        per_object = pieces["main_process"] / objects * 1e6
        print(f"breakdown_main_process_us_per_object={per_object:.1f}")
    print(f"fsck_jobs1_objects_per_s={objects / serial_best:.0f}")
    print(f"objects={objects}")
    print(f"floor_objects_per_s={objects / floor_best:.0f}")
    print(f"fsck_objects_per_s={objects / fsck_best:.0f}")
    print(f"fsck_vs_floor={floor_best / fsck_best:.2f}")
    # Each round's own ratio (floor and fsck run back to back), for how much noise moved it:
    ratios = sorted(floor_s / fsck_s for floor_s, fsck_s, _ in rows)
    print(f"fsck_vs_floor_per_round_median={statistics.median(ratios):.2f}")
    print(f"fsck_vs_floor_per_round_range={ratios[0]:.2f}..{ratios[-1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
