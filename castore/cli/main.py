"""The `castore` command's entry: the parser of every verb, and `main`, which runs one and
maps castore's errors to exit codes (the only module that exits)."""

from __future__ import annotations

import argparse
import codecs
import os
import sys
from collections.abc import Sequence

import castore
from castore import errors
from castore.cli.common import (
    DEFAULT_STORE,
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_USAGE,
    ArgumentFailure,
    Handler,
    Parser,
    add_store_option,
    exit_code_for,
    store_path,
)
from castore.format import layout


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="castore",
        description="A crash-safe checkpoint store for long-running agents and their side effects.",
    )
    parser.add_argument("--version", action="version", version=f"castore {castore.__version__}")
    add_store_option(parser, default=None)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    from castore.cli import verbs as verb_modules  # noqa: PLC0415 - they import this module

    for register in verb_modules.REGISTRARS:
        register(verbs)
    for verb_parser in verbs.choices.values():
        # SUPPRESS: a verb's parser sets `store` only when given after the verb, so it never
        # overwrites one given before the verb with its own default.
        add_store_option(verb_parser, default=argparse.SUPPRESS)
    return parser


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
    except ArgumentFailure as exc:
        print(f"castore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run(args.handler, args)


def _run(handler: Handler, args: argparse.Namespace) -> int:
    """The verb's exit status, or the one its error calls for (one line on stderr)."""
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
    except UnicodeEncodeError as exc:  # a task id, a key or a reason the output cannot hold
        print(f"castore: error: {unencodable_text(exc)}", file=sys.stderr)
        return EXIT_USAGE
    return status


def unencodable_text(exc: UnicodeEncodeError) -> str:
    """One line for text that the output's encoding cannot write (PYTHONIOENCODING=ascii, a
    C locale without UTF-8): which character, and how to run so that it can."""
    character = exc.object[exc.start : exc.end]
    if codecs.lookup(exc.encoding).name != codecs.lookup(sys.stdout.encoding or "utf-8").name:
        return f"{character!r} cannot be encoded in {exc.encoding} ({exc.reason})"
    return (
        f"{character!r} cannot be written in the {exc.encoding} encoding of the output; run "
        "with a UTF-8 locale (LANG=C.UTF-8) or PYTHONIOENCODING=utf-8"
    )


def cli_message(error: errors.CastoreError, args: argparse.Namespace) -> str:
    """The error's line for a person at a shell: what the library says for a program, told
    with the commands and options a CLI user has."""
    if isinstance(error, errors.TaskNotFoundError):
        thread = ""
        if error.task.startswith("lg-") and args.verb in ("status", "log"):
            thread = " (a LangGraph thread's tasks: --thread NAME)"
        return (
            f"no task {error.task!r} in {store_path(args)}{_nearest_tasks(error.task, args)}; "
            f"`castore status` lists the tasks there{thread}, and --store or $CASTORE_STORE "
            "picks another store"
        )
    if isinstance(error, errors.TaskBusyError):
        return (
            f"task {error.task!r} is held by another worker on this host (waited "
            f"{error.waited:g}s for its lock); let that worker finish, then run the command "
            "again"
        )
    if isinstance(error, errors.StoreNotFoundError):
        nested = os.path.join(error.path, DEFAULT_STORE)
        if os.path.isfile(layout.Layout(nested).marker):
            return (
                f"no castore store at {error.path}, but {nested} is one: give that path "
                f"(--store {nested})"
            )
    return str(error)


def _nearest_tasks(task: str, args: argparse.Namespace) -> str:
    """`; did you mean 'tally-1'?` for a typo'd id, from the store's own ids; '' if none is
    near or the store cannot be listed (the error line says what it can without them)."""
    from castore.cli import suggest  # noqa: PLC0415 - only on an error

    try:
        known = castore.Store.open(store_path(args)).tasks()
    except (errors.CastoreError, OSError):
        return ""
    return suggest.did_you_mean(task, known)


def os_error_text(exc: OSError) -> str:
    """One line for an OSError that no castore code translated: the path and the reason."""
    from castore.medium import oserrors  # noqa: PLC0415 - only on an error; --help is not one

    path = os.fsdecode(exc.filename) if exc.filename is not None else "a file"
    return str(oserrors.io_error(path, "accessing", exc))


def entry_point() -> None:
    """The console script: exit with main()'s status."""
    sys.exit(main())
