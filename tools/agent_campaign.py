"""Agent campaign: SIGKILL the sample agent (a scripted model deciding an unknown number of
actions) at random moments and at named crash points, restart it until it finishes, and judge
from the fake service's ledger and the fake model's bill.

    python tools/agent_campaign.py --runs 300 --seed 1 --mode lookup [--async]

The last line is key=value:
    agent runs= kills= duplicates= rebilled= inflight_repeats= differ= unresolved=
rebilled: model calls made again although their result had been committed (must be 0);
inflight_repeats: calls repeated because the kill came before their result was committed;
differ: runs whose final answer differs from an uninterrupted run of the same seed (must be
0); duplicates: effects applied twice (must be 0); unresolved: effects whose outcome nobody
knew, resolved from the service's ledger (an audited `resolve`, as a person would).
Exit status 0 when duplicates, rebilled, differ, lost receipts and corruption are all 0.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore.lab.agent_campaign import AgentSettings, agent_campaign


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="agent tasks to drive to the end")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=("idempotent", "lookup", "none"), default="lookup")
    parser.add_argument("--async", dest="use_async", action="store_true", help="asyncio agent")
    parser.add_argument(
        "--latency-ms", type=float, default=2.0, help="how long the fake model takes to answer"
    )
    parser.add_argument(
        "--pay-first",
        action="store_true",
        help="a broken agent that asks the model before the journal: shows re-bills caught",
    )
    parser.add_argument("--keep", metavar="DIR", help="keep the stores, bill and ledger in DIR")
    args = parser.parse_args()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="castore-agent-"))
    settings = AgentSettings(
        args.mode,
        args.seed,
        use_async=args.use_async,
        latency_ms=args.latency_ms,
        pay_first=args.pay_first,
    )
    started = time.monotonic()
    try:
        tally = agent_campaign(workdir, args.runs, settings, say=print)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for problem in tally.problems[:20]:
        print(f"problem: {problem}")
    print(f"mode={args.mode} async={args.use_async} seed={args.seed}")
    print(f"elapsed_s={time.monotonic() - started:.1f} {tally.details()}")
    print(tally.line())
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
