"""`castore log` and `castore show`: a task's chain, and one object decoded."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from castore.cli import lookup, threads
from castore.cli.common import (
    EXIT_INTEGRITY,
    EXIT_OK,
    emit_json,
    open_reader,
    positive_int,
)
from castore.errors import ChainError, ObjectMissingError, UsageError
from castore.format.layout import display_name, slot_key, validate_object_id

if TYPE_CHECKING:
    from castore.cli import history
    from castore.format.records import Snapshot
    from castore.store import Store


def _transition_text(snapshot: Snapshot) -> str:
    t = snapshot.transition
    parts = [t.kind.value]
    if t.step:
        parts.append(t.step)
    if t.effect_from or t.effect_to:
        parts.append(
            f"{t.effect_from.value if t.effect_from else '-'}->"
            f"{t.effect_to.value if t.effect_to else '-'}"
        )
    if t.receipt:
        parts.append(f"receipt={display_name(t.receipt)}")
    if t.result_ref:
        parts.append(f"result=blob:{t.result_ref[:12]}")
    if t.who:
        parts.append(f"by {display_name(t.who)}")
    if t.why:
        parts.append(f"why: {display_name(t.why)}")
    return " ".join(parts)


def _snapshot_line(snapshot_id: str, snapshot: Snapshot, event: Any = None) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(snapshot.time_ms / 1000))
    # An event's names and ids are a graph's text: one line, whatever they hold.
    told = _transition_text(snapshot) if event is None else display_name(event.text())
    return f"{snapshot.seq:>6}  {when}Z  {snapshot_id[:12]}  {told}"


def cmd_log(args: argparse.Namespace) -> int:
    if args.thread is not None and args.task is not None:
        raise UsageError("give a TASK or --thread NAME, not both (see `castore log --help`)")
    if args.task is None and args.thread is None:
        raise UsageError(
            "give a TASK (`castore status` lists them) or --thread NAME (see `castore log --help`)"
        )
    store = open_reader(args)
    tasks = _log_tasks(store, args)
    status = EXIT_OK
    for task in tasks:
        if len(tasks) > 1 and not args.json:
            print(f"task {display_name(task)}:")
        status = max(status, _log_task(store, task, args))
    return status


def _log_tasks(store: Store, args: argparse.Namespace) -> list[str]:
    """The task named, or the tasks of the LangGraph thread `--thread` names."""
    found = threads.selected(args, store.tasks() if args.thread is not None else ())
    return [str(args.task)] if found is None else found


def _log_task(store: Store, task: str, args: argparse.Namespace) -> int:
    from castore.cli import history  # noqa: PLC0415 - loaded by the verbs that read

    try:
        slots = [
            history.Slot(s.seq, store.medium.where(slot_key(task, s.seq)), i, s)
            for i, s in store.history(task)
        ]
        broken = None
    except ChainError as exc:
        tombstone = history.reclaimed_tombstone(store, task)
        reclaimed = [tombstone] if tombstone is not None else []
        # Resuming refuses the whole chain; a person looking at it sees every intact slot.
        slots, broken = reclaimed or history.read_slots(store, task), exc
        if reclaimed:
            broken = None  # a forgotten task's history below its tombstone is gc's to remove
            print(
                f"castore: note: task {display_name(task)} was forgotten; gc reclaimed "
                "its history below the tombstone",
                file=sys.stderr,
            )
    # A CastoreSaver thread's slots as LangGraph shows its checkpoints (threadview.py).
    told = threads.events(
        store, task, [(s.object_id or "", s.snapshot) for s in slots if s.snapshot]
    )
    for slot in slots[: args.count]:
        event = told.get(slot.seq) if slot.snapshot is not None else None
        if args.json:
            kind, line = _slot_json(slot)
            emit_json(kind, line if event is None else {**line, "langgraph": event.to_json()})
        elif slot.snapshot is not None and slot.object_id is not None:
            print(_snapshot_line(slot.object_id, slot.snapshot, event))
        else:
            print(history.slot_line(slot))
    if broken is None:
        return EXIT_OK
    print(f"castore: error: {history.chain_note(task, broken)}", file=sys.stderr)
    return EXIT_INTEGRITY


def _slot_json(slot: history.Slot) -> tuple[str, dict[str, Any]]:
    from castore.format import codec  # noqa: PLC0415

    if slot.snapshot is not None:
        return "snapshot", {"id": slot.object_id, **codec.to_builtins(slot.snapshot)}
    damaged = {"seq": slot.seq, "id": slot.object_id, "path": slot.path, "problem": slot.problem}
    return "damaged_slot", damaged


def _resolve_ref(store: Store, ref: str) -> str:
    """An object id from `ID`, a unique prefix of one, or `TASK@SEQ` (a snapshot by its
    place in a task's chain)."""
    if "@" in ref and not ref.startswith("@"):
        from castore.cli import history  # noqa: PLC0415

        task, _, seq = ref.rpartition("@")
        if not (seq.isascii() and seq.isdigit()):  # isdigit alone takes '³', which int() refuses
            raise UsageError(f"{ref!r}: after '@' comes a sequence number, as in invoice/42@3")
        snapshot_id, note = history.snapshot_at(store, task, int(seq))
        if note is not None:
            print(f"castore: warning: {note}", file=sys.stderr)
        return snapshot_id
    if len(ref) != 64:
        return lookup.object_by_prefix(store, ref)
    return validate_object_id(ref)


def cmd_show(args: argparse.Namespace) -> int:
    from castore.format import codec  # noqa: PLC0415

    store = open_reader(args)
    object_id = _resolve_ref(store, args.id)
    data = _slot_bytes(store, args.id, object_id)
    if data is None and not store.objects.exists(object_id):
        # Nothing names it, so nothing is damaged: the id is wrong, not the store.
        raise UsageError(
            f"no object {object_id} in {store.root}; copy an id from `castore log TASK` or "
            "name a snapshot as TASK@SEQ"
        )
    if data is None:
        data = store.objects.read(object_id)
    kind, body = codec.unframe(data, store.objects.path(object_id))
    value = codec.decode_value(body)
    if args.json:
        emit_json("show", {"id": object_id, "kind": kind, "size": len(data), "value": value})
    else:
        print(f"{kind} {object_id} ({len(data)} bytes)")
        print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
    return EXIT_OK


def _slot_bytes(store: Store, ref: str, object_id: str) -> bytes | None:
    """For TASK@SEQ whose snapshot lost its object name (a power loss, FORMAT.md §13, "A lost
    snapshot name"): its bytes from the slot, verified against the id; else None."""
    if "@" not in ref or store.objects.exists(object_id):
        return None
    from castore.chain.refs import TaskSlots  # noqa: PLC0415
    from castore.chain.snapshotread import read_snapshot  # noqa: PLC0415

    task, _, seq = ref.rpartition("@")
    try:
        return read_snapshot(
            store.objects, TaskSlots(store.medium, store.objects, task), object_id, int(seq)
        )
    except ObjectMissingError:
        return None  # pruned into a pack: no object, as for any id no file holds


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    log = verbs.add_parser("log", help="a task's chain, newest first")
    log.add_argument(
        "task", nargs="?", metavar="TASK", help="the task (or give --thread for a thread's)"
    )
    threads.add_thread_options(log)
    log.add_argument(
        "-n", type=positive_int, metavar="N", dest="count", help="only the newest N snapshots"
    )
    log.add_argument(
        "--json", action="store_true", help='one JSON object per snapshot ("type": "snapshot")'
    )
    log.set_defaults(handler=cmd_log)
    show = verbs.add_parser(
        "show", help=f"one object, decoded (ID, its first {lookup.MIN_PREFIX}+ digits, or TASK@SEQ)"
    )
    show.add_argument("id", metavar="ID")
    show.add_argument(
        "--json", action="store_true", help='print {"type": "show", id, kind, size, value}'
    )
    show.set_defaults(handler=cmd_show)
