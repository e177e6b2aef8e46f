"""`castore brief`: the compact, deterministic description a resuming model reads to continue
a task (castore.run.brief), within a token budget."""

from __future__ import annotations

import argparse

from castore.cli.common import EXIT_OK, emit_json, open_reader
from castore.run.budget import DEFAULT_BUDGET, MIN_BUDGET, TOKEN_RULE


def budget(text: str) -> int:
    """A token budget: a whole number of at least MIN_BUDGET."""
    try:
        tokens = int(text)
    except ValueError:
        tokens = 0
    if tokens < MIN_BUDGET:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a budget is a whole number of tokens, at least {MIN_BUDGET}"
        )
    return tokens


def now(text: str) -> int:
    """`wall` (this host's clock, read once) or milliseconds since the epoch."""
    if text == "wall":
        from castore.run.settings import wall_clock_ms  # noqa: PLC0415 - heavy; --help is not

        return wall_clock_ms()
    if text.isascii() and text.isdigit() and len(text) <= 16:
        return int(text)
    raise argparse.ArgumentTypeError(
        f"{text!r}: give milliseconds since the epoch (as `castore log --json` shows time_ms) "
        "or `wall` for this host's clock"
    )


def cmd_brief(args: argparse.Namespace) -> int:
    store = open_reader(args)
    made = store.brief(args.task, budget_tokens=args.budget, now_ms=args.now, verify=args.verify)
    if args.json:
        emit_json("brief", made.data)
    else:
        print(made.text, end="")
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = verbs.add_parser(
        "brief", help="what a resuming model reads to continue a task, within a token budget"
    )
    parser.add_argument("task", metavar="TASK")
    parser.add_argument(
        "--budget",
        type=budget,
        default=DEFAULT_BUDGET,
        metavar="TOKENS",
        help=f"at most this many tokens, estimated as {TOKEN_RULE} "
        f"(default {DEFAULT_BUDGET}, at least {MIN_BUDGET})",
    )
    parser.add_argument(
        "--now",
        type=now,
        default=None,
        metavar="MS|wall",
        help="count ages to this time (default: HEAD's own time, so the same state always "
        "gives the same bytes)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="verify the whole chain first, as a resume does (default: HEAD and the tail read)",
    )
    parser.add_argument("--json", action="store_true", help="the brief's fields as one JSON object")
    parser.set_defaults(handler=cmd_brief)
