"""Benchmark CastoreSaver against LangGraph's SqliteSaver on one growing conversation.

    python tools/bench_langgraph.py [--steps 200] [--rounds 3] [--dir PATH]
                                    [--flush auto|syncfs]

Both savers, in the same run and on the same filesystem, get the same 200-step thread: at each
step one ~200-character message is added to a `messages` channel that holds the whole
conversation (as LangGraph's MessagesState does), `put` stores the checkpoint, `put_writes`
the step's write, and `get_tuple` reads the latest checkpoint back. Both write durably
(castore fsyncs every commit; SqliteSaver runs in WAL mode with sqlite's default FULL sync).
`--flush syncfs` runs castore with CASTORE_FLUSH=syncfs (FORMAT.md 9.8): a put's objects and
its commit then share their flushes (three in all), where by default each object of a put and
its commit flush their own files and directories (four for a put that stores one tree).

Each round runs both savers on new stores, one after the other, and a create floor (create a
file, write 600 B, fsync it, fsync its directory: what any commit through a new name pays at
least) as many times as castore puts. A ratio key is the median of the rounds' ratios; the
spread (min, max) of each is printed above the keys. Per operation: wall µs (mean), CPU µs
(this process, user + system: the work, apart from waiting for the disk), and for castore the
flushes it asked for (fsync and syncfs calls; SqliteSaver's, made in C, are not counted here:
one fdatasync of its WAL per commit, `strace -f -c` shows).

Disk: castore's is the sum of the sizes of every file in its store (`du --apparent-size`;
the bytes, not the filesystem's blocks, which the raw lines also give), SqliteSaver's its
database with its WAL. Logical: the serialized size of the final message list (what the
conversation is, once). get_tuple is timed over the first and the last 20 steps: flat in thread
length means the two are about equal (each still reads the whole conversation, as any saver).

Last lines key=value: lg_put_vs_sqlite=, lg_put_writes_vs_sqlite=, lg_get_tuple_vs_sqlite=
(castore's mean / SqliteSaver's, wall time; targets <= 1.5, <= 1.5, <= 1.0),
lg_put_vs_create_floor= (castore's put / the create floor), lg_disk_per_logical= (target <= 5),
sqlite_disk_per_logical=, and the per-operation figures of the median round.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

from castore.langgraph import CastoreSaver
from castore.medium import fsio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_contenders import CreateFloor, store_in_use

WORDS = "the agent read the page, kept three facts and chose the next tool to call; "


def message(i: int) -> Any:
    text = (f"step {i}: " + WORDS * 3)[:200]
    kind = HumanMessage if i % 2 == 0 else AIMessage
    return kind(content=text, id=f"msg-{i}")


OPERATIONS = ("put", "put_writes", "get_tuple")


def run_thread(saver: BaseCheckpointSaver[Any], steps: int) -> dict[str, list[float]]:
    """One thread of `steps` steps; seconds per call of each operation, and (key
    `<op>_cpu`) CPU seconds of this process per call, and (`<op>_flushes`) flushes asked."""
    timings: dict[str, list[float]] = {name: [] for name in OPERATIONS}
    timings.update({f"{name}_cpu": [] for name in OPERATIONS})
    timings.update({f"{name}_flushes": [] for name in OPERATIONS})
    config: dict[str, Any] = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    messages: list[Any] = []
    version: str | None = None
    for step in range(steps):
        messages = [*messages, message(step)]
        version = saver.get_next_version(version, None)
        checkpoint = {
            "v": 1,
            "id": str(uuid6(clock_seq=-1)),
            "ts": datetime.now(UTC).isoformat(),
            "channel_values": {"messages": messages, "step": step},
            "channel_versions": {"messages": version, "step": version},
            "versions_seen": {"agent": {"messages": version}},
            "updated_channels": ["messages", "step"],
        }
        metadata = {"source": "loop", "step": step, "parents": {}}
        with timed(timings, "put"):
            config = saver.put(config, checkpoint, metadata, {"messages": version, "step": version})  # type: ignore[arg-type]
        with timed(timings, "put_writes"):
            saver.put_writes(config, [("messages", [message(step + 1)])], f"task-{step}")  # type: ignore[arg-type]
        with timed(timings, "get_tuple"):
            found = saver.get_tuple({"configurable": {"thread_id": "bench", "checkpoint_ns": ""}})
        if found is None or len(found.checkpoint["channel_values"]["messages"]) != step + 1:
            raise SystemExit(f"{type(saver).__name__} read back a wrong checkpoint at {step}")
    return timings


FLUSHES = [0]  # flushes castore asked for (os.fsync and fsio.syncfs calls), counted


def count_flushes() -> None:
    """Count castore's flushes: every os.fsync and fsio.syncfs call of this process."""
    real_fsync, real_syncfs = os.fsync, fsio.syncfs

    def fsync(fd: int) -> None:
        FLUSHES[0] += 1
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        FLUSHES[0] += 1
        real_syncfs(fd)

    os.fsync = fsync
    fsio.syncfs = syncfs


