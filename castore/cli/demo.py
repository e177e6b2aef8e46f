"""`castore demo [PATH]`: crash a worker mid-payment, resume it, show nothing happened twice."""

from __future__ import annotations

import argparse
import os

from castore.cli import EXIT_FINDINGS, EXIT_OK, add_path_argument, emit_json, store_path
from castore.lab.demo import run_demo


def cmd_demo(args: argparse.Namespace) -> int:
    path = store_path(args)
    report = run_demo(path, say=_quiet if args.json else print)
    if args.json:
        emit_json(
            {
                "store": os.path.abspath(path),
                "task": report.task,
                "applied": report.applied,
                "snapshots": report.snapshots,
                "ok": report.ok,
            }
        )
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _quiet(line: str) -> None:
    """--json: the evidence is in the JSON object; the narration is for people."""


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = verbs.add_parser(
        "demo", help="kill a worker right after a payment, resume, show the evidence"
    )
    add_path_argument(demo)
    demo.add_argument(
        "--json", action="store_true", help="no narration; print {store, task, applied, ok, ...}"
    )
    demo.set_defaults(handler=cmd_demo)
