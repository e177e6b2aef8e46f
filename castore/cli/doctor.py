"""`castore doctor PATH [--peer PATH2]`: does this filesystem give castore what it relies on?"""

from __future__ import annotations

import argparse
import os

from castore.cli.common import EXIT_FINDINGS, EXIT_OK, add_path_argument, emit_json, store_path


def cmd_doctor(args: argparse.Namespace) -> int:
    target = store_path(args)
    if not os.path.lexists(target):  # the store may not exist yet: check where it would live
        target = os.path.dirname(os.path.abspath(target))
    # Anything else that is not a directory (a file, a dangling link) run_doctor refuses.
    from castore.doctor import run_doctor  # noqa: PLC0415 - loaded only for this verb

    report = run_doctor(target, args.peer)
    if args.json:
        emit_json("doctor", report.to_json())
    else:
        print(report.to_text())
        print(
            "castore is safe here."
            if report.safe
            else "castore is NOT safe here: see the failed checks."
        )
    return EXIT_OK if report.safe else EXIT_FINDINGS


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = verbs.add_parser(
        "doctor", help="check exclusive create, link, rename, fsync, O_NOFOLLOW, flock here"
    )
    add_path_argument(doctor)
    doctor.add_argument("--peer", metavar="PATH2", help="another mount of the same directory")
    doctor.add_argument(
        "--json", action="store_true", help='print {"type": "doctor", path, peer, safe, checks}'
    )
    doctor.set_defaults(handler=cmd_doctor)
