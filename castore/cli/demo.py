"""`castore demo [PATH]`: crash a worker mid-payment, resume it, show nothing happened twice."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import sysconfig

from castore.cli.common import EXIT_FINDINGS, EXIT_OK, add_path_argument, emit_json, store_path


def cmd_demo(args: argparse.Namespace) -> int:
    path = store_path(args)
    from castore.lab.demo import run_demo  # noqa: PLC0415 - the lab loads only for this verb

    report = run_demo(path, say=_quiet if args.json else print, command=castore_command())
    if args.json:
        emit_json(
            "demo",
            {
                "store": os.path.abspath(path),
                "task": report.task,
                "applied": report.applied,
                "snapshots": report.snapshots,
                "ok": report.ok,
            },
        )
    return EXIT_OK if report.ok else EXIT_FINDINGS


def castore_command() -> str:
    """How the user's shell reaches this castore, as typed: `castore` if that name on PATH
    is this installation's script, else the script's path (`.venv/bin/castore` after the
    README's install), else this interpreter with `-m castore`."""
    script = os.path.join(sysconfig.get_path("scripts"), "castore")
    if not (os.path.isfile(script) and os.access(script, os.X_OK)):
        return f"{shlex.quote(_short(sys.executable))} -m castore"
    on_path = shutil.which("castore")
    if on_path is not None and os.path.samefile(on_path, script):
        return "castore"
    return shlex.quote(_short(script))


def _short(path: str) -> str:
    """`path` relative to the working directory when it lies below it (still a path to the
    shell: it has a slash), else absolute."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith(os.pardir) and os.sep in relative else path


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
