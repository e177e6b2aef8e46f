"""`castore doctor PATH [--peer PATH2]` (or `castore doctor s3://bucket/prefix`): does this
filesystem, or this S3 endpoint, give castore what it relies on?"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from castore.cli.common import EXIT_FINDINGS, EXIT_OK, add_path_argument, emit_json, store_path
from castore.errors import UsageError

S3_ROUNDS = 1000  # castore.doctor.s3.ROUNDS (not imported: --help must not load boto3)

if TYPE_CHECKING:
    from castore.doctor.report import DoctorReport


def cmd_doctor(args: argparse.Namespace) -> int:
    from castore.medium.select import S3_SCHEME  # noqa: PLC0415 - the medium is not --help's

    target = store_path(args)
    if target.startswith(S3_SCHEME):
        if args.peer:
            raise UsageError("--peer is for a second mount of a directory; an S3 store has none")
        from castore.doctor.s3 import run_s3_doctor  # noqa: PLC0415 - the s3 extra, if asked

        report = run_s3_doctor(target, rounds=args.rounds)
        return _print(report, args, rounds=args.rounds)
    if not os.path.lexists(target):  # the store may not exist yet: check where it would live
        target = os.path.dirname(os.path.abspath(target))
    # Anything else that is not a directory (a file, a dangling link) run_doctor refuses.
    from castore.doctor import run_doctor  # noqa: PLC0415 - loaded only for this verb

    return _print(run_doctor(target, args.peer), args)


def _print(report: DoctorReport, args: argparse.Namespace, *, rounds: int | None = None) -> int:
    if args.json:
        emit_json("doctor", report.to_json())
    else:
        print(report.to_text())
        if not report.safe:
            print("castore is NOT safe here: see the failed checks.")
        elif rounds is not None and rounds < S3_ROUNDS:
            # Stock moto let two writers win in 1 of about 180 rounds: fewer rounds than the
            # default may miss such a race, so they are not called safe (the record still
            # says what was found, and the store opens).
            print(
                f"no check failed in {rounds} rounds, too few to call castore safe here: a "
                f"race rarer than 1 in {max(1, rounds // 3):,} rounds could have slipped "
                f"through; run --rounds {S3_ROUNDS} or more"
            )
        else:
            print(f"castore is safe here ({rounds} rounds)." if rounds else "castore is safe here.")
    return EXIT_OK if report.safe else EXIT_FINDINGS


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = verbs.add_parser(
        "doctor",
        help="check exclusive create, link, rename, fsync, O_NOFOLLOW, flock here (an s3:// "
        "store: conditional PUTs raced, read- and list-after-write; the verdict is recorded)",
    )
    add_path_argument(doctor)
    doctor.add_argument("--peer", metavar="PATH2", help="another mount of the same directory")
    doctor.add_argument(
        "--rounds",
        type=int,
        default=S3_ROUNDS,
        metavar="N",
        help="an s3:// store: races of 8 concurrent creates of one key (default %(default)s)",
    )
    doctor.add_argument(
        "--json", action="store_true", help='print {"type": "doctor", path, peer, safe, checks}'
    )
    doctor.set_defaults(handler=cmd_doctor)
