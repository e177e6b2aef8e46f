"""S3 campaign: the crash lab's workers and agents, SIGKILLed at random moments and at named
crash points, restarted until they finish, all committing to one S3 endpoint; judged by the
lab service's own ledger (and, for agents, the fake model's bill).

    python tools/s3_campaign.py --endpoint URL --runs N --seed S [--bucket NAME] [--keep DIR]

Credentials and region come the boto3 way (AWS_ACCESS_KEY_ID, ...); the children inherit
them, and `--endpoint` as AWS_ENDPOINT_URL_S3. For each service mode (idempotent, lookup,
none) three arms run N tasks each, every arm on a fresh prefix of one bucket: the fixed-plan
worker (castore.lab.worker), the sync agent and the asyncio agent (castore.lab.agent).

The last line is key=value:
    s3 runs= kills= duplicates= lost= corrupt= unresolved=
duplicates: effects the service's ledger shows applied twice; lost: acknowledged commits
missing after a restart (workers), receipts the chain lost, committed model calls made again
(agents' `rebilled`) and agents whose answer differs from an uninterrupted run's; corrupt:
chains that do not verify or resumes refused; unresolved: effects whose outcome nobody knew
(resolved from the ledger, as a person would). Exit status 0 when duplicates, lost and
corrupt are all 0.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3

from castore.lab.agent_campaign import AgentSettings, agent_campaign
from castore.lab.campaign import Settings, campaign

MODES = ("idempotent", "lookup", "none")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--endpoint", help="the S3 endpoint URL (else AWS_ENDPOINT_URL_S3)")
    parser.add_argument("--bucket", help="an existing bucket (else a new one is made)")
    parser.add_argument("--runs", type=int, default=5, help="tasks per arm (9 arms)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", metavar="DIR", help="keep ledgers and bills in DIR")
    args = parser.parse_args()
    if args.endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint
    bucket = args.bucket or f"castore-campaign-{secrets.token_hex(4)}"
    if not args.bucket:
        boto3.client("s3").create_bucket(Bucket=bucket)
    base = f"s3://{bucket}/campaign-{args.seed}-{secrets.token_hex(3)}"
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="castore-s3-"))
    total = {"runs": 0, "kills": 0, "duplicates": 0, "lost": 0, "corrupt": 0, "unresolved": 0}
    started = time.monotonic()
    for mode in MODES:
        url = f"{base}/workers-{mode}"
        (workdir / f"workers-{mode}").mkdir(parents=True, exist_ok=True)
        tally = campaign(
            workdir / f"workers-{mode}",
            args.runs,
            Settings(mode, seed=args.seed),
            store_paths=[url],  # type: ignore[list-item]  # a URL where a path may go
        )
        add(
            total,
            tally.runs,
            tally.kills,
            tally.duplicates,
            tally.lost + tally.mismatched,
            tally.corrupt,
            tally.unresolved_reported,
        )
        say(f"workers-{mode}", " ".join(tally.lines()), tally.problems, started)
        for use_async in (False, True):
            arm = f"agents{'-async' if use_async else ''}-{mode}"
            settings = AgentSettings(mode, args.seed, use_async=use_async, store=f"{base}/{arm}")
            agents = agent_campaign(workdir / arm, args.runs, settings)
            add(
                total,
                agents.runs,
                agents.kills,
                agents.duplicates,
                agents.lost + agents.rebilled + agents.differ,
                agents.corrupt,
                agents.unresolved,
            )
            say(arm, agents.line(), agents.problems, started)
    print(f"s3_endpoint={os.environ.get('AWS_ENDPOINT_URL_S3', 'aws')} store={base}")
    print("s3 " + " ".join(f"{key}={value}" for key, value in total.items()))
    return 0 if not (total["duplicates"] or total["lost"] or total["corrupt"]) else 1


def add(total: dict[str, int], *counts: int) -> None:
    for key, count in zip(total, counts, strict=True):
        total[key] += count


def say(arm: str, line: str, problems: list[str], started: float) -> None:
    print(f"{arm}: {line} ({time.monotonic() - started:.0f} s)", flush=True)
    for problem in problems:
        print(f"  problem: {problem}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
