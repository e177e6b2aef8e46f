"""`castore forget` and `castore fork`: end a task for good, or start a new one from an
earlier snapshot of another."""

from __future__ import annotations

import argparse

from castore.cli.common import EXIT_OK, emit_json, open_store


def cmd_forget(args: argparse.Namespace) -> int:
    from castore.run.resolution import default_actor  # noqa: PLC0415 - heavy; --help is not

    store = open_store(args)
    done = store.forget(
        args.task, who=args.who or default_actor(), why=args.why, force_in_flight=args.force
    )
    if args.json:
        emit_json(
            "forget",
            {
                "task": done.task,
                "seq": done.seq,
                "snapshot": done.id,
                "time_ms": done.time_ms,
                "who": done.who,
                "why": done.why,
                "already": done.already,
            },
        )
        return EXIT_OK
    if done.already:
        print(f"task {done.task} was already forgotten (tombstone at seq {done.seq})")
    else:
        print(
            f"forgot task {done.task}: tombstone at seq {done.seq} ({done.id[:12]}); "
            "`castore gc` reclaims its history"
        )
    return EXIT_OK


def cmd_fork(args: argparse.Namespace) -> int:
    store = open_store(args)
    done = store.fork(args.source, args.new)
    if args.json:
        emit_json(
            "fork",
            {
                "task": done.task,
                "snapshot": done.snapshot,
                "outcomes": done.outcomes,
                "source": done.source,
                "seq": done.seq,
                "carried": done.carried,
            },
        )
        return EXIT_OK
    print(
        f"forked {done.source}@{done.seq} as task {done.task} ({done.snapshot[:12]}), "
        f"carrying {done.carried} outcome(s); effects after the fork point run again in it, "
        "under new keys"
    )
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    forget = verbs.add_parser(
        "forget", help="end a task for good (a tombstone; gc then reclaims its history)"
    )
    forget.add_argument("task")
    forget.add_argument("--why", required=True, help="why the task is forgotten (audit)")
    forget.add_argument("--who", help="who forgets it (default: user@host)")
    forget.add_argument(
        "--force-in-flight",
        dest="force",
        action="store_true",
        help="forget it even with an effect SUBMITTED or UNRESOLVED (its outcome stays unknown)",
    )
    forget.add_argument(
        "--json",
        action="store_true",
        help="print {task, seq, snapshot, time_ms, who, why, already}",
    )
    forget.set_defaults(handler=cmd_forget)
    fork = verbs.add_parser(
        "fork", help="start a new task from an earlier snapshot of another (TASK@SEQ NEW)"
    )
    fork.add_argument("source", metavar="TASK@SEQ", help="the snapshot to start from")
    fork.add_argument("new", metavar="NEW", help="the new task's id (never used before)")
    fork.add_argument(
        "--json",
        action="store_true",
        help="print {task, snapshot, outcomes, source, seq, carried}",
    )
    fork.set_defaults(handler=cmd_fork)
