"""How long a new worker process takes to open a store on S3, against one on a directory.

    python tools/bench_s3_open.py --endpoint URL [--bucket NAME] [--runs 9]

Credentials and region come the boto3 way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION); `--endpoint` is the S3 endpoint (AWS_ENDPOINT_URL_S3). A store with one
task is made on S3 (a new bucket, or `--bucket`) and in a temporary directory; then each run
starts a fresh Python process per store, which imports castore and times, on the wall clock
and in CPU seconds of its own:

  open            castore.Store.open(url): for S3 the client (the AWS SDK's import, its S3
                  model, the client itself) and the two reads every open makes (the marker
                  and the endpoint's record): s3_open_ms, s3_open_cpu_ms, dir_open_ms
  sdk import      of those, the import of the SDK alone (botocore, the one part no caller
                  can skip): s3_sdk_import_ms
  first read      Store.open and the task's status (HEAD read and checked): what a short
                  worker pays before its first answer: s3_first_read_ms, dir_first_read_ms

Each key is the median over the runs; the spread (min, max) is printed above the key=value
lines, which come last. The machine's load shows in the wall-clock keys, far less in the CPU
ones.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import castore

# What each fresh process runs: the times of its own open and first read.
CHILD = r"""
import json, sys, time
url = sys.argv[1]
clock, cpu = time.perf_counter, time.process_time
if url == "sdk":  # the SDK's import alone, in a process of its own
    t = clock()
    import botocore.session, botocore.config, botocore.exceptions
    print(json.dumps({"sdk": clock() - t}))
    sys.exit(0)
import castore
w0, c0 = clock(), cpu()
store = castore.Store.open(url)
w1, c1 = clock(), cpu()
store.status("t")
w2 = clock()
print(json.dumps({"open": w1 - w0, "open_cpu": c1 - c0, "first": w2 - w0}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--endpoint", help="the S3 endpoint URL (else AWS_ENDPOINT_URL_S3)")
    parser.add_argument("--bucket", help="an existing bucket to use (else a new one is made)")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    if args.endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint
    bucket = args.bucket or _new_bucket()
    s3_url = f"s3://{bucket}/open-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="castore-bench-open-") as directory:
        dir_url = str(Path(directory) / "store")
        for url in (s3_url, dir_url):
            store = castore.Store.init(url)
            with store.start("t", castore.Plan.build("p", "a", "b"), lock_timeout=None) as run:
                run.commit_step("a", 1)
        runs: dict[str, list[float]] = {}
        for _ in range(args.runs):
            for name, url in (("s3", s3_url), ("dir", dir_url), ("s3", "sdk")):
                for key, value in _child(url).items():
                    runs.setdefault(f"{name}_{key}", []).append(value * 1000)
    keys = {
        "s3_open_ms": runs["s3_open"],
        "s3_open_cpu_ms": runs["s3_open_cpu"],
        "s3_sdk_import_ms": runs["s3_sdk"],
        "s3_first_read_ms": runs["s3_first"],
        "dir_open_ms": runs["dir_open"],
        "dir_first_read_ms": runs["dir_first"],
    }
    print(f"{'key':<24}{'median':>10}{'min':>10}{'max':>10}")
    for key, values in keys.items():
        print(
            f"{key:<24}{statistics.median(values):>10.1f}{min(values):>10.1f}{max(values):>10.1f}"
        )
    print(f"s3_open_runs={args.runs}")
    for key, values in keys.items():
        print(f"{key}={statistics.median(values):.1f}")
    return 0


def _child(url: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url], capture_output=True, text=True, check=True, cwd=ROOT
    )
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _new_bucket() -> str:
    import boto3

    name = f"castore-bench-open-{secrets.token_hex(4)}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


if __name__ == "__main__":
    sys.exit(main())
