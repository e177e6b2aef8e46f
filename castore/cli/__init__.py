"""The `castore` command: parsing, printing and exit codes (the only package that exits).

Each verb lives in a module of this package with a `register(subparsers)` function. Every
verb finds its store the same way: `--store PATH` (before or after the verb), else
`$CASTORE_STORE`, else `./.castore`; verbs whose whole job is one store also take it as a
positional PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

import castore
from castore import errors
from castore.format import layout
from castore.medium import fsio

DEFAULT_STORE = ".castore"
STORE_ENV = "CASTORE_STORE"

# Documented in README "Exit codes": a script can tell what went wrong without parsing text.
EXIT_OK = 0
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
EXIT_FINDINGS = 1  # fsck found errors; doctor found the filesystem unsafe
EXIT_USAGE = 2  # bad arguments, not a store, unknown format version, a task id taken
EXIT_INTEGRITY = 3  # a corrupt or missing object, a broken chain
EXIT_CONFLICT = 4  # another writer advanced the task first
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


def emit_json(kind: str, value: Mapping[str, object], *, flush: bool = False) -> None:
    """One JSON object on one line of stdout (every verb's --json output), with a "type"
    field saying what the line is (README, "JSON output"): the verb's name for a verb that
    prints one object, else the kind of line ("task", "finding", ..., "summary")."""
    print(json.dumps({"type": kind, **value}, sort_keys=True, ensure_ascii=False), flush=flush)


class _ArgumentError(Exception):
    """Bad command-line arguments; main() prints them in castore's one-line error format."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(f"{message} (see `{prog} --help`)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(message, self.prog)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="castore",
        description="A crash-safe checkpoint store for long-running agents and their side effects.",
    )
    parser.add_argument("--version", action="version", version=f"castore {castore.__version__}")
    _add_store_option(parser, default=None)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    from castore.cli import verbs as verb_modules  # noqa: PLC0415 - they import this module

    for register in verb_modules.REGISTRARS:
        register(verbs)
    for verb_parser in verbs.choices.values():
        # SUPPRESS: a verb's parser sets `store` only when given after the verb, so it never
        # overwrites one given before the verb with its own default.
        _add_store_option(verb_parser, default=argparse.SUPPRESS)
    return parser


def _add_store_option(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--store",
        metavar="PATH",
        default=default,
        help=f"the store (default: ${STORE_ENV}, else ./{DEFAULT_STORE})",
    )


def add_path_argument(parser: argparse.ArgumentParser) -> None:
    """The optional positional PATH of verbs whose whole job is one store."""
    parser.add_argument("path", nargs="?", metavar="PATH", help="the store (default: see --store)")


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line; an argument no parser knows is reported against the verb it
    came with, so the error points at that verb's help rather than the top level's."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(_joined_values(parser, argv))
    if unknown:
        verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        verbs.choices[args.verb].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _joined_values(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> list[str]:
    """`argv` with `--opt -1d` written `--opt=-1d`: argparse takes a value that starts with
    '-' for an option of its own and says "expected one argument", where the value's own
    check has the useful message (a negative duration). Only a value that is no option."""
    words = list(sys.argv[1:] if argv is None else argv)
    parsers = [parser, *_verb_parsers(parser)]
    takes_value = {
        option
        for each in parsers
        for action in each._actions
        if action.option_strings and action.nargs is None and action.const is None
        for option in action.option_strings
        if option.startswith("--")
    }
    known = {option for each in parsers for option in each._option_string_actions}
    joined: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        if (
            word in takes_value
            and following is not None
            and following.startswith("-")
            and following.split("=", 1)[0] not in known
        ):
            joined.append(f"{word}={following}")
            index += 2
            continue
        joined.append(word)
        index += 1
    return joined


def _verb_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(verbs.choices.values())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    try:
        args = parse_arguments(argv)
    except _ArgumentError as exc:
        print(f"castore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    handler: Handler = args.handler
    try:
        status = handler(args)
        sys.stdout.flush()  # here, where a reader that went away is handled below
    except errors.CastoreError as exc:
        print(f"castore: error: {cli_message(exc, args)}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`castore status | head`): stop quietly, as Unix tools do, and
        # point stdout at nothing so that the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # the last net: the library translates its own, this is I/O too
        print(f"castore: error: {os_error_text(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    return status


def cli_message(error: errors.CastoreError, args: argparse.Namespace) -> str:
    """The error's line for a person at a shell: what the library says for a program, told
    with the commands and options a CLI user has."""
    if isinstance(error, errors.TaskNotFoundError):
        thread = ""
        if error.task.startswith("lg-") and args.verb in ("status", "log"):
            thread = " (a LangGraph thread's tasks: --thread NAME)"
        return (
            f"no task {error.task!r} in {store_path(args)}; `castore status` lists the tasks "
            f"there{thread}, and --store or $CASTORE_STORE picks another store"
        )
    if isinstance(error, errors.StoreNotFoundError):
        nested = os.path.join(error.path, DEFAULT_STORE)
        if os.path.isfile(layout.Layout(nested).marker):
            return (
                f"no castore store at {error.path}, but {nested} is one: give that path "
                f"(--store {nested})"
            )
    return str(error)


def os_error_text(exc: OSError) -> str:
    """One line for an OSError that no castore code translated: the path and the reason."""
    path = os.fsdecode(exc.filename) if exc.filename is not None else "a file"
    return str(fsio.io_error(path, "accessing", exc))


def entry_point() -> None:
    """The console script: exit with main()'s status."""
    sys.exit(main())
