"""`castore demo [PATH]`: crash a worker mid-payment, resume it, show nothing happened twice."""

from __future__ import annotations

import argparse

from castore.cli import EXIT_FINDINGS, EXIT_OK, add_path_argument, store_path
from castore.lab.demo import run_demo


def cmd_demo(args: argparse.Namespace) -> int:
    report = run_demo(store_path(args), say=print)
    return EXIT_OK if report.ok else EXIT_FINDINGS


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = verbs.add_parser(
        "demo", help="kill a worker right after a payment, resume, show the evidence"
    )
    add_path_argument(demo)
    demo.set_defaults(handler=cmd_demo)
