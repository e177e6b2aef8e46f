"""`castore status`: where each task stands, filtered by a glob or by its open effects."""

from __future__ import annotations

import argparse
import fnmatch
import functools
import os
import sys
from typing import TYPE_CHECKING, Any

from castore.cli import threads
from castore.cli.common import (
    EXIT_INTEGRITY,
    EXIT_OK,
    EXIT_UNKNOWN_OUTCOME,
    json_line,
    open_reader,
    positive_int,
)
from castore.errors import UsageError
from castore.format.layout import display_name, encode_task_id

if TYPE_CHECKING:
    from castore.chain.status import TaskStatus
    from castore.store import Store

_GLOB_CHARS = frozenset("*?[")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _status_line(status: TaskStatus, checkpoint: Any = None) -> str:
    if status.error:
        return f"{status.task}  BROKEN: {display_name(status.error)}"
    if status.forgotten:  # who and why are a person's text: one line, whatever they hold
        return f"{status.task}  seq {status.seq}  {display_name(status.reason)}"
    step = "finished" if status.finished else f"at {status.step}"
    if checkpoint is not None:  # a LangGraph thread: where its graph stands, not its log's
        return _effect_lines(f"{status.task}  seq {status.seq}  {_thread_text(checkpoint)}", status)
    if status.decided is not None and not status.finished:  # a growing plan
        step = f"at {status.step}" if status.step else "waiting for its next decision"
        step += f"  ({status.decided} steps decided)"
    return _effect_lines(
        f"{status.task}  seq {status.seq}  {step}  next: {status.next_action}", status
    )


def _thread_text(checkpoint: Any) -> str:
    """`idle at checkpoint ID (step 2)  next node: act` (threadview.Checkpoint)."""
    # The ids and node names are a graph's text: one line, whatever they hold.
    where = display_name(f"checkpoint {checkpoint.checkpoint_id} (step {checkpoint.step})")
    nodes = display_name(", ".join(checkpoint.next))
    if checkpoint.interrupted:
        stopped = display_name(", ".join(checkpoint.interrupted))
        return f"interrupted in {stopped} at {where}  next node: {nodes or stopped}"
    if not checkpoint.next:
        return f"idle at {where}  next node: none (the graph finished its turn)"
    return f"idle at {where}  next node: {nodes}"


def _effect_lines(head: str, status: TaskStatus) -> str:
    lines = [head]
    # A key or a reason is the caller's text: one holding a line break would forge a line.
    lines.extend(
        f"    effect {e.step}: {e.state} for {_age(e.age_s)} (attempts {e.attempts}, key "
        f"{display_name(str(e.key))}) -> {e.next_action}: {display_name(e.reason)}"
        for e in status.effects
    )
    return "\n".join(lines)


def _unresolved(status: TaskStatus) -> bool:
    return any(e.state == "UNRESOLVED" for e in status.effects)


def _selected_tasks(store: Store, pattern: str | None) -> list[str]:
    """Every task, the tasks a glob matches, or the one task named (validated like any id:
    `''` is refused, not taken for "every task")."""
    if pattern is None:
        return store.tasks()
    if _GLOB_CHARS.isdisjoint(pattern):
        encode_task_id(pattern)
        return [pattern]
    _refuse_unclosed_set(pattern)
    return [task for task in store.tasks() if fnmatch.fnmatchcase(task, pattern)]


def _refuse_unclosed_set(pattern: str) -> None:
    """UsageError for a '[' that no ']' closes: fnmatch would match it as a plain '[', so
    the glob a person meant ('ord[12]' cut short) would silently list nothing."""
    index = 0
    while (index := pattern.find("[", index)) != -1:
        end = index + 1
        if end < len(pattern) and pattern[end] == "!":
            end += 1
        if end < len(pattern) and pattern[end] == "]":
            end += 1  # a ']' first in the set is one of its characters
        close = pattern.find("]", end)
        if close == -1:
            raise UsageError(
                f"{pattern!r}: the '[' at {index} opens a set of characters that no ']' "
                "closes; close it (as in 'order-[12]'), or match a '[' itself with '[[]'"
            )
        index = close + 1


def _wanted(status: TaskStatus, args: argparse.Namespace) -> bool:
    # A broken chain's effects cannot be known, so no filter may hide it.
    if status.error:
        return True
    if args.unresolved and not _unresolved(status):
        return False
    return not (args.open and not status.effects)


# One task as status shows it: (open effects, unresolved, broken, its text: its lines, or
# its JSON line). Made by the process that read the task: a few strings pickle in a fraction
# of a TaskStatus's time, and the reader renders in parallel with the others (issue 26).
Shown = tuple[bool, bool, bool, str]


def _shown(status: TaskStatus, as_json: bool, checkpoint: Any = None) -> Shown:
    if as_json:
        extra = {} if checkpoint is None else {"langgraph": checkpoint.to_json()}
        text = json_line("task", {**status.to_dict(), **extra})
    else:
        text = _status_line(status, checkpoint)
    return bool(status.effects), _unresolved(status), bool(status.error), text


