"""castore fsck on S3 against a parallel-GET floor measured in the same run.

    python tools/bench_s3_fsck.py --endpoint URL [--bucket NAME] [--rounds 3]
                                  [--tasks 64] [--steps 16] [--threads 32]

Credentials and region come the boto3 way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION); `--endpoint` is the S3 endpoint (AWS_ENDPOINT_URL_S3). A store of
--tasks tasks of --steps steps, each step's result a blob of ~1 KB, is built once in a
temporary directory and copied key for key to a new prefix (a snapshot has no object key on
S3, so those are left out: FORMAT.md §19.3), with --threads PUTs at once. Each round, in
this order:

  floor       a GET of every key fsck reads (objects/, every chain slot, marks), --threads
              at once on the client castore uses (same pool, same retries), bodies read:
              s3_fsck_get_floor_per_s, keys per second
  fsck        castore's check_store of the store, as `castore fsck` runs it (--threads
              threads on S3): s3_fsck_objects_per_s, objects checked per second, and
              s3_fsck_vs_floor = that / the floor (1.0: fsck reads as fast as raw GETs)
  serial      the same check with one thread (fsck on S3 before it read in parallel):
              s3_fsck_serial_objects_per_s

A key is the median over rounds; the spread (min, max) of each is printed above the key=value
lines, which come last.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3

import castore
from castore.format.digest import hash_bytes
from castore.maintenance.fsck import Summary, check_store
from castore.medium.s3 import S3Medium


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--endpoint", help="the S3 endpoint URL (else AWS_ENDPOINT_URL_S3)")
    parser.add_argument("--bucket", help="an existing bucket to use (else a new one is made)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=32)
    args = parser.parse_args()
    if args.endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint
    s3 = boto3.client("s3")
    bucket = args.bucket or f"castore-bench-fsck-{secrets.token_hex(4)}"
    if not args.bucket:
        s3.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/fsck-{secrets.token_hex(4)}"
    keys = build(url, args.tasks, args.steps, args.threads)
    medium = castore.Store.open(url).medium
    assert isinstance(medium, S3Medium)
    parts: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        floor = get_floor(medium, keys, args.threads)
        objects, took = fsck(url, args.threads)
        serial_objects, serial_took = fsck(url, 1)
        parts.setdefault("s3_fsck_get_floor_per_s", []).append(floor)
        parts.setdefault("s3_fsck_objects_per_s", []).append(objects / took)
        parts.setdefault("s3_fsck_vs_floor", []).append(objects / took / floor)
        parts.setdefault("s3_fsck_serial_objects_per_s", []).append(serial_objects / serial_took)
        print(f"round {round_ + 1}/{args.rounds} done: {objects} objects", flush=True)
    print(f"{'part':<32}{'median':>12}{'min':>12}{'max':>12}")
    for key, values in parts.items():
        print(
            f"{key:<32}{statistics.median(values):>12.4g}{min(values):>12.4g}{max(values):>12.4g}"
        )
    print(f"s3_endpoint={os.environ.get('AWS_ENDPOINT_URL_S3', 'aws')}")
    print(f"s3_fsck_rounds={args.rounds}")
    print(f"s3_fsck_keys={len(keys)}")
    print(f"s3_fsck_threads={args.threads}")
    for key, values in parts.items():
        print(f"{key}={statistics.median(values):.4g}")
    return 0


def build(url: str, tasks: int, steps: int, threads: int) -> list[str]:
    """The store, built in a directory and copied key for key to `url`; the keys fsck reads
    (relative to the prefix)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="castore-bench-fsck-") as directory:
        root = Path(directory) / "store"
        local = castore.Store.init(root)
        plan = castore.Plan.build("fsck", *(f"s{i}" for i in range(steps)))
        for task in range(tasks):
            with local.start(f"t{task}", plan) as run:
                for step in range(steps):
                    run.commit_step(f"s{step}", local.put_blob({"n": step, "pad": "x" * 1000}))
        files = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    snapshots = {hash_bytes(data) for key, data in files.items() if "/chain/" in key}
    copied = {
        key: data
        for key, data in files.items()
        if key != "castore.json"
        and not key.endswith(".lock")
        and not (key.startswith("objects/") and key.rsplit("/", 1)[-1] in snapshots)
    }
    castore.Store.init(url)  # the endpoint's record and the marker, as init writes them
    medium = castore.Store.open(url).medium
    assert isinstance(medium, S3Medium)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda item: medium.replace(item[0], item[1]), copied.items()))
    print(
        f"store: {tasks} tasks x {steps} steps, {len(copied)} keys copied to {url} in "
        f"{time.monotonic() - started:.1f} s",
        flush=True,
    )
    return sorted(copied)


def get_floor(medium: S3Medium, keys: list[str], threads: int) -> float:
    """Keys per second: a GET of each, `threads` at once, on castore's own client."""
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(medium.read, keys))
    return len(keys) / (time.perf_counter() - started)


def fsck(url: str, threads: int) -> tuple[int, float]:
    """(objects checked, seconds) of one check_store; any finding but info is an error."""
    summary = Summary()
    started = time.perf_counter()
    findings = list(check_store(url, jobs=threads, summary=summary))
    took = time.perf_counter() - started
    bad = [f for f in findings if f.severity.value != "info"]
    if bad:
        raise SystemExit(f"fsck found problems in the benchmark's store: {bad[:3]}")
    return summary.objects, took


if __name__ == "__main__":
    sys.exit(main())
