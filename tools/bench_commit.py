"""The CPU of one commit, phase by phase, on a filesystem in memory.

    python tools/bench_commit.py [--rounds 7] [--batch 2000] [--dir /dev/shm]

On tmpfs a flush costs next to nothing, so what a commit costs is castore's own work: the
Python that builds, checks, encodes and hashes a snapshot, and the system calls of its files.
Each round commits `batch` plan steps through run.commit_step (a small result, as
tools/bench.py's commit) and reads the process's CPU time around them: the commits' own, and
the sealer's (a background thread packs every 4,096 snapshots: a round of that many holds one
seal). Then it times each phase alone in this thread, `batch` times, on the same inputs:

  record   the Snapshot record a commit builds (attrs, the effects sorted)
  guard    the secret guard over the transition and the effect records (as plain values)
  codec    the record to plain values, their canonical bytes, the frame around them
  encode   settings.encode_snapshot: guard + codec + the size budget (what a commit calls)
  hash     blake3 of the snapshot's bytes (its id)
  files    the medium's claim of a new slot for new bytes (temp file, object, link) and the
           flush of the chain directory: its Python and its system calls
  rest     commit minus record, encode, hash and files: the run's own bookkeeping (the
           frontier, outcomes, replay cursor), the checks after the claim (the sealed
           mark, the object's name still there) and the sealer's share

Keys are µs of CPU (user + system; `_user_us` user alone) per call, the median of rounds,
each with its spread (`_min`, `_max`) over rounds. commit_us is the whole process's CPU per
commit; commit_thread_us the committing thread's alone, sealer_us the difference (the
background thread's packing and pruning, per commit). python_us_per_commit is the commit's user
CPU: the target of issue 26 is 60. The last lines are key=value pairs.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore.chain.seal import SEAL_EVERY
from castore.format import codec, guard
from castore.format.digest import hash_bytes
from castore.format.layout import object_key
from castore.format.records import Snapshot, snapshot_version
from castore.medium.posix import PosixMedium
from castore.run.settings import encode_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_contenders as c

PHASES = ("commit", "record", "guard", "codec", "encode", "hash", "files")


def cpu(call: Callable[[], object], batch: int, whole: bool = False) -> tuple[float, ...]:
    """(user + system, user) µs of CPU per call of `call`: this thread's, or with `whole` the
    process's (the sealer's thread included), then this thread's alone. The totals from CPU
    clocks (exact), the user share from getrusage (counted in scheduler ticks: only a long
    batch splits it well)."""
    who = resource.RUSAGE_SELF if whole else resource.RUSAGE_THREAD
    clock = time.process_time_ns if whole else time.thread_time_ns
    before, started, alone = resource.getrusage(who), clock(), time.thread_time_ns()
    for _ in range(batch):
        call()
    spent, after = clock() - started, resource.getrusage(who)
    alone = time.thread_time_ns() - alone
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    share = user / (user + system) if user + system > 0 else 1.0
    return spent / 1000 / batch, share * spent / 1000 / batch, alone / 1000 / batch


class Phases:
    """A task whose steps are committed, and each phase of a commit on that task's inputs."""

    def __init__(self, base: str, rounds: int, batch: int) -> None:
        self.store = c.store_in_use(os.path.join(base, "store"))
        self.run = self.store.start("bench", c.fixed_plan("bench", (rounds + 1) * batch + 10))
        self.commit = c.step_committer(self.run)
        for _ in range(batch):  # lazy imports, caches, the first flush of the directory
            self.commit()
        self.medium = PosixMedium(os.path.join(base, "scratch"))
        for fanout in range(256):
            os.makedirs(os.path.join(base, "scratch", "objects", f"{fanout:02x}"))
        os.makedirs(os.path.join(base, "scratch", "slots"))
        self.claimed = 0

    def record(self) -> Snapshot:
        head = self.run.head
        return Snapshot(
            task=head.task,
            seq=head.seq + 1,
            parent=self.run.head_id,
            plan=head.plan,
            frontier=head.frontier,
            effects=tuple(sorted(head.effects, key=lambda r: r.step)),
            transition=head.transition,
            env=head.env,
            time_ms=head.time_ms,
            writer=head.writer,
            sealed=head.sealed,
            grown=head.grown,
        )

    def guard(self) -> None:
        built = self._built
        guard.refuse_secrets(built["transition"], (), "$.transition")
        guard.refuse_secrets(built["effects"], (), "$.effects")

    def codec(self) -> bytes:
        head = self.run.head
        body = codec.encode_value(codec.to_builtins(head))
        return codec.frame("snapshot", body, snapshot_version(head))

    def encode(self) -> bytes:
        return encode_snapshot(self.run.head, self.run._settings)

    def hash(self) -> str:
        return hash_bytes(self._data)

    def files(self) -> None:
        """A new object and slot each call (distinct bytes: a new object id), as a commit's."""
        self.claimed += 1
        data = self._data + b"%d" % self.claimed
        name = object_key(hash_bytes(data))
        self.medium.claim(f"slots/{self.claimed:016d}", data, alias_of=name, alias_durable=False)
        self.medium.flush_dir("slots")

    def round(self, batch: int) -> dict[str, tuple[float, ...]]:
        self._data = self.encode()
        self._built = codec.to_builtins(self.run.head)
        measured = {"commit": cpu(self.commit, batch, whole=True)}
        for name in PHASES[1:]:
            measured[name] = cpu(getattr(self, name), batch)
        # The hash is the phase-alone timing of a call the files phase repeats: take it out.
        total, user, _ = measured["files"]
        measured["files"] = (total - measured["hash"][0], user - measured["hash"][1])
        return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=SEAL_EVERY)
    memory = "/dev/shm"  # noqa: S108 - a scratch directory of its own is made inside
    parser.add_argument("--dir", default=memory if os.path.isdir(memory) else None)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="castore-bench-commit-", dir=args.dir)
    load_start = os.getloadavg()[0]
    try:
        phases = Phases(base, args.rounds, args.batch)
        rounds = [phases.round(args.batch) for _ in range(args.rounds)]
        phases.run.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out: dict[str, float] = {}

    def put(key: str, values: list[float]) -> None:
        out[key] = statistics.median(values)
        out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)

    for name in PHASES:
        put(f"{name}_us", [r[name][0] for r in rounds])
        put(f"{name}_user_us", [r[name][1] for r in rounds])
    parts = ("record", "encode", "hash", "files")
    put("rest_us", [r["commit"][0] - sum(r[p][0] for p in parts) for r in rounds])
    put("commit_thread_us", [r["commit"][2] for r in rounds])
    put("sealer_us", [r["commit"][0] - r["commit"][2] for r in rounds])
    put("python_us_per_commit", [r["commit"][1] for r in rounds])
    out["rounds"], out["batch"] = args.rounds, args.batch
    out["load1_start"], out["load1_end"] = load_start, os.getloadavg()[0]
    for key, value in out.items():
        print(f"{key}={value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
