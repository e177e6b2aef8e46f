"""The `castore` command: parsing, printing and exit codes (the only package that exits).
Public: `main(argv)`, `build_parser()`, `entry_point()` and the EXIT_* codes.

Each verb lives in a module of this package with a `register(subparsers)` function. Every
verb finds its store the same way: `--store PATH` (before or after the verb), else
`$CASTORE_STORE`, else `./.castore`; verbs whose whole job is one store also take it as a
positional PATH.

May import: everything in castore (it drives the library, the watch, the doctor and the lab);
nothing imports it but castore.__main__.
"""

from castore.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_CONFLICT,
    EXIT_FAILURE,
    EXIT_FINDINGS,
    EXIT_INTEGRITY,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNKNOWN_OUTCOME,
    EXIT_USAGE,
    add_path_argument,
    emit_json,
    open_store,
    parse_duration,
    positive_int,
    store_path,
)
from castore.cli.main import build_parser, entry_point, main

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_CONFLICT",
    "EXIT_FAILURE",
    "EXIT_FINDINGS",
    "EXIT_INTEGRITY",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNKNOWN_OUTCOME",
    "EXIT_USAGE",
    "add_path_argument",
    "build_parser",
    "emit_json",
    "entry_point",
    "main",
    "open_store",
    "parse_duration",
    "positive_int",
    "store_path",
]
