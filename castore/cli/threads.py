"""`--thread NAME [--ns NS]`: the castore tasks a LangGraph thread is stored in.

CastoreSaver names its tasks from the thread id and the checkpoint namespace, encoded by
`castore.langgraph.names` (docs/reference/langgraph.md), then a generation suffix. The lookup
only relies on the encoded start: a task belongs to a thread when its id starts with the
thread's encoded part, and to one namespace when it starts with that namespace's encoded
base followed by a field separator, whatever the suffix after it says.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from castore.errors import UsageError

if TYPE_CHECKING:
    from castore.format.records import Snapshot
    from castore.store import Store

# In the encoding '_' is followed only by '_' or a hex digit inside a field, so '_' and any
# other character is where the next field (the generation, and what may follow it) starts.
_INSIDE_A_FIELD = frozenset("_0123456789abcdef")


def add_thread_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thread",
        metavar="NAME",
        help="the tasks of LangGraph thread NAME (its thread_id; CastoreSaver's tasks)",
    )
    parser.add_argument(
        "--ns",
        metavar="NS",
        help="with --thread: only checkpoint namespace NS ('' is the root graph's)",
    )


def _names() -> ModuleType:
    try:
        from castore.langgraph import names  # noqa: PLC0415 - loads LangGraph: only for --thread
    except ImportError as exc:
        raise UsageError(
            f"--thread reads CastoreSaver's task names, which needs castore's langgraph extra "
            f"({exc}); install it (pip install 'castore[langgraph]') or give the task id"
        ) from None
    return names


def thread_tasks(tasks: Iterable[str], thread: str, ns: str | None = None) -> list[str]:
    """The ids among `tasks` that CastoreSaver made for thread `thread` (every namespace and
    generation, or only namespace `ns`'s), sorted."""
    names = _names()
    if ns is None:
        prefix = str(names.thread_prefix(thread))  # ends with the namespace field's separator
        return sorted(task for task in tasks if task.startswith(prefix))
    base = str(names.task_base(thread, ns))
    return sorted(task for task in tasks if _in_namespace(task, base))


def _in_namespace(task: str, base: str) -> bool:
    """True if `task` is `base` or `base` and further fields: a longer namespace's id also
    starts with `base` (namespace 'a' is a prefix of 'ab'), but goes on inside the field."""
    if not task.startswith(base):
        return False
    rest = task[len(base) :]
    return rest == "" or (len(rest) >= 2 and rest[0] == "_" and rest[1] not in _INSIDE_A_FIELD)


def selected(args: argparse.Namespace, tasks: Iterable[str]) -> list[str] | None:
    """The tasks `--thread`/`--ns` select (UsageError if none), or None without --thread."""
    if args.thread is None:
        if args.ns is not None:
            raise UsageError("--ns NS selects a namespace of a thread: give --thread NAME too")
        return None
    found = thread_tasks(tasks, args.thread, args.ns)
    if not found:
        where = "" if args.ns is None else f", namespace {args.ns!r}"
        raise UsageError(
            f"no task of LangGraph thread {args.thread!r}{where} in this store; "
            "`castore status` lists its tasks (is --store the saver's store?)"
        )
    return found


def _view() -> ModuleType | None:
    try:
        from castore.langgraph import threadview  # noqa: PLC0415 - loads LangGraph
    except ImportError:
        return None  # without the extra a saver's task is shown as castore steps
    return threadview


def events(store: Store, task: str, history: Iterable[tuple[str, Snapshot]]) -> dict[int, Any]:
    """The LangGraph event of each snapshot (by seq) of a CastoreSaver task, as `log` shows
    it (`.text()`, `.to_json()`); {} for any other task, or without the langgraph extra."""
    if not task.startswith("lg-"):  # no LangGraph import for a task of another name
        return {}
    view = _view()
    if view is None or _names().base_of(task) is None:
        return {}
    found: dict[int, Any] = view.events(store, history)
    return found


def where_it_stands(store: Store, task: str) -> Any:
    """The newest checkpoint of a CastoreSaver task (`.checkpoint_id`, `.step`, `.next`,
    `.interrupted`), or None if it has none or cannot be read so."""
    view = _view()
    if view is None or _names().base_of(task) is None:
        return None
    return view.latest(view.events(store, store.history(task)))
