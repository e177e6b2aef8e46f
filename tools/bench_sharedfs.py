"""Commit latency and doctor's verdicts on one of the shared-filesystem engines the suite runs.

    python tools/bench_sharedfs.py ENGINE [--runs 3] [--commits 100]

ENGINE is sshfs, gluster-nocache, gluster-default or cephfs. The engine is started as the test
suite starts it (tests/sshfs.py, tests/glusterfs.py, tests/cephfs.py: two FUSE clients of one
directory on 127.0.0.1, every process stopped by its PID at the end). Then `castore doctor
--peer` runs once across the two clients, and `--runs` runs, one after the other, each make
`--commits` durable commits through client A, the commit of tools/bench.py (one small result
per step, a fresh store per run), each commit timed on its own, after the same commits on the
local disk (the directory of the engine's daemons). Printed: each check's verdict, each run's
p50, and the median of the runs' p50 with their spread (min-max), for both. Only one
GlusterFS may run at a time on a machine (glusterd's port 24007).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench import castore_run  # tools/, beside this file
from cephfs import mount_ceph_pair
from glusterfs import mount_gluster_pair
from sshfs import mount_sshfs_pair
from twomounts import TwoMounts

from castore.doctor import run_doctor

ENGINES: dict[str, Callable[[Path], contextlib.AbstractContextManager[TwoMounts]]] = {
    "sshfs": mount_sshfs_pair,
    "gluster-nocache": lambda workdir: mount_gluster_pair(workdir, caches=False),
    "gluster-default": lambda workdir: mount_gluster_pair(workdir, caches=True),
    "cephfs": mount_ceph_pair,
}


def commit_p50_ms(directory: Path, commits: int) -> float:
    """The median of `commits` durable commits' own times through `directory`, in ms."""
    run = castore_run(str(directory), commits + 1)
    timings = []
    try:
        for _ in range(commits):
            step = run.next_step
            assert step is not None
            started = time.perf_counter()
            run.commit_step(step, {"n": run.head.seq})
            timings.append(time.perf_counter() - started)
    finally:
        run.close()
    return statistics.median(timings) * 1000


def _load() -> str:
    """The 1, 5 and 15 minute load averages: this machine's 2 cores are shared."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--commits", type=int, default=100)
    args = parser.parse_args()
    print(f"load average at start: {_load()}")
    workdir = Path(tempfile.mkdtemp(prefix=f"castore-bench-{args.engine}-"))
    try:
        with ENGINES[args.engine](workdir) as pair:
            _, mount_a, mount_b = pair.new_dir("doctor")
            report = run_doctor(mount_a, mount_b)
            for check in report.checks:
                detail = "" if check.verdict == "ok" else f": {check.detail}"
                print(f"doctor {check.name}: {check.verdict}{detail}")
            print(f"doctor verdict: {'safe' if report.safe else 'NOT SAFE'}")
            p50s, local = [], []
            for number in range(args.runs):
                # The same commits on the local disk first: the load of a shared machine moves
                # both, so the ratio says more than either time.
                local.append(commit_p50_ms(workdir / f"local-{number}", args.commits))
                _, mount_a, _ = pair.new_dir(f"commits-{number}")
                p50s.append(commit_p50_ms(mount_a, args.commits))
                print(
                    f"run {number + 1}: commit p50 {p50s[-1]:.2f} ms ({args.commits} commits); "
                    f"local disk {local[-1]:.2f} ms"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average at the end: {_load()}")
    print(
        f"{args.engine}: commit p50 {statistics.median(p50s):.1f} ms, median of {args.runs} runs "
        f"(spread {min(p50s):.1f}-{max(p50s):.1f} ms); local disk in the same runs "
        f"{statistics.median(local):.1f} ms ({min(local):.1f}-{max(local):.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
