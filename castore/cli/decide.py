"""`castore resolve`: record a person's decision on an effect whose outcome is unknown."""

from __future__ import annotations

import argparse

from castore.cli.common import EXIT_OK, emit_json, open_store, telling_lock_waits


@telling_lock_waits
def cmd_resolve(args: argparse.Namespace) -> int:
    store = open_store(args)
    snapshot_id = store.resolve(
        args.task,
        args.effect,
        receipt=args.confirmed,
        not_done=args.not_done,
        reason=args.reason,
        who=args.who,
        submitter_ended=args.submitter_ended,
    )
    if args.json:
        emit_json(
            "resolve",
            {
                "task": args.task,
                "effect": args.effect,
                "state": "CONFIRMED" if args.confirmed else "NOT_DONE",
                "receipt": args.confirmed,
                "snapshot": snapshot_id,
            },
        )
        return EXIT_OK
    outcome = f"CONFIRMED (receipt {args.confirmed})" if args.confirmed else "NOT_DONE"
    print(f"recorded: effect {args.effect} of task {args.task} is {outcome} ({snapshot_id[:12]})")
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    resolve = verbs.add_parser(
        "resolve", help="decide an unresolved effect: --confirmed RECEIPT or --not-done --reason"
    )
    resolve.add_argument("task")
    resolve.add_argument("effect", help="the effect's step id")
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--confirmed", metavar="RECEIPT", help="it happened; its receipt")
    outcome.add_argument(
        "--not-done", action="store_true", help="it did not happen (it may be submitted again)"
    )
    resolve.add_argument("--reason", help="why you decided so (required with --not-done)")
    resolve.add_argument("--who", help="who decides (default: user@host)")
    resolve.add_argument(
        "--submitter-ended",
        action="store_true",
        help="with --not-done: the worker that submitted it still runs on this host, but you "
        "know its send has ended (else castore refuses while it runs)",
    )
    resolve.add_argument(
        "--json", action="store_true", help="print {task, effect, state, receipt, snapshot}"
    )
    resolve.set_defaults(handler=cmd_resolve)
