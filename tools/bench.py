"""Benchmark castore's commit path against LangGraph and the disk's own flush, side by side.

    python tools/bench.py [--rounds 9] [--batch 200] [--dir PATH] [--quick] [--compare-flush]
                          [--json PATH]

Every contender runs one batch per round, in an order that rotates round by round, so the
machine's noise hits all alike. A latency key is the median over rounds of each round's p50;
its `_p99_us` is the p99 of all its calls pooled. A ratio is the median over rounds of the
round's ratio (the pair ran seconds apart, so drifting load divides out); below 1 for a
latency, above 1 for a throughput, castore is ahead.

  commit            castore run.commit_step of one plan step, durable before it returns
  langgraph_put     LangGraph SqliteSaver.put (WAL, synchronous=FULL), the `bench` extra
  flush_floor       one flush and nothing else: pwrite 600 B into a preallocated file + fdatasync
  create_floor      a file per commit: create, write 600 B, fsync it, fsync its directory
  perform           one effect, run.perform: SUBMITTED commit, send, CONFIRMED commit; the
                    send is a trivial in-memory ledger (bare_send_us, measured alone), so
                    perform_overhead_us = perform - bare send is what the effect costs
  langgraph_effect  the same effect with LangGraph's same guarantee: put (intent), send, put;
                    perform_vs_langgraph = perform ÷ langgraph_effect (one effect, both
                    commits on both sides); perform_vs_langgraph_put = perform ÷ one put
  agents8           8 threads in one process, each committing to its own task of one Store
  agents8_async     8 coroutines on one event loop through castore.aio.AsyncStore
  agents8proc       8 processes (spawned, each opening the store), each committing to its own
                    task; each starts, opens the store and commits once before a barrier,
                    then all commit for --proc-window seconds (2; --quick 0.5) of steady
                    state; agents8proc_vs_langgraph = agents8proc ÷ LangGraph's best (its
                    _cpu_us_per_commit is each agent's own CPU in the window, the median of
                    the 8: start-up and opening are outside both)
  langgraph8_*      LangGraph under the same 8 agents: one thread doing all 8 agents' puts,
                    8 threads sharing one SqliteSaver, 8 threads with 8 databases;
                    agents8_vs_langgraph = agents8 ÷ the best of the three in this run

fsyncs_per_commit counts every flush (fsync + fdatasync + syncfs; syncfs_per_commit alone) of
a child process under `strace -f -c` over N commits (the difference between 10+N and 10
commits, so start-up cancels), divided by N; syscalls_per_commit is strace's total the same
way (syscalls_nofutex_per_commit without futex, which lock waits make noisy);
agents8_fsyncs_per_commit likewise with 8 threads committing at once (strace slows every
syscall, so a group commit's rounds batch differently than in the timed run). The children
inherit the environment, CASTORE_FLUSH included. flush_mode is the store's flush policy
(castore.medium.flushpolicy: shared or fsync, and its reason), or "fsync" where that module does not
exist. --compare-flush runs the commit and agents8 parts in child processes instead, one
without CASTORE_FLUSH and one with CASTORE_FLUSH=syncfs, group commit's shared rounds
(keys *_syncfsmode), each one more
contender of the rotation (new tasks each round, the first commit untimed), so the two modes
differ in nothing else; perform and the rest stay in this process.
A `_cpu_us` key is the process's CPU time (user + system, all threads; `_sys_us` system
alone) per call, median of rounds: on 2 cores shared with other tenants, 8 agents are bound
by it as much as by their flushes.
Resume: open + verify the chain of a task of 100, 1,000 and 10,000 snapshots (not --quick).
Scratch stores go under --dir, else the temp dir if it is on the cwd's filesystem and not in
memory, else the cwd; they are removed at the end. Each is made as a store in use has it, with
its 256 fan-out directories (bench_contenders.store_in_use): a new store makes each on first
use, one mkdir and one flush more, which a few hundred commits would mostly measure.
The last lines are key=value pairs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_contenders as c

from castore import Store
from castore.medium.mountinfo import mount_of

try:  # the group-commit policy lands with issue 16; before it every flush is an fsync
    flushpolicy: Any = importlib.import_module("castore.medium.flushpolicy")
except ImportError:
    flushpolicy = None

IN_MEMORY = {"tmpfs", "ramfs"}
IN_CHILD_WHEN_COMPARING = ("commit", "agents8", "agents8_async")


def flush_mode(root: str) -> str:
    if flushpolicy is None:
        return "fsync"
    policy = flushpolicy.decide(root)
    return f"{'shared' if policy.shared else 'fsync'}: {policy.reason}"


def fstype(path: str) -> str:
    mount = mount_of(path)
    return mount[0] if mount else "unknown"


def scratch_parent(requested: str | None) -> str:
    """Where the scratch stores go: --dir, else the temp dir if it is on the cwd's filesystem
    (and not in memory, where a flush costs nothing), else the cwd."""
    if requested:
        return requested
    temp, cwd = tempfile.gettempdir(), os.getcwd()
    same = os.stat(temp).st_dev == os.stat(cwd).st_dev
    return temp if same and fstype(temp) not in IN_MEMORY else cwd


class Samples:
    """Per-round statistics and pooled latencies, by contender."""

    def __init__(self) -> None:
        self.rounds: dict[str, list[float]] = {}
        self.pooled: dict[str, list[float]] = {}

    def latencies(self, name: str, values: list[float]) -> None:
        self.rounds.setdefault(name, []).append(statistics.median(values))
        self.pooled.setdefault(name, []).extend(values)

    def rate(self, name: str, value: float) -> None:
        self.rounds.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.rounds[name])

    def p99(self, name: str) -> float:
        return c.percentile(self.pooled[name], 99)

    def ratio(self, top: str, bottom: str) -> float:
        """The median of the rounds' top ÷ bottom: each pair ran seconds apart, so a load that
        drifts over the run divides out."""
        pairs = zip(self.rounds[top], self.rounds[bottom], strict=True)
        return statistics.median(a / b for a, b in pairs)


def child_command(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def child_round(base: str, label: str, batch: int, shared: bool) -> dict[str, Any]:
    """One batch of the commit and agents8 parts in a child process, with CASTORE_FLUSH=syncfs
    or without it (so the two modes differ in nothing else)."""
    env = {key: value for key, value in os.environ.items() if key != "CASTORE_FLUSH"}
    if shared:
        env["CASTORE_FLUSH"] = "syncfs"
    where = os.path.join(base, "child-syncfs" if shared else "child-default")
    command = child_command(
        "--child", "round", "--batch", str(batch), "--dir", where, "--label", label
    )
    out = subprocess.run(command, check=True, env=env, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def one_round(store: Store, label: str, batch: int) -> dict[str, Any]:
    """The commit and agents8 parts once, on a new task each (the child of --compare-flush)."""
    run = store.start(f"commit-{label}", c.fixed_plan("commit", batch + 2))
    committer = c.step_committer(run)
    committer()  # the first commit's lazy imports stay out of the timing
    commit = c.timed(committer, batch)
    run.close()
    rate, latencies = c.castore_agents(store, label, batch)
    rate_async = c.castore_agents_async(store, label, batch)
    return {"commit": commit, "agents8": rate, "agents8_commit": latencies, "async": rate_async}


class Rounds:
    """Every contender, set up once; `part(name)` runs one batch of it into `samples`."""

    def __init__(
        self, base: str, rounds: int, batch: int, compare: bool, proc_window: float = 2.0
    ) -> None:
        self.base, self.batch, self.proc_window = base, batch, proc_window
        self.store = c.store_in_use(os.path.join(base, "store"))
        self.run = self.store.start("bench", c.fixed_plan("bench", rounds * batch + 10))
        self.commit = c.step_committer(self.run)
        self.commit()  # the first commit's lazy imports stay out of the timing
        self.effects = c.Effects(self.store, rounds * batch + 10)
        self.floor = c.FlushFloor(base)
        self.create = c.CreateFloor(base)
        self.samples = Samples()
        self.parts = ["commit", "flush_floor", "create_floor", "perform", "bare_send"]
        self.parts += ["agents8", "agents8_async", "agents8proc"]
        try:
            self.lg = c.LangGraphThread(c.langgraph_saver(os.path.join(base, "lg.sqlite")), "lg")
            lge = c.langgraph_saver(os.path.join(base, "lge.sqlite"))
            self.lg_effect = c.LangGraphThread(lge, "fx")
            self.lg8 = c.LangGraphAgents(base)
            self.parts += ["langgraph_put", "langgraph_effect"]
            self.parts += [f"langgraph8_{config}" for config in c.LangGraphAgents.CONFIGS]
            self.have_langgraph = True
        except ImportError:
            self.have_langgraph = False
            print("langgraph-checkpoint-sqlite missing: pip install -e '.[bench]'", file=sys.stderr)
        if compare:
            # Both modes in child processes alike: they differ in CASTORE_FLUSH only.
            self.parts = [part for part in self.parts if part not in IN_CHILD_WHEN_COMPARING]
            self.parts += ["defaultmode", "syncfsmode"]

    def latencies(self, name: str, call: Callable[[], object]) -> None:
        self.samples.latencies(name, c.timed(call, self.batch))

    def part(self, name: str, label: str) -> None:
        """One batch of contender `name`, and the CPU time it took per commit (all threads of
        this process: a commit's own work, besides its waits)."""
        before = resource.getrusage(resource.RUSAGE_SELF)
        self.one(name, label)
        after = resource.getrusage(resource.RUSAGE_SELF)
        if name == "agents8proc":
            return  # its CPU is each agent's own, measured in the agent (one())
        calls = self.batch * (c.AGENTS if name.startswith(("agents8", "langgraph8_")) else 1)
        user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        self.samples.rate(f"{name}_cpu", (user + system) * 1e6 / calls)
        self.samples.rate(f"{name}_sys", system * 1e6 / calls)

    def one(self, name: str, label: str) -> None:
        if name == "commit":
            self.latencies(name, self.commit)
        elif name == "flush_floor":
            self.latencies(name, self.floor.commit)
        elif name == "create_floor":
            self.latencies(name, self.create.commit)
        elif name == "perform":
            self.latencies(name, self.effects.perform)
        elif name == "bare_send":
            self.latencies(name, self.effects.bare_send)
        elif name == "langgraph_put":
            self.latencies(name, self.lg.put)
        elif name == "langgraph_effect":
            self.latencies(name, lambda: self.lg_effect.effect(self.effects.ledger.send))
        elif name == "agents8":
            rate, latencies = c.castore_agents(self.store, label, self.batch)
            self.samples.rate(name, rate)
            self.samples.latencies("agents8_commit", latencies)
        elif name == "agents8_async":
            self.samples.rate(name, c.castore_agents_async(self.store, label, self.batch))
        elif name == "agents8proc":
            rate, cpu_us = c.castore_agents_processes(self.store.root, label, self.proc_window)
            self.samples.rate(name, rate)
            self.samples.rate(f"{name}_cpu", cpu_us)
        elif name.startswith("langgraph8_"):
            config = name.removeprefix("langgraph8_")
            self.samples.rate(name, self.lg8.commits_per_s(config, self.batch))
        else:
            assert name in {"defaultmode", "syncfsmode"}, name
            shared = name == "syncfsmode"
            result = child_round(self.base, label, self.batch, shared)
            suffix = "_syncfsmode" if shared else ""
            self.samples.latencies(f"commit{suffix}", result["commit"])
            self.samples.rate(f"agents8{suffix}", result["agents8"])
            self.samples.latencies(f"agents8_commit{suffix}", result["agents8_commit"])
            self.samples.rate(f"agents8_async{suffix}", result["async"])

    def all(self, rounds: int) -> Samples:
        """`rounds` rounds, each contender once per round in an order rotated each round."""
        for round_no in range(rounds):
            shift = round_no % len(self.parts)
            for name in self.parts[shift:] + self.parts[:shift]:
                self.part(name, f"r{round_no}")
        self.samples.rate("snapshot_bytes", len(self.run._slots.read(self.run.head.seq)))
        self.run.close()
        self.effects.run.close()
        return self.samples


def flush_counts(base: str, count: int, env: dict[str, str], suffix: str) -> dict[str, float]:
    """fsyncs and syscalls per commit of a lone writer and of 8 threads, under strace."""
    out: dict[str, float] = {}
    for agents, prefix in ((1, ""), (c.AGENTS, "agents8_")):
        where = os.path.join(base, f"strace{suffix}-{agents}")
        os.makedirs(where)

        def child(n: int, where: str = where, agents: int = agents) -> list[str]:
            root = os.path.join(where, f"s{n}")
            return child_command(
                "--child", "commits", "--count", str(n), "--agents", str(agents), "--dir", root
            )

        counts = c.per_commit(child, where, count, env, agents)
        out[f"{prefix}fsyncs_per_commit{suffix}"] = counts["fsyncs"]
        out[f"{prefix}syncfs_per_commit{suffix}"] = counts["syncfs"]
        out[f"{prefix}syscalls_per_commit{suffix}"] = counts["syscalls"]
        out[f"{prefix}syscalls_nofutex_per_commit{suffix}"] = counts["syscalls_nofutex"]
    return out


def bench_resume(base: str, length: int) -> float:
    """Seconds to resume (open, verify HEAD → plan root, pass the gate) a chain of `length`."""
    store = Store.init(os.path.join(base, f"r{length}"))
    plan = c.fixed_plan("resume", length)
    run = store.start("bench", plan)
    commit = c.step_committer(run)
    for _ in range(length - 1):
        commit()
    run.close()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        resumed = store.resume("bench", plan)
        times.append(time.perf_counter() - start)
        assert resumed.head.seq == length - 1
        resumed.close()
    return min(times)


def results(samples: Samples, have_langgraph: bool, compare: bool) -> dict[str, float]:
    m, p99, ratio = samples.median, samples.p99, samples.ratio
    out: dict[str, float] = {"snapshot_bytes": m("snapshot_bytes")}
    for name in ("commit", "langgraph_put", "flush_floor", "create_floor", "perform"):
        if name in samples.rounds:
            out[f"{name}_us"] = m(name)
            out[f"{name}_p99_us"] = p99(name)
    for name in ("commit", "langgraph_put", "flush_floor", "perform", "langgraph_effect"):
        if f"{name}_cpu" in samples.rounds:
            out[f"{name}_cpu_us"] = m(f"{name}_cpu")
            out[f"{name}_sys_us"] = m(f"{name}_sys")
    for name in ("agents8", "agents8_async", "agents8proc", "langgraph8_8threads_8dbs"):
        if f"{name}_cpu" in samples.rounds:
            out[f"{name}_cpu_us_per_commit"] = m(f"{name}_cpu")
    out["bare_send_us"] = m("bare_send")
    out["perform_overhead_us"] = m("perform") - m("bare_send")
    out["commit_vs_flush_floor"] = ratio("commit", "flush_floor")
    out["commit_vs_create_floor"] = ratio("commit", "create_floor")
    out["agents8_commits_per_s"] = m("agents8")
    out["agents8_commit_us"] = m("agents8_commit")
    out["agents8_commit_p99_us"] = p99("agents8_commit")
    out["agents8_async_commits_per_s"] = m("agents8_async")
    if "agents8proc" in samples.rounds:
        out["agents8proc_commits_per_s"] = m("agents8proc")
    if have_langgraph:
        out["commit_vs_langgraph"] = ratio("commit", "langgraph_put")
        out["langgraph_effect_us"] = m("langgraph_effect")
        out["langgraph_effect_p99_us"] = p99("langgraph_effect")
        out["perform_vs_langgraph"] = ratio("perform", "langgraph_effect")
        out["perform_vs_langgraph_put"] = ratio("perform", "langgraph_put")
        for config in c.LangGraphAgents.CONFIGS:
            out[f"langgraph8_{config}_commits_per_s"] = m(f"langgraph8_{config}")
        best = f"langgraph8_{best_langgraph8(samples)}"
        out["langgraph8_best_commits_per_s"] = m(best)
        out["agents8_vs_langgraph"] = ratio("agents8", best)
        out["agents8_async_vs_langgraph"] = ratio("agents8_async", best)
        if "agents8proc" in samples.rounds:
            out["agents8proc_vs_langgraph"] = ratio("agents8proc", best)
    if compare:
        out["commit_us_syncfsmode"] = m("commit_syncfsmode")
        out["commit_p99_us_syncfsmode"] = p99("commit_syncfsmode")
        out["agents8_commits_per_s_syncfsmode"] = m("agents8_syncfsmode")
        out["agents8_commit_p99_us_syncfsmode"] = p99("agents8_commit_syncfsmode")
        out["agents8_async_commits_per_s_syncfsmode"] = m("agents8_async_syncfsmode")
        if have_langgraph:
            out["commit_vs_langgraph_syncfsmode"] = ratio("commit_syncfsmode", "langgraph_put")
            best = f"langgraph8_{best_langgraph8(samples)}"
            out["agents8_vs_langgraph_syncfsmode"] = ratio("agents8_syncfsmode", best)
    return out


def best_langgraph8(samples: Samples) -> str:
    """LangGraph's best configuration for 8 agents in this run (by its median)."""
    return max(c.LangGraphAgents.CONFIGS, key=lambda x: samples.median(f"langgraph8_{x}"))


def child_main(args: argparse.Namespace) -> int:
    if args.child == "commits":
        c.child_commits(args.dir, args.count, args.agents)
        return 0
    store = c.store_in_use(args.dir)
    print(json.dumps(one_round(store, args.label, args.batch)))
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 9; --quick 2)")
    parser.add_argument("--batch", type=int, default=None, help="calls per batch (200; --quick 20)")
    parser.add_argument(
        "--dir", default=None, help="where the scratch stores go (default: see above)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds, no resume")
    parser.add_argument(
        "--compare-flush",
        action="store_true",
        help="also with CASTORE_FLUSH=syncfs (shared rounds)",
    )
    parser.add_argument("--json", default=None, help="also write each round's numbers here")
    parser.add_argument("--strace-commits", type=int, default=None, help="N (200; --quick 20)")
    parser.add_argument(
        "--proc-window", type=float, default=None, help="seconds the agents8proc arm commits (2)"
    )
    parser.add_argument("--child", choices=("commits", "round"), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--agents", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--label", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 9)
    args.batch = args.batch or (20 if quick else 200)
    args.strace_commits = args.strace_commits or (20 if quick else 200)
    args.proc_window = args.proc_window or (0.5 if quick else 2.0)
    return args


