"""`castore watch`: alerts on a store's tasks from filesystem-watch hints, each re-read and
verified before it is believed (public: Watcher, Alert). castore.watch.observer is the only
importer of watchdog, loaded with Watcher only: `import castore`, the CLI's parser and
castore.watch.alerts never load it.

May import: castore.run, castore.chain and everything below them; never castore.cli.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from castore.watch.alerts import Alert

if TYPE_CHECKING:
    from castore.watch.watcher import Watcher

__all__ = ["Alert", "Watcher"]


def __getattr__(name: str) -> Any:
    if name == "Watcher":  # watchdog comes with it: only when asked for
        from castore.watch.watcher import Watcher  # noqa: PLC0415

        return Watcher
    raise AttributeError(f"module 'castore.watch' has no attribute {name!r}")
