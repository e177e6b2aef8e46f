"""LangGraph crash campaign: a tool-calling agent (fake chat model) pays through the crash lab's
fake service and is SIGKILLed at random moments and right after the service committed; two
arms per run: SqliteSaver with a plain tool (the baseline) and castore's durable tool.

    python tools/langgraph_campaign.py --runs 100 --seed 1

The last line is key=value:
`langgraph runs= kills= duplicates= baseline_duplicates= unresolved= lost=` (duplicates, lost
and unresolved are castore's arm). Exit status 0 when castore's arm has no duplicate and
nothing lost.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from castore.langgraph.campaign import Settings, campaign


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="threads per arm")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--kill-window-ms",
        type=float,
        default=Settings(0).kill_window_ms,
        help="random kills land uniformly in this window after the agent is ready",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="castore-lg-campaign-"))
    started = time.monotonic()
    try:
        settings = Settings(args.seed, args.kill_window_ms)
        tally = campaign(workdir, args.runs, settings, say=lambda line: print(line, flush=True))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for problem in tally.problems:
        print(f"problem: {problem}")
    for note in tally.notes:
        print(f"baseline: {note}")
    for name, (threads, kills, duplicates) in sorted(tally.table.items()):
        print(f"arm={name} threads={threads} kills={kills} duplicates={duplicates}")
    elapsed = time.monotonic() - started
    print(
        f"elapsed_s={elapsed:.1f} baseline_lost={tally.baseline_lost} "
        "castore_checkpointer=CastoreSaver"
    )
    print(tally.line())
    return 0 if tally.duplicates == 0 and tally.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