def main() -> int:
    args = parse_args()
    if args.child:
        return child_main(args)
    if args.compare_flush and os.environ.get("CASTORE_FLUSH") == "syncfs":
        print("--compare-flush compares with CASTORE_FLUSH=syncfs: unset it first", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="castore-bench-", dir=scratch_parent(args.dir))
    started, load_start = time.monotonic(), os.getloadavg()[0]
    try:
        mode = flush_mode(base)
        contenders = Rounds(base, args.rounds, args.batch, args.compare_flush, args.proc_window)
        have_langgraph = contenders.have_langgraph
        samples = contenders.all(args.rounds)
        out = results(samples, have_langgraph, args.compare_flush)
        out.update(flush_counts(base, args.strace_commits, dict(os.environ), ""))
        if args.compare_flush:
            env = {**os.environ, "CASTORE_FLUSH": "syncfs"}
            out.update(flush_counts(base, args.strace_commits, env, "_syncfsmode"))
        lengths = () if args.quick else (100, 1000, 10000)
        for length in lengths:
            label = {100: "100", 1000: "1k", 10000: "10k"}[length]
            out[f"resume_{label}_s"] = bench_resume(base, length)
        where = fstype(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"{'contender':<34}{'p50 µs':>10}{'p99 µs':>10}"
        f"   (median of {args.rounds} rounds of {args.batch})"
    )
    for name in (
        "commit",
        "langgraph_put",
        "flush_floor",
        "create_floor",
        "perform",
        "langgraph_effect",
        "bare_send",
        "agents8_commit",
    ):
        if name in samples.rounds:
            print(f"  {name:<32}{samples.median(name):>10.1f}{samples.p99(name):>10.1f}")
    print(f"{'8 agents at once':<34}{'commits/s':>10}")
    for name in (
        "agents8",
        "agents8_async",
        *(f"langgraph8_{x}" for x in c.LangGraphAgents.CONFIGS),
    ):
        if name in samples.rounds:
            print(f"  {name:<32}{samples.median(name):>10.0f}")
    print(f"flush_mode={mode}")
    print(f"fstype={where}")
    print(f"castore_flush_env={os.environ.get('CASTORE_FLUSH', '')}")
    if have_langgraph:
        print(f"langgraph8_best_config={best_langgraph8(samples)}")
    out["rounds"] = args.rounds
    out["batch"] = args.batch
    out["strace_commits"] = args.strace_commits
    out["elapsed_s"] = time.monotonic() - started
    # Other tenants of the machine: a run under heavy load is worth repeating.
    out["load1_start"], out["load1_end"] = load_start, os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": samples.rounds, "results": out}))
    for key, value in out.items():
        print(f"{key}={value:.0f}" if abs(value) >= 10_000 else f"{key}={value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
