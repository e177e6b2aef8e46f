"""Crash campaign: SIGKILL the sample worker at random moments and named points until each task
completes, then judge the fake service's ledger and the store.

    python tools/crash_campaign.py --runs 50 --seed 1 --mode lookup

The last lines are key=value: runs, kills, duplicates, lost, unresolved_reported, corrupt.
Exit status 0 when no duplicate, no lost receipt, no corruption and no result mismatch.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore.lab.campaign import Settings, campaign


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="tasks to drive to completion")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=("idempotent", "lookup", "none"), default="lookup")
    parser.add_argument(
        "--kill-window-ms",
        type=float,
        default=30.0,
        help="random kills land uniformly in this window after the worker is ready",
    )
    parser.add_argument(
        "--blind-resubmit",
        action="store_true",
        help="misdeclare services as deduplicating: shows the campaign catching duplicates",
    )
    parser.add_argument("--keep", metavar="DIR", help="keep the store and ledger in DIR")
    args = parser.parse_args()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="castore-campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        args.mode, args.seed, blind=args.blind_resubmit, kill_window_ms=args.kill_window_ms
    )
    started = time.monotonic()
    try:
        tally = campaign(workdir, args.runs, settings, say=print)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for problem in tally.problems[:20]:
        print(f"problem: {problem}")
    print(f"mode={args.mode}")
    print(f"seed={args.seed}")
    print(f"elapsed_s={time.monotonic() - started:.1f}")
    for line in tally.lines():
        print(line)
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