def summary(shown: list[Shown]) -> dict[str, int]:
    """The counts the summary line and the JSON summary object give."""
    return {
        "tasks": len(shown),
        "open": sum(1 for each in shown if each[0]),
        "unresolved": sum(1 for each in shown if each[1]),
        "broken": sum(1 for each in shown if each[2]),
    }


def _summary_line(counts: dict[str, int]) -> str:
    tasks = f"{counts['tasks']} task{'' if counts['tasks'] == 1 else 's'}"
    return (
        f"{tasks}: {counts['open']} with open effects, {counts['unresolved']} unresolved, "
        f"{counts['broken']} broken"
    )


# Tasks a process reads before another is worth forking (a fork and the pickling of its
# results cost about as much as reading this many HEADs; issue 26).
MIN_SHARE = 250
_UNIT = 50  # tasks a unit of work: small, so that the processes finish together


def _read_shown(store: Store, tasks: list[str], args: argparse.Namespace) -> list[Shown]:
    """The tasks `args` asks to show, in order, each read and rendered: in this process, or
    (many tasks, a store on a filesystem) by forked processes too, each reading HEADs
    independently (threads would share one interpreter lock)."""
    read = functools.partial(_read_unit, store, args)
    jobs = args.jobs
    if jobs is None:
        jobs = min(os.cpu_count() or 1, len(tasks) // MIN_SHARE or 1)
    if min(jobs, len(tasks)) <= 1 or store.medium.kind != "posix":
        return read(tasks)
    from castore.maintenance import forked  # noqa: PLC0415 - multiprocessing, when it pays

    if not forked.may_fork():
        return read(tasks)
    units = [tasks[start : start + _UNIT] for start in range(0, len(tasks), _UNIT)]
    try:
        with forked.ForkedMap(read, units, jobs) as results:
            return [shown for unit in results for shown in unit]
    except Exception:  # noqa: BLE001 - raised again below, by the reading that meets it first
        # A task that could not be read (by a worker, or here while an earlier task's error
        # was still on its way) is reported as --jobs 1 reports it: the first such task in
        # order, with its own error and exit status. So every task is read again here.
        return read(tasks)


def _read_unit(store: Store, args: argparse.Namespace, tasks: list[str]) -> list[Shown]:
    shown = []
    for task in tasks:
        status = store.status(task, verify=args.verify)
        if _wanted(status, args):
            shown.append(_shown(status, args.json, _checkpoint(store, status, args)))
    return shown


def _checkpoint(store: Store, status: TaskStatus, args: argparse.Namespace) -> Any:
    """With --thread: the newest checkpoint of a thread's task, as LangGraph's get_state
    tells it (threadview.py); None for a broken or forgotten task, or one that has none."""
    if args.thread is None or status.error or status.forgotten:
        return None
    return threads.where_it_stands(store, status.task)


def _write_lines(lines: list[str]) -> None:
    """`lines` in writes of _LINES_A_WRITE lines, not one or two writes a line (thousands of
    tasks): each a few KiB, so that a reader that goes away (`| head`) fails the next write
    (a short write of unbuffered stdout is not reported)."""
    for start in range(0, len(lines), _LINES_A_WRITE):
        sys.stdout.write("".join(f"{line}\n" for line in lines[start : start + _LINES_A_WRITE]))


_LINES_A_WRITE = 64


def cmd_status(args: argparse.Namespace) -> int:
    if args.thread is not None and args.task is not None:
        raise UsageError("give a TASK (or glob) or --thread NAME, not both")
    store = open_reader(args)
    tasks = threads.selected(args, store.tasks() if args.thread is not None else ())
    if tasks is None:
        tasks = _selected_tasks(store, args.task)
    shown = _read_shown(store, tasks, args)
    counts = summary(shown)
    lines = [text for *_, text in shown]
    if args.json:
        lines.append(json_line("summary", {"summary": counts}))
    elif not shown:
        lines = [
            f"no {'matching ' if args.task or args.open or args.unresolved else ''}tasks in "
            f"{store.root}"
        ]
    else:
        lines.append(_summary_line(counts))
    _write_lines(lines)
    if counts["broken"]:
        return EXIT_INTEGRITY
    return EXIT_UNKNOWN_OUTCOME if counts["unresolved"] else EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = verbs.add_parser("status", help="each task's HEAD, effects and next action")
    status.add_argument(
        "task",
        nargs="?",
        metavar="TASK",
        help="one task, or a glob such as 'order-*' (default: all)",
    )
    threads.add_thread_options(status)
    status.add_argument("--open", action="store_true", help="only tasks with open effects")
    status.add_argument(
        "--unresolved", action="store_true", help="only tasks with an UNRESOLVED effect"
    )
    status.add_argument(
        "--verify",
        action="store_true",
        help="verify each whole chain back to its plan root, as a resume does (default: HEAD only)",
    )
    status.add_argument(
        "--jobs",
        type=positive_int,
        metavar="N",
        help=f"processes reading the tasks, this one included (default: CPUs, with at least "
        f"{MIN_SHARE} tasks each; 1: this process alone)",
    )
    status.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per task ("type": "task"), then the totals ("type": "summary")',
    )
    status.set_defaults(handler=cmd_status)
