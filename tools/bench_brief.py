"""The resume brief's size and cost by history length (issue 14 item 4).

    python tools/bench_brief.py [--steps 10,1000,100000] [--seal-every 16] [--grow] [--dir DIR]

For each length: a task of that many plain steps (small results; a fixed plan, or with
`--grow` a growing one, each step appended) is written with sealing every
`--seal-every` commits, then its brief is made from the run, from the store (HEAD and the tail
read, what `castore brief` does), from a run resumed afresh, and by the CLI itself (its time
includes starting the interpreter). One line per length, key=value.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import castore
import castore.store
from castore import Plan


def measure(root: str, steps: int, rounds: int, grow: bool) -> dict[str, object]:
    store = castore.Store.init(os.path.join(root, f"store-{steps}-{grow}"))
    steps_named = [f"s{i}" for i in range(steps)]
    plan = Plan.grow("bench") if grow else Plan.build("bench", *steps_named)
    started = time.perf_counter()
    with store.start("bench", plan) as run:
        for i in range(steps - 1):  # the last step left to do: a task being resumed
            result = {"i": i, "note": "x" * 40}
            if grow:
                run.append(f"s{i}", result)
            else:
                run.commit_step(f"s{i}", result)
        write_s = time.perf_counter() - started
        run_ms = best(rounds, run.brief)
        made = run.brief()
    store_ms = best(rounds, lambda: store.brief("bench"))
    with store.resume("bench", plan) as resumed:  # what a restarted agent holds
        resumed_ms = best(rounds, resumed.brief)
        assert made.text == resumed.brief().text, "the resumed run's brief differs"
    assert made.text == store.brief("bench").text, "the run's and the store's briefs differ"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "castore", "--store", str(store.root), "brief", "bench"]
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    cli_ms = (time.perf_counter() - started) * 1000
    assert out == made.text, "the CLI's brief differs"
    return {
        "steps": steps,
        "bytes": len(made.text.encode()),
        "tokens": made.tokens,
        "run_brief_ms": round(run_ms, 2),
        "resumed_brief_ms": round(resumed_ms, 2),
        "store_brief_ms": round(store_ms, 2),
        "cli_ms": round(cli_ms, 1),
        "write_s": round(write_s, 1),
    }


def best(rounds: int, call: object) -> float:
    assert callable(call)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10,1000,100000")
    parser.add_argument("--seal-every", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--grow", action="store_true", help="a growing plan (run.append)")
    shm = "/dev/shm"  # noqa: S108 - the benchmark's own scratch stores, in tmpfs when there is one
    default_dir = shm if os.path.isdir(shm) else None
    parser.add_argument("--dir", default=default_dir, help="where the stores go (default: tmpfs)")
    args = parser.parse_args()
    castore.store.SEAL_EVERY = args.seal_every
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for steps in (int(n) for n in args.steps.split(",")):
            result = measure(root, steps, args.rounds, args.grow)
            result["seal_every"] = args.seal_every
            result["plan"] = "growing" if args.grow else "fixed"
            print(" ".join(f"{key}={value}" for key, value in result.items()), flush=True)


if __name__ == "__main__":
    main()
