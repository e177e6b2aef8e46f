"""`castore upgrade`: check a v1 store as fsck does, then make it a v2 store (FORMAT.md §18)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from castore.cli.common import add_path_argument, emit_json, positive_int, store_path
from castore.cli.maintenance import finding_line

if TYPE_CHECKING:
    from castore.maintenance.upgrade import UpgradeReport

_NEXT = (
    "nothing was changed; repair what is listed (`castore fsck` says how, `--quarantine` "
    "moves damaged objects aside, restore the rest from a backup), then run `castore upgrade` "
    "again"
)


def cmd_upgrade(args: argparse.Namespace) -> int:
    # Imported here: upgrade runs fsck's checker, which no other verb but fsck loads.
    from castore.maintenance.upgrade import upgrade  # noqa: PLC0415

    report = upgrade(store_path(args), dry_run=args.dry_run, jobs=args.jobs)
    if args.json:
        _print_json(report)
    else:
        _print_text(report)
    return report.exit_status


def _print_json(report: UpgradeReport) -> None:
    for finding in report.findings:
        emit_json("finding", finding.to_json())
    for problem in report.seal_problems:
        line = {"seal": problem.kind, "task": problem.task, "message": problem.message}
        emit_json("seal_problem", line)
    summary = {
        **report.checked,
        "store": report.root,
        "from_version": report.from_version,
        "to_version": report.to_version,
        "dry_run": report.dry_run,
        "refused": report.refused,
        "marker_written": report.marker_written,
        "seal_available": report.seal_available,
        "sealed": len(report.sealed),
        "exit_status": report.exit_status,
    }
    emit_json("summary", {"summary": summary})


def _print_text(report: UpgradeReport) -> None:
    from castore.maintenance.fsck import Severity  # noqa: PLC0415 - loaded with the upgrade, see above

    for finding in report.findings:
        if finding.severity is not Severity.INFO:  # infos are fsck's business, not a problem
            print(finding_line(finding))
    for problem in report.seal_problems:
        print(
            f"{'warning' if problem.kind == 'busy' else 'error'}: seal-{problem.kind}: "
            f"tasks/{problem.task}: {problem.message}"
        )
    checked = report.checked
    counts = (
        f"checked {checked['objects']} object(s) and {checked['tasks']} task(s): "
        f"{checked['errors']} error(s), {checked['warnings']} warning(s)"
    )
    print(f"{counts}; {_outcome(report)}")


def _outcome(report: UpgradeReport) -> str:
    root, old, new = report.root, report.from_version, report.to_version
    if any(f.code == "unknown-version" for f in report.errors):
        return (
            f"not upgraded: {root} (format {old}) holds objects of a format this castore "
            "does not read; nothing was changed; upgrade castore, then run `castore upgrade`"
        )
    if report.refused:
        return f"not upgraded: {root} (format {old}) is damaged; {_NEXT}"
    if old >= new:
        done = f"{root} is at format {new} already"
    elif report.dry_run:
        return f"{root} (format {old}) can be upgraded to format {new} (dry run: nothing written)"
    else:
        done = f"upgraded {root} from format {old} to format {new}"
    if report.dry_run:
        return f"{done} (dry run: nothing written)"
    if not report.seal_available:
        return f"{done}; no task sealed (this castore cannot seal: runs will, once it can)"
    return f"{done}; sealed {len(report.sealed)} task(s)"


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = verbs.add_parser(
        "upgrade", help="check a format v1 store as fsck does, then make it format v2"
    )
    add_path_argument(parser)
    parser.add_argument("--json", action="store_true", help="JSON lines, as fsck --json")
    parser.add_argument(
        "--dry-run", action="store_true", help="check and say what would be done; write nothing"
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="processes checking at once, as for fsck (default: CPUs)",
    )
    parser.set_defaults(handler=cmd_upgrade)
