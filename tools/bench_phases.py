"""Where a commit's time goes: castore's commit and CastoreSaver's put and put_writes, by phase.

    python tools/bench_phases.py [--commits 500] [--steps 200] [--dir PATH]

Runs the commit path (run.commit_step of one plain step, as tools/bench.py's `commit`) and one
LangGraph thread (tools/bench_langgraph.py's: a growing conversation, put, put_writes,
get_tuple) with timers around castore's own functions. Each timer counts its own time only
(what the functions it calls count is taken out), so the phases of one operation add up to
its wall time; `other` is what no timer covers (Python glue, the checks of FORMAT.md §9.3).

  encode      building a snapshot's bytes: records to canonical JSON, the secret guard
  serialize   LangGraph's serializer and castore's packing of values (a put's channel values,
              the header of each event), the messages hashed and compressed
  tree        a saver event's tree made: its parts named, looked for, made young (touch)
  temp        a temp file created and written (FORMAT.md §9.2 step 2-3), its fsync apart
  fsync_file  the fsync of a temp file (F1: a snapshot's, an object's)
  link        link(): an object's name, a chain slot (the commit point)
  fsync_dir   the fsync of a directory (an object's name, the chain's slot: F2)
  look        after the link, each object the commit relies on looked for (§9.3 step 5)
  index       the saver reading back what it committed into its index

Timers make everything a little slower (two clock reads per call); the phases are for
finding what to work on, the benchmarks for how fast it is. The last lines are key=value:
`commit_phase_<name>_us`, `lg_put_phase_<name>_us`, `lg_put_writes_phase_<name>_us` (mean
per operation) and each operation's `_total_us`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_contenders as c
import bench_langgraph as lg

import castore.chain.objects
import castore.run.core
from castore.langgraph import CastoreSaver, parts, state
from castore.medium import fsio

PHASES = (
    "encode",
    "serialize",
    "tree",
    "temp",
    "fsync_file",
    "link",
    "fsync_dir",
    "look",
    "index",
    "other",
)


class Timers:
    """Exclusive time per phase: a timed call's time, less its timed callees'. Only the
    thread that runs the operations counts (the sealer's thread works beside them)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []  # time the callees of each open call took
        self._thread = threading.get_ident()

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        real = getattr(owner, name)

        @functools.wraps(real)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread:
                return real(*args, **kwargs)
            self._stack.append(0.0)
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                inner = self._stack.pop()
                self.spent[phase] += elapsed - inner
                if self._stack:
                    self._stack[-1] += elapsed

        setattr(owner, name, timed)

    @contextmanager
    def operation(self, totals: dict[str, list[dict[str, float]]], name: str) -> Iterator[None]:
        """Time one operation: its phases, and `other` for the rest of its wall time."""
        self.spent.clear()
        started = time.perf_counter()
        yield
        elapsed = time.perf_counter() - started
        phases = dict(self.spent)
        phases["other"] = elapsed - sum(phases.values())
        phases["total"] = elapsed
        totals[name].append(phases)


def install(timers: Timers) -> None:
    timers.wrap(castore.run.core, "encode_snapshot", "encode")
    timers.wrap(fsio, "write_temp", "temp")
    timers.wrap(fsio, "fsync_file", "fsync_file")
    timers.wrap(fsio, "fsync_dir", "fsync_dir")
    timers.wrap(fsio, "link_new", "link")
    timers.wrap(castore.run.core, "parts_reached", "look")
    timers.wrap(castore.chain.objects.ObjectStore, "hold", "look")
    timers.wrap(parts.Parts, "list_refs", "serialize")
    timers.wrap(parts.Parts, "encode", "serialize")
    timers.wrap(parts.Parts, "element", "serialize")
    timers.wrap(state.ThreadState, "make_tree", "tree")
    timers.wrap(state.ThreadState, "_apply", "index")


def commits(timers: Timers, root: str, count: int) -> dict[str, list[dict[str, float]]]:
    store = c.store_in_use(os.path.join(root, "commit"))
    totals: dict[str, list[dict[str, float]]] = defaultdict(list)
    with store.start("phases", c.fixed_plan("phases", count + 1)) as run:
        commit = c.step_committer(run)
        commit()  # the first commit's lazy imports stay out
        for _ in range(count):
            with timers.operation(totals, "commit"):
                commit()
    return totals


def thread(timers: Timers, root: str, steps: int) -> dict[str, list[dict[str, float]]]:
    """One bench_langgraph thread, its put and put_writes timed by phase."""
    store = os.path.join(root, "saver")
    c.store_in_use(store)
    totals: dict[str, list[dict[str, float]]] = defaultdict(list)
    with CastoreSaver(store) as saver:
        for name in ("put", "put_writes"):
            real: Callable[..., Any] = getattr(saver, name)

            def timed(*args: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
                with timers.operation(totals, _name):
                    return _real(*args)

            setattr(saver, name, timed)
        lg.run_thread(saver, steps)
    return totals


def mean_us(rows: list[dict[str, float]], phase: str) -> float:
    return sum(row.get(phase, 0.0) for row in rows) / len(rows) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where the scratch stores go (a temp dir)")
    args = parser.parse_args()
    timers = Timers()
    install(timers)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        results = {
            **commits(timers, root, args.commits),
            **{f"lg_{k}": v for k, v in thread(timers, root, args.steps).items()},
        }
    print(f"load1_start={load_start:.2f}")
    print(f"load1_end={os.getloadavg()[0]:.2f}")
    for operation in ("commit", "lg_put", "lg_put_writes"):
        rows = results[operation]
        for phase in PHASES:
            print(f"{operation}_phase_{phase}_us={mean_us(rows, phase):.0f}")
        print(f"{operation}_total_us={mean_us(rows, 'total'):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
