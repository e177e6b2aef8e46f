"""`castore fsck` and `castore gc`: verify a store, and clean up what no task needs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from castore.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_path_argument,
    emit_json,
    parse_duration,
    parse_duration_or_zero,
    positive_int,
    store_path,
)
from castore.format.layout import display_name
from castore.maintenance.grace import DEFAULT_GRACE_S

if TYPE_CHECKING:
    from castore.maintenance.fsck import Finding

PROGRESS_FROM = 1000  # objects: below this a progress bar would only flicker


def _progress(done: int, total: int) -> None:
    if total >= PROGRESS_FROM:
        end = "\n" if done == total else ""
        print(f"\rchecking objects: {done}/{total}", end=end, file=sys.stderr, flush=True)


def _many(count: object, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def cmd_fsck(args: argparse.Namespace) -> int:
    # Imported here: the checker is most of what `castore` would load for every verb.
    from castore.maintenance.fsck import Summary, check_store  # noqa: PLC0415
    from castore.maintenance.fsck.quarantine import quarantine  # noqa: PLC0415
    from castore.store import Store  # noqa: PLC0415

    summary = Summary()
    progress = _progress if sys.stderr.isatty() and not args.json else None
    findings = []
    for finding in check_store(
        store_path(args),
        task=args.task,
        stuck_after=args.stuck_after,
        jobs=args.jobs,
        progress=progress,
        summary=summary,
    ):
        findings.append(finding)
        if args.json:
            emit_json("finding", finding.to_json(), flush=True)
        else:
            print(finding_line(finding))
    if args.quarantine:
        where, moved, copied = quarantine(Store.open(store_path(args)).medium, findings)
        note = (
            f"quarantined {len(moved)} damaged object(s) in {where}"
            if moved
            else "nothing to quarantine"
        )
        if copied:
            note += (
                f"; {len(copied)} copied there and left in place: this endpoint ignores "
                "If-Match on DELETE, so no request can remove only the damaged bytes "
                "(delete them by hand once no worker runs: docs/howto/fsck-gc.md)"
            )
        if args.json:
            emit_json(
                "quarantine", {"quarantine": where, "moved": len(moved), "copied": len(copied)}
            )
        else:
            print(note)
    totals = summary.to_json()
    if args.json:
        emit_json("summary", {"summary": totals})
    else:
        counted = ", ".join(
            _many(totals[key], word)
            for key, word in (("errors", "error"), ("warnings", "warning"), ("infos", "note"))
        )
        print(
            f"checked {_many(totals['objects'], 'object')} and {_many(totals['tasks'], 'task')}"
            f" in {totals['seconds']}s: {counted}"
        )
    return summary.exit_status


def finding_line(finding: Finding) -> str:
    """severity: code: path [task object]: message"""
    ids = " ".join(x for x in (finding.task, (finding.object_id or "")[:12]) if x)
    path = display_name(finding.path)  # a name planted by hand may hold a line break
    where = f"{path} [{ids}]" if ids else path
    return f"{finding.severity.value}: {finding.code}: {where}: {finding.message}"


def cmd_gc(args: argparse.Namespace) -> int:
    from castore.maintenance.gc import collect  # noqa: PLC0415 - as fsck's, for --help's sake

    report = collect(
        store_path(args),
        grace_s=args.grace,
        dry_run=args.dry_run,
        forget_finished_after=args.forget_finished_after,
    )
    status = EXIT_OK if not report.unreadable else EXIT_USAGE
    if args.json:
        emit_json(
            "gc",
            {
                "dry_run": args.dry_run,
                "removed": report.removed,
                "bytes_freed": report.bytes_freed,
                "kept_young": report.kept_young,
                "kept_pending": report.kept_pending,
                "unreadable_tasks": report.unreadable_tasks,
                "unreadable_objects": report.unreadable_objects,
                "forgotten": report.forgotten,
                "names_restored": report.names_restored,
            },
        )
        return status
    forgot = "would forget" if args.dry_run else "forgot"
    for task in report.forgotten:
        print(f"{forgot} task {display_name(task)} (finished, older than the retention period)")
    given = "would give back" if args.dry_run else "gave back"
    for relpath in report.names_restored:
        print(f"{given} the name {relpath} (a power loss took it; its chain slot kept the bytes)")
    verb = "would remove" if args.dry_run else "removed"
    for relpath in report.removed:
        print(f"{verb} {relpath}")
    if report.unreadable_tasks:
        print(
            f"kept every object: cannot read the chains of {', '.join(report.unreadable_tasks)} "
            "(run `castore fsck`)",
            file=sys.stderr,
        )
    for object_id, why in sorted(report.unreadable_objects.items()):
        print(
            f"kept every object: cannot read what {object_id} names: {why} (run `castore fsck`)",
            file=sys.stderr,
        )
    pending = (
        f" and {report.kept_pending} pack(s) a seal in progress may still name"
        if report.kept_pending
        else ""
    )
    print(
        f"{verb} {len(report.removed)} file(s), {report.bytes_freed} bytes; "
        f"kept {report.kept_young} younger than the grace period{pending}"
    )
    return status


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fsck = verbs.add_parser("fsck", help="verify every object and chain; exit 1 if damaged")
    add_path_argument(fsck)
    fsck.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per finding ("type": "finding"), then the totals ("summary")',
    )
    fsck.add_argument("--task", help="check one task and the objects it names")
    fsck.add_argument(
        "--quarantine", action="store_true", help="move damaged objects to quarantine/"
    )
    fsck.add_argument(
        "--stuck-after",
        type=parse_duration,
        default=3600.0,
        metavar="DURATION",
        help="warn about effects SUBMITTED longer than this (default 1h)",
    )
    fsck.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="processes checking at once, this one included (default: CPUs)",
    )
    fsck.set_defaults(handler=cmd_fsck)
    gc = verbs.add_parser("gc", help="remove unreachable objects and old temp files")
    add_path_argument(gc)
    gc.add_argument(
        "--grace",
        type=parse_duration_or_zero,
        default=float(DEFAULT_GRACE_S),
        metavar="DURATION",
        help="keep anything younger than this (default 14d)",
    )
    gc.add_argument(
        "--dry-run", action="store_true", help="say what would be removed, remove nothing"
    )
    gc.add_argument(
        "--forget-finished-after",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="first forget every task finished longer ago than this, as in 30d (default: off)",
    )
    gc.add_argument(
        "--json", action="store_true", help='print one object ("type": "gc"): what was removed'
    )
    gc.set_defaults(handler=cmd_gc)
