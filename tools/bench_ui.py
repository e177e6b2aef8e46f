"""How fast `castore ui`'s tasks page answers on a store of many tasks (issue 41: the first
byte within 1 s on 5,000 tasks, from the same reading `castore status` uses).

Builds a store of N tasks of a four-step payments plan (a third of them at an effect in
flight, no fsync: building is not what is measured), starts `castore ui --port 0` on it, and
times GET / from the request to the first byte of the answer and to its last, ROUNDS times.
Prints one JSON object: the medians and the worst, in seconds, and `castore status` alone.

    .venv/bin/python tools/bench_ui.py [--tasks 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_history import no_fsync

import castore

PLAN = castore.Plan.build("pay", "fetch", "price", castore.effect("charge", "price"), "report")


def build(root: str, tasks: int) -> None:
    store = castore.Store.init(root)
    with no_fsync():
        for number in range(tasks):
            with store.start(f"order-{number:05d}", PLAN) as run:
                run.commit_step("fetch", number)
                if number % 3:
                    run.commit_step("price", number * 100)
                if number % 3 == 2:
                    run.perform("charge", castore.Service("payments"), lambda key: f"ch_{key[-8:]}")
                    run.commit_step("report", "ok")


def get_times(port: int) -> tuple[float, float, int]:
    """(to the first byte, to the last byte, bytes) of GET /."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.perf_counter()
    connection.request("GET", "/")
    answer = connection.getresponse()
    body = answer.read(1)  # the page's first byte, not only the status line and headers
    first = time.perf_counter() - start
    body += answer.read()
    last = time.perf_counter() - start
    connection.close()
    assert answer.status == 200, body[:200]
    return first, last, len(body)


def status_s(root: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "castore", "status", "--store", root],
        check=False,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        root = os.path.join(base, "store")
        build(root, args.tasks)
        server = subprocess.Popen(
            [sys.executable, "-m", "castore", "ui", "--port", "0", "--store", root],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            match = re.search(r":(\d+)/", server.stdout.readline())
            assert match, "castore ui printed no URL"
            port = int(match.group(1))
            times = [get_times(port) for _ in range(args.rounds)]
        finally:
            server.terminate()
            server.wait(timeout=30)
        firsts, lasts = [t[0] for t in times], [t[1] for t in times]
        result = {
            "tasks": args.tasks,
            "first_byte_median_s": round(statistics.median(firsts), 3),
            "first_byte_max_s": round(max(firsts), 3),
            "last_byte_median_s": round(statistics.median(lasts), 3),
            "page_bytes": times[0][2],
            "castore_status_s": round(min(status_s(root) for _ in range(3)), 3),
        }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
