"""Benchmark CastoreSaver against LangGraph's SqliteSaver on one growing conversation.

    python tools/bench_langgraph.py [--steps 200] [--dir PATH] [--flush auto|syncfs]

Both savers, in the same run and on the same filesystem, get the same 200-step thread: at each
step one ~200-character message is added to a `messages` channel that holds the whole
conversation (as LangGraph's MessagesState does), `put` stores the checkpoint, `put_writes`
the step's write, and `get_tuple` reads the latest checkpoint back. Both write durably
(castore fsyncs every commit; SqliteSaver runs in WAL mode with sqlite's default FULL sync).
`--flush syncfs` runs castore with CASTORE_FLUSH=syncfs (FORMAT.md 9.8): a put's objects and
its commit then share their flushes (three in all), where by default each object of a put and
its commit flush their own files and directories (four for a put that stores one tree).

Disk: castore's is the sum of the sizes of every file in its store (`du --apparent-size`;
the bytes, not the filesystem's blocks, which the raw lines also give), SqliteSaver's its
database with its WAL. Logical: the serialized size of the final message list (what the
conversation is, once). get_tuple is timed over the first and the last 20 steps: flat in thread
length means the two are about equal (each still reads the whole conversation, as any saver).

Last lines key=value: lg_put_vs_sqlite= (castore's mean put / SqliteSaver's; target <= 2),
lg_get_tuple_vs_sqlite=, lg_disk_per_logical= (target <= 5), sqlite_disk_per_logical=.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

from castore.langgraph import CastoreSaver

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_contenders import store_in_use

WORDS = "the agent read the page, kept three facts and chose the next tool to call; "


def message(i: int) -> Any:
    text = (f"step {i}: " + WORDS * 3)[:200]
    kind = HumanMessage if i % 2 == 0 else AIMessage
    return kind(content=text, id=f"msg-{i}")


def run_thread(saver: BaseCheckpointSaver[Any], steps: int) -> dict[str, list[float]]:
    """One thread of `steps` steps; seconds per call of each operation."""
    timings: dict[str, list[float]] = {"put": [], "put_writes": [], "get_tuple": []}
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
        started = time.perf_counter()
        config = saver.put(config, checkpoint, metadata, {"messages": version, "step": version})  # type: ignore[arg-type]
        timings["put"].append(time.perf_counter() - started)
        started = time.perf_counter()
        saver.put_writes(config, [("messages", [message(step + 1)])], f"task-{step}")  # type: ignore[arg-type]
        timings["put_writes"].append(time.perf_counter() - started)
        started = time.perf_counter()
        found = saver.get_tuple({"configurable": {"thread_id": "bench", "checkpoint_ns": ""}})
        timings["get_tuple"].append(time.perf_counter() - started)
        if found is None or len(found.checkpoint["channel_values"]["messages"]) != step + 1:
            raise SystemExit(f"{type(saver).__name__} read back a wrong checkpoint at {step}")
    return timings


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


def mean_us(values: list[float]) -> float:
    return sum(values) / len(values) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where to build the stores (a temp dir)")
    parser.add_argument(
        "--flush", choices=("auto", "syncfs"), default="auto", help="castore's CASTORE_FLUSH"
    )
    args = parser.parse_args()
    os.environ["CASTORE_FLUSH"] = args.flush  # read when the saver opens its store
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        store = os.path.join(root, "castore")
        store_in_use(store)
        with CastoreSaver(store) as saver:
            ours = run_thread(saver, args.steps)
            logical = len(saver.serde.dumps_typed([message(i) for i in range(args.steps)])[1])
        db = os.path.join(root, "sqlite.db")
        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            theirs = run_thread(SqliteSaver(conn), args.steps)
        finally:
            conn.close()
        ours_disk = tree_bytes(store)
        sqlite_disk = tree_bytes(root)
        sqlite_disk = (sqlite_disk[0] - ours_disk[0], sqlite_disk[1] - ours_disk[1])
    window = min(20, args.steps // 2)
    for name, timing in (("castore", ours), ("sqlite", theirs)):
        print(
            f"{name}: put_us={mean_us(timing['put']):.0f} "
            f"put_writes_us={mean_us(timing['put_writes']):.0f} "
            f"get_tuple_first{window}_us={mean_us(timing['get_tuple'][:window]):.0f} "
            f"get_tuple_last{window}_us={mean_us(timing['get_tuple'][-window:]):.0f}"
        )
    print(f"logical_bytes={logical} castore_bytes={ours_disk[0]} castore_allocated={ours_disk[1]}")
    print(f"sqlite_bytes={sqlite_disk[0]} sqlite_allocated={sqlite_disk[1]}")
    print(f"flush={args.flush}")
    print(f"lg_put_vs_sqlite={mean_us(ours['put']) / mean_us(theirs['put']):.2f}")
    print(f"lg_get_tuple_vs_sqlite={mean_us(ours['get_tuple']) / mean_us(theirs['get_tuple']):.2f}")
    print(f"lg_disk_per_logical={ours_disk[0] / logical:.2f}")
    print(f"sqlite_disk_per_logical={sqlite_disk[0] / logical:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
