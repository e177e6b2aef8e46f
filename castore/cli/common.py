"""What every verb of the `castore` command shares: exit codes, durations, finding and
opening the store, the JSON line printer and the parser's store options."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import NoReturn

import castore
from castore import errors

DEFAULT_STORE = ".castore"
STORE_ENV = "CASTORE_STORE"

# Documented in docs/reference/cli.md, "Exit codes": a script can tell what went wrong
# without parsing text.
EXIT_OK = 0
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
EXIT_FINDINGS = 1  # fsck found errors; doctor found the filesystem unsafe
EXIT_USAGE = 2  # bad arguments, not a store, unknown format version, a task id taken
EXIT_INTEGRITY = 3  # a corrupt or missing object, a broken chain
EXIT_CONFLICT = 4  # another writer advanced the task first, or holds its lock past the wait
EXIT_REFUSED = 5  # refused: the resumption gate (drift, keyless effect, ...), a forgotten task
EXIT_UNKNOWN_OUTCOME = 6  # an effect's outcome is unknown: a person must resolve it
EXIT_FAILURE = 7  # any other castore error (I/O, durability)

_EXIT_BY_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    (errors.ChainError, EXIT_INTEGRITY),
    (errors.ResumeRefusedError, EXIT_REFUSED),
    (errors.TaskForgottenError, EXIT_REFUSED),
    (errors.ForgetRefusedError, EXIT_REFUSED),
    (errors.ForkError, EXIT_REFUSED),
    (errors.UsageError, EXIT_USAGE),
    (errors.StoreNotFoundError, EXIT_USAGE),
    (errors.StoreExistsError, EXIT_USAGE),
    (errors.FormatVersionError, EXIT_USAGE),
    (errors.TaskNotFoundError, EXIT_USAGE),
    (errors.TaskExistsError, EXIT_USAGE),
    (errors.IntegrityError, EXIT_INTEGRITY),
    (errors.ConflictError, EXIT_CONFLICT),
    (errors.TaskBusyError, EXIT_CONFLICT),
    (errors.OutcomeUnknownError, EXIT_UNKNOWN_OUTCOME),
)

Handler = Callable[[argparse.Namespace], int]


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)")


def parse_duration(text: str) -> float:
    """Seconds from `300`, `300s`, `5m`, `2h`, `1d` (or a decimal, as in `0.5`); more than 0."""
    seconds = parse_duration_or_zero(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be more than zero")
    return seconds


def parse_duration_or_zero(text: str) -> float:
    """`parse_duration`, where 0 is allowed (gc's "no grace": only when nothing writes)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a duration cannot be negative; give 0 or more (300, 300s, 5m, 2h, 1d)"
        )
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: give seconds, or a number with s, m, h or d "
            "(300, 300s, 5m, 2h, 1d)"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a count of processes, say)."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return number


def exit_code_for(error: BaseException) -> int:
    """The documented exit status for a castore error."""
    for cls, code in _EXIT_BY_ERROR:
        if isinstance(error, cls):
            return code
    return EXIT_FAILURE


def store_path(args: argparse.Namespace) -> str:
    """The store a verb works on: positional PATH, --store, $CASTORE_STORE, ./.castore."""
    positional = getattr(args, "path", None)
    return str(positional or args.store or os.environ.get(STORE_ENV) or DEFAULT_STORE)


def open_store(args: argparse.Namespace) -> castore.Store:
    return castore.Store.open(store_path(args))


def open_reader(args: argparse.Namespace) -> castore.Store:
    """The store for a verb that only reads: every write through it raises (FORMAT.md §12)."""
    return castore.Store.open(store_path(args), read_only=True)


def telling_lock_waits(handler: Handler) -> Handler:
    """`handler`, with a wait for a task's lock told on stderr as it begins (one line, the
    library's note on logger castore.lock): a verb that waits in silence looks hung."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        import logging  # noqa: PLC0415 - only for the verbs that lock: --help stays light
        import sys  # noqa: PLC0415

        logger = logging.getLogger("castore.lock")
        note = logging.StreamHandler(sys.stderr)
        note.setFormatter(logging.Formatter("castore: note: %(message)s"))
        logger.addHandler(note)
        try:
            return handler(args)
        finally:
            logger.removeHandler(note)

    return run


def emit_json(kind: str, value: Mapping[str, object], *, flush: bool = False) -> None:
    """One JSON object on one line of stdout (every verb's --json output), with a "type"
    field saying what the line is (docs/reference/cli.md, "JSON output"): the verb's name
    for a verb that prints one object, else the kind of line ("task", "finding", ...,
    "summary")."""
    print(json_line(kind, value), flush=flush)


def json_line(kind: str, value: Mapping[str, object]) -> str:
    """The line emit_json prints, without its line break (for a verb that writes many at once)."""
    return json.dumps({"type": kind, **value}, sort_keys=True, ensure_ascii=False)


class ArgumentFailure(Exception):
    """Bad command-line arguments; main() prints them in castore's one-line error format."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(f"{message} (see `{prog} --help`)")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentFailure(message, self.prog)


def add_store_option(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--store",
        metavar="PATH",
        default=default,
        help=f"the store (default: ${STORE_ENV}, else ./{DEFAULT_STORE})",
    )


def add_path_argument(parser: argparse.ArgumentParser) -> None:
    """The optional positional PATH of verbs whose whole job is one store."""
    parser.add_argument("path", nargs="?", metavar="PATH", help="the store (default: see --store)")
