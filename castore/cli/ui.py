"""`castore ui`: serve the web page for the person on call (castore.ui, the ui extra); its
resolve is this command line's own `castore resolve`, run in-process, messages and all."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable

from castore.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILURE,
    EXIT_OK,
    emit_json,
    open_store,
    parse_duration,
    store_path,
)
from castore.errors import UsageError

DEFAULT_PORT = 8470
# A resolve takes the task's lock (waiting up to 10 s for a worker that holds it) and commits.
RESOLVE_TIMEOUT_S = 60.0


def resolver(store: str) -> Callable[[list[str]], tuple[int, str]]:
    """Run `castore --store STORE resolve WORDS...` as a person at a shell would: this
    command line in a process of its own (the same parser, library call, audit record,
    messages and exit status), its output caught whole."""
    import subprocess  # noqa: PLC0415 - only this verb runs commands
    import sys  # noqa: PLC0415

    def resolve(words: list[str]) -> tuple[int, str]:
        try:
            done = subprocess.run(  # noqa: S603 - our own interpreter and module, no shell
                [sys.executable, "-m", "castore", "--store", store, "resolve", *words],
                capture_output=True,
                text=True,
                timeout=RESOLVE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return EXIT_FAILURE, (
                f"castore: error: castore resolve did not finish within {RESOLVE_TIMEOUT_S:g} "
                "s; see `castore status` for where the task stands"
            )
        return done.returncode, (done.stdout + done.stderr).strip()

    return resolve


def _check_host(host: str) -> None:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return  # a name: requests must name it (guard.py)
    if address.is_unspecified:
        raise UsageError(
            f"--host {host}: give the one address people will open (the page refuses any "
            "request that does not name it), not every address"
        )


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        from castore.ui import guard, server  # noqa: PLC0415 - Starlette, uvicorn, Jinja2
    except ImportError as exc:
        raise UsageError(
            f"castore ui needs castore's ui extra ({exc}); install it with "
            "pip install 'castore[ui]'"
        ) from None
    from castore.run.resolution import default_actor  # noqa: PLC0415

    _check_host(args.host)
    store = open_store(args)  # not a store: the usual one line, before anything listens
    path = store_path(args)
    sock = server.bind(args.host, args.port)
    token = guard.new_token()
    url = server.url_of(sock, args.host)

    def started() -> None:
        opened = f"{url}?token={token}" if args.allow_resolve else url
        if args.json:
            fields = {"url": url, "open": opened, "store": store.root}
            emit_json("ui", {**fields, "resolve": args.allow_resolve}, flush=True)
            return
        mode = "resolve allowed with the token in this URL" if args.allow_resolve else "read-only"
        print(f"castore ui: {opened} ({store.root}; {mode}); stop with Ctrl-C", flush=True)

    server.serve(
        sock,
        args.host,
        store_path=path,
        store_arg=None if path == DEFAULT_STORE else path,
        token=token,
        resolver=resolver(path) if args.allow_resolve else None,
        who=default_actor(),
        stuck_after=args.stuck_after,
        started=started,
    )
    return EXIT_OK


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to 65535")
    return int(text)


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = verbs.add_parser(
        "ui", help="a web page of the store's tasks, a task's timeline and the live alerts"
    )
    ui.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"listen on port N (default {DEFAULT_PORT}; 0: any free port)",
    )
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="listen on this address (default 127.0.0.1: this machine only)",
    )
    ui.add_argument(
        "--allow-resolve",
        action="store_true",
        help="let the page resolve effects (castore resolve), with the token it prints",
    )
    ui.add_argument(
        "--stuck-after",
        type=parse_duration,
        default=300.0,
        metavar="DURATION",
        help="an effect SUBMITTED this long is stuck, as castore watch says (default 5m)",
    )
    ui.add_argument(
        "--json",
        action="store_true",
        help='print {"type": "ui", url, open (the URL to open, token included), store, resolve}',
    )
    ui.set_defaults(handler=cmd_ui)
