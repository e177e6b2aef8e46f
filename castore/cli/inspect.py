"""`castore status`, `castore log` and `castore show`: read-only views of a store."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from castore import codec
from castore.cli import EXIT_INTEGRITY, EXIT_OK, EXIT_UNKNOWN_OUTCOME, open_store
from castore.errors import UsageError
from castore.layout import validate_object_id
from castore.records import Snapshot
from castore.status import TaskStatus
from castore.store import Store


def _emit_json(value: Any) -> None:
    print(json.dumps(value, sort_keys=True, ensure_ascii=False))


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _status_line(status: TaskStatus) -> str:
    if status.error:
        return f"{status.task}  BROKEN: {status.error}"
    step = "finished" if status.finished else f"at {status.step}"
    head = f"{status.task}  seq {status.seq}  {step}  next: {status.next_action}"
    lines = [head]
    lines.extend(
        f"    effect {e.step}: {e.state} for {_age(e.age_s)} (attempts {e.attempts}, key {e.key})"
        f" -> {e.next_action}: {e.reason}"
        for e in status.effects
    )
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    store = open_store(args)
    tasks = [args.task] if args.task else store.tasks()
    statuses = [store.status(task) for task in tasks]
    if args.json:
        for status in statuses:
            _emit_json(status.to_json())
    elif not statuses:
        print(f"no tasks in {store.root}")
    for status in statuses if not args.json else ():
        print(_status_line(status))
    if any(s.error for s in statuses):
        return EXIT_INTEGRITY
    unknown = any(e.state == "UNRESOLVED" for s in statuses for e in s.effects)
    return EXIT_UNKNOWN_OUTCOME if unknown else EXIT_OK


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
        parts.append(f"receipt={t.receipt}")
    if t.result_ref:
        parts.append(f"result=blob:{t.result_ref[:12]}")
    if t.who:
        parts.append(f"by {t.who}")
    if t.why:
        parts.append(f"why: {t.why}")
    return " ".join(parts)


def cmd_log(args: argparse.Namespace) -> int:
    store = open_store(args)
    for snapshot_id, snapshot in store.history(args.task):
        if args.json:
            _emit_json({"id": snapshot_id, **codec.to_builtins(snapshot)})
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(snapshot.time_ms / 1000))
        print(f"{snapshot.seq:>6}  {when}Z  {snapshot_id[:12]}  {_transition_text(snapshot)}")
    return EXIT_OK


def _resolve_ref(store: Store, ref: str) -> str:
    """An object id from `ID` or `TASK@SEQ` (a snapshot by its place in a task's chain)."""
    if "@" in ref and not ref.startswith("@"):
        task, _, seq = ref.rpartition("@")
        if not seq.isdigit():
            raise UsageError(f"{ref!r}: after '@' comes a sequence number, as in invoice/42@3")
        for snapshot_id, snapshot in store.history(task):
            if snapshot.seq == int(seq):
                return snapshot_id
        raise UsageError(f"task {task!r} has no snapshot {seq}; see `castore log {task}`")
    return validate_object_id(ref)


def cmd_show(args: argparse.Namespace) -> int:
    store = open_store(args)
    object_id = _resolve_ref(store, args.id)
    if not store.objects.exists(object_id):
        # Nothing names it, so nothing is damaged: the id is wrong, not the store.
        raise UsageError(
            f"no object {object_id} in {store.root}; copy an id from `castore log TASK` or "
            "name a snapshot as TASK@SEQ"
        )
    data = store.objects.read(object_id)
    kind, body = codec.unframe(data, store.objects.path(object_id))
    value = codec.decode_value(body)
    if args.json:
        _emit_json({"id": object_id, "kind": kind, "size": len(data), "value": value})
    else:
        print(f"{kind} {object_id} ({len(data)} bytes)")
        print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = verbs.add_parser("status", help="each task's HEAD, effects and next action")
    status.add_argument("task", nargs="?", help="one task (default: all)")
    status.add_argument("--json", action="store_true", help="one JSON object per task")
    status.set_defaults(handler=cmd_status)
    log = verbs.add_parser("log", help="a task's chain, newest first")
    log.add_argument("task")
    log.add_argument("--json", action="store_true", help="one JSON object per snapshot")
    log.set_defaults(handler=cmd_log)
    show = verbs.add_parser("show", help="one object, decoded (ID or TASK@SEQ)")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_show)