@contextlib.contextmanager
def timed(timings: dict[str, list[float]], name: str) -> Iterator[None]:
    """Wall seconds, CPU seconds and flushes of the block, appended to `timings`."""
    flushes, cpu, started = FLUSHES[0], time.process_time(), time.perf_counter()
    yield
    timings[name].append(time.perf_counter() - started)
    timings[f"{name}_cpu"].append(time.process_time() - cpu)
    timings[f"{name}_flushes"].append(FLUSHES[0] - flushes)


def create_floor(root: str, count: int) -> list[float]:
    """Seconds of each of `count` create floors (tools/bench_contenders.CreateFloor)."""
    floor = CreateFloor(root)
    out = []
    for _ in range(count):
        started = time.perf_counter()
        floor.commit()
        out.append(time.perf_counter() - started)
    return out


def tree_bytes(root: str) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of every file under `root`, each inode once (a
    castore chain slot is a hard link to its snapshot object, as du counts it)."""
    apparent = allocated = 0
    seen: set[tuple[int, int]] = set()
    for directory, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(directory, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def mean(values: list[float]) -> float:
    """Mean of seconds, in µs."""
    return sum(values) / len(values) * 1e6


def one_round(parent: str, steps: int) -> dict[str, Any]:
    """Both savers and the create floor once, each on new files under `parent`."""
    with tempfile.TemporaryDirectory(dir=parent) as root:
        store = os.path.join(root, "castore")
        store_in_use(store)
        with CastoreSaver(store) as saver:
            ours = run_thread(saver, steps)
            logical = len(saver.serde.dumps_typed([message(i) for i in range(steps)])[1])
        db = os.path.join(root, "sqlite.db")
        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            theirs = run_thread(SqliteSaver(conn), steps)
        finally:
            conn.close()
        floor = create_floor(root, steps)
        ours_disk = tree_bytes(store)
        sqlite_disk = tree_bytes(root)  # the database and its WAL: all but castore's store
    return {
        "ours": ours,
        "theirs": theirs,
        "floor": floor,
        "logical": logical,
        "ours_disk": ours_disk,
        "sqlite_disk": (sqlite_disk[0] - ours_disk[0], sqlite_disk[1] - ours_disk[1]),
    }


def ratios(result: dict[str, Any]) -> dict[str, float]:
    ours, theirs = result["ours"], result["theirs"]
    out = {f"lg_{name}_vs_sqlite": mean(ours[name]) / mean(theirs[name]) for name in OPERATIONS}
    out["lg_put_vs_create_floor"] = mean(ours["put"]) / mean(result["floor"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to build the stores (a temp dir)")
    parser.add_argument(
        "--flush", choices=("auto", "syncfs"), default="auto", help="castore's CASTORE_FLUSH"
    )
    args = parser.parse_args()
    os.environ["CASTORE_FLUSH"] = args.flush  # read when the saver opens its store
    count_flushes()
    load_start = os.getloadavg()[0]
    results = [one_round(args.dir or tempfile.gettempdir(), args.steps) for _ in range(args.rounds)]
    per_round = [ratios(result) for result in results]
    keys = list(per_round[0])
    for key in keys:
        values = [r[key] for r in per_round]
        listed = ", ".join(f"{v:.2f}" for v in values)
        print(f"{key}: rounds {listed} (min {min(values):.2f}, max {max(values):.2f})")
    # The per-operation figures of the round whose put ratio is the median.
    middle = sorted(range(len(results)), key=lambda i: per_round[i]["lg_put_vs_sqlite"])
    result = results[middle[len(middle) // 2]]
    window = min(20, args.steps // 2)
    for name, timing in (("castore", result["ours"]), ("sqlite", result["theirs"])):
        print(
            f"{name}: "
            + " ".join(f"{op}_us={mean(timing[op]):.0f}" for op in OPERATIONS)
            + f" get_tuple_first{window}_us={mean(timing['get_tuple'][:window]):.0f}"
            f" get_tuple_last{window}_us={mean(timing['get_tuple'][-window:]):.0f}"
        )
    ours, logical = result["ours"], result["logical"]
    ours_disk, sqlite_disk = result["ours_disk"], result["sqlite_disk"]
    print(f"logical_bytes={logical} castore_bytes={ours_disk[0]} castore_allocated={ours_disk[1]}")
    print(f"sqlite_bytes={sqlite_disk[0]} sqlite_allocated={sqlite_disk[1]}")
    print(f"flush={args.flush}")
    print(f"rounds={args.rounds}")
    print(f"load1_start={load_start:.2f}")
    print(f"load1_end={os.getloadavg()[0]:.2f}")
    print(f"create_floor_us={mean(result['floor']):.0f}")
    for side, timing in (("castore", ours), ("sqlite", result["theirs"])):
        for op in OPERATIONS:
            print(f"{side}_{op}_us={mean(timing[op]):.0f}")
            print(f"{side}_{op}_cpu_us={mean(timing[op + '_cpu']):.0f}")
    for op in OPERATIONS:
        print(f"castore_{op}_flushes={sum(ours[op + '_flushes']) / len(ours[op + '_flushes']):.2f}")
    for key in keys:
        print(f"{key}={statistics.median(r[key] for r in per_round):.2f}")
    print(f"lg_disk_per_logical={ours_disk[0] / logical:.2f}")
    print(f"sqlite_disk_per_logical={sqlite_disk[0] / logical:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
