"""Benchmark castore on an S3 endpoint against the endpoint's own floor, side by side.

    python tools/bench_s3.py --endpoint URL [--bucket NAME] [--rounds 3] [--commits 200]
                             [--agents 16] [--agent-commits 40] [--resume-steps 10000]

Credentials and region come the boto3 way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION, a profile); `--endpoint` is the S3 endpoint (AWS_ENDPOINT_URL_S3). A new
bucket is made (or `--bucket` used) and every store goes under a new prefix of it. Each round
runs every part once, in the same order; a key is the median over rounds, and the spread
(min, max) of each is printed above the key=value lines, which come last.

  put_floor       one PUT If-None-Match: * of a new key, the size of a snapshot (~600 B), on
                  the client castore uses (same pool, same retries): one round trip
  commit          castore run.commit_step of one plain step, acknowledged once durable;
                  s3_commit_vs_put_floor = commit / put_floor (1.0: a commit is one round trip)
  requests        every request castore's client sent during the commits, retries included,
                  divided by the commits: s3_requests_per_commit (a plain step: 1)
  resume          Store.open + store.resume of a sealed task of --resume-steps steps (built
                  once, on the endpoint): s3_resume_10k_ms, s3_resume_requests
  agents          --agents threads of one process, each committing --agent-commits steps to
                  its own task: s3_agents16_commits_per_s
  cost            s3_cost_per_1k_steps_usd: the requests of 1,000 plain steps at AWS S3
                  Standard list prices in us-east-1, every request counted at the PUT price
                  ($0.005 per 1,000, as published in 2024; a GET costs $0.0004): an upper
                  bound, since the sealer's reads (in the request count) are GETs; storage
                  left out (a slot is ~600 B)
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3

import castore
import castore.store
from castore.medium.s3 import S3Medium

PUT_USD = 0.005 / 1000
SNAPSHOT_BYTES = 600


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--endpoint", help="the S3 endpoint URL (else AWS_ENDPOINT_URL_S3)")
    parser.add_argument("--bucket", help="an existing bucket to use (else a new one is made)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=200, help="timed commits per round")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--agent-commits", type=int, default=40)
    parser.add_argument("--resume-steps", type=int, default=10_000)
    args = parser.parse_args()
    if args.endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint
    bucket = args.bucket or f"castore-bench-{secrets.token_hex(4)}"
    if not args.bucket:
        boto3.client("s3").create_bucket(Bucket=bucket)
    base = f"s3://{bucket}/bench-{secrets.token_hex(4)}"
    resume_url = build_sealed_task(f"{base}/resume", args.resume_steps)
    samples: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        where = f"{base}/r{round_}"
        for key, value in one_round(where, resume_url, args).items():
            samples.setdefault(key, []).append(value)
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    print(f"{'part':<34}{'median':>12}{'min':>12}{'max':>12}")
    for key, values in samples.items():
        print(
            f"  {key:<32}{statistics.median(values):>12.4g}{min(values):>12.4g}{max(values):>12.4g}"
        )
    print(f"s3_endpoint={os.environ.get('AWS_ENDPOINT_URL_S3', 'aws')}")
    print(f"s3_rounds={args.rounds}")
    for key, values in samples.items():
        print(f"{key}={statistics.median(values):.4g}")
    return 0


def one_round(where: str, resume_url: str, args: argparse.Namespace) -> dict[str, float]:
    found: dict[str, float] = {}
    store = castore.Store.init(f"{where}/commits")
    medium = store.medium
    assert isinstance(medium, S3Medium)
    # The floor and the commits alternate in chunks of 10, so the endpoint's drifting load
    # falls on both alike.
    floors: list[float] = []
    commit_times: list[float] = []
    plan = castore.Plan.build("bench", *(f"s{i}" for i in range(args.commits + 1)))
    sent = 0
    with store.start(f"bench-{secrets.token_hex(3)}", plan, lock_timeout=None) as run:
        run.commit_step("s0", 0)  # untimed: the first commit warms the connection
        put_floor(medium, 1)
        for chunk in range(0, args.commits, 10):
            floors += put_floor(medium, min(10, args.commits - chunk))
            before = medium.client.requests
            for index in range(chunk + 1, min(chunk + 10, args.commits) + 1):
                started = time.perf_counter()
                run.commit_step(f"s{index}", index)
                commit_times.append(time.perf_counter() - started)
            sent += medium.client.requests - before
    found["s3_put_floor_ms"] = statistics.median(floors) * 1000
    found["s3_commit_ms"] = statistics.median(commit_times) * 1000
    found["s3_commit_vs_put_floor"] = found["s3_commit_ms"] / found["s3_put_floor_ms"]
    requests = sent / len(commit_times)
    found["s3_requests_per_commit"] = requests
    found["s3_cost_per_1k_steps_usd"] = requests * 1000 * PUT_USD
    found["s3_resume_10k_ms"], found["s3_resume_requests"] = resume(resume_url, args.resume_steps)
    found[f"s3_agents{args.agents}_commits_per_s"] = agents(
        castore.Store.init(f"{where}/agents"), args.agents, args.agent_commits
    )
    return found


def put_floor(medium: S3Medium, count: int) -> list[float]:
    """Seconds of each of `count` conditional PUTs of a new snapshot-sized key."""
    body = secrets.token_bytes(SNAPSHOT_BYTES)
    times = []
    for _ in range(count):
        key = medium.s3_key(f"floor/{secrets.token_hex(8)}")
        started = time.perf_counter()
        medium.client.call(key, "put_object", Key=key, Body=body, IfNoneMatch="*")
        times.append(time.perf_counter() - started)
    return times


def build_sealed_task(url: str, steps: int) -> str:
    """A store at `url` with one task of `steps` plain steps, committed there (sealed as a
    run on S3 seals it, every S3Medium.seal_every commits)."""
    store = castore.Store.init(url)
    plan = castore.Plan.build("long", *(f"s{i}" for i in range(steps)))
    started = time.perf_counter()
    with store.start("long", plan, lock_timeout=None) as run:
        for index in range(steps):
            run.commit_step(f"s{index}", index)
    took = time.perf_counter() - started
    print(f"resume task: {steps} steps committed to {url} in {took:.1f} s", flush=True)
    return url


def resume(url: str, steps: int) -> tuple[float, float]:
    """ms of Store.open + resume (a verified chain: the mark, its pack, the slots above it) of
    the long task, closed untouched, and the requests it took."""
    plan = castore.Plan.build("long", *(f"s{i}" for i in range(steps)))
    started = time.perf_counter()
    store = castore.Store.open(url)
    medium = store.medium
    assert isinstance(medium, S3Medium)
    with store.resume("long", plan, lock_timeout=None):
        took = time.perf_counter() - started
    return took * 1000, float(medium.client.requests)


def agents(store: castore.Store, count: int, each: int) -> float:
    """Commits per second of `count` threads, each committing `each` steps to its own task."""
    plan = castore.Plan.build("agent", *(f"s{i}" for i in range(each)))
    barrier = threading.Barrier(count + 1)
    failures: list[BaseException] = []

    def agent(index: int) -> None:
        try:
            with store.start(f"agent-{index}", plan, lock_timeout=None) as run:
                barrier.wait()
                for step in range(each):
                    run.commit_step(f"s{step}", step)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the main thread
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return count * each / (time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main())
