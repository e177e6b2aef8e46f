"""`castore init [PATH]`: create an empty store."""

from __future__ import annotations

import argparse

import castore
from castore.cli.common import EXIT_OK, add_path_argument, emit_json, store_path


def cmd_init(args: argparse.Namespace) -> int:
    store = castore.Store.init(store_path(args))
    if args.json:
        emit_json("init", {"store": store.root, "format": castore.format.codec.FORMAT_VERSION})
    else:
        print(
            f"initialised empty castore store (format {castore.format.codec.FORMAT_VERSION}) in "
            f"{store.root}"
        )
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = verbs.add_parser("init", help="create an empty store")
    add_path_argument(init)
    init.add_argument("--json", action="store_true", help="print {store, format}")
    init.set_defaults(handler=cmd_init)
