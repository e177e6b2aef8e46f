"""Findings: what fsck reports, with a stable code, a severity and what to do about it."""

from __future__ import annotations

import enum
from typing import Any

from castore.format.model import attrs


class Severity(enum.StrEnum):
    ERROR = "error"  # data is damaged or a guarantee is broken: exit status 1
    WARNING = "warning"  # something needs a person's attention; data is intact
    INFO = "info"  # worth knowing (leftovers, unreachable objects); nothing to do


# Every code fsck can emit, its severity and what to do; docs/FORMAT.md lists them too.
CODES: dict[str, tuple[Severity, str]] = {
    "unknown-file": (Severity.WARNING, "a file castore did not write; inspect it and move it out"),
    "unsafe-file": (
        Severity.ERROR,
        "a symlink, FIFO, device or directory where a file belongs; remove it by hand",
    ),
    "bad-fanout": (Severity.WARNING, "objects/ holds something that is not a fan-out directory"),
    "stray-file": (
        Severity.WARNING,
        "a file in a fan-out or chain directory that is not castore's",
    ),
    "temp-file": (
        Severity.INFO,
        "a leftover temp file of an interrupted write; gc removes it after the grace period",
    ),
    "misplaced-object": (Severity.ERROR, "an object in the wrong fan-out directory; quarantine it"),
    "object-empty": (
        Severity.ERROR,
        "an empty object file; quarantine it and restore from a backup",
    ),
    "truncated": (
        Severity.ERROR,
        "an object shorter (or longer) than its header says; quarantine and restore",
    ),
    "bad-header": (
        Severity.ERROR,
        "an object without a valid castore header; quarantine and restore",
    ),
    "unknown-kind": (Severity.ERROR, "an object of a kind this castore does not know"),
    "unknown-version": (
        Severity.ERROR,
        "an object of a format version this castore does not know; upgrade castore",
    ),
    "hash-mismatch": (
        Severity.ERROR,
        "the bytes do not hash to the object's name (bit rot, an edit); quarantine and restore",
    ),
    "object-wrong-name": (
        Severity.ERROR,
        "a valid object stored under another object's name; quarantine it",
    ),
    "undecodable": (
        Severity.ERROR,
        "the body is not valid canonical-model JSON; quarantine and restore",
    ),
    "not-canonical": (
        Severity.ERROR,
        "the body is valid JSON but not in canonical form; castore never writes this",
    ),
    "schema-invalid": (Severity.ERROR, "the record does not match format v1's schema"),
    "writable-object": (Severity.WARNING, "objects are read-only once published; chmod a-w it"),
    "hard-linked-object": (
        Severity.WARNING,
        "an object has more names than castore gives it; find the other link",
    ),
    "read-error": (Severity.ERROR, "the file could not be read twice in a row; check the disk"),
    "unreachable-object": (
        Severity.INFO,
        "no task refers to it (an interrupted write); gc removes it after the grace period",
    ),
    "bad-task-name": (
        Severity.WARNING,
        "a directory in tasks/ whose name is not a task id encoding",
    ),
    "no-chain": (
        Severity.WARNING,
        "a task directory without slot 0: an interrupted start; start the task again, or "
        "remove the directory",
    ),
    "missing-directory": (
        Severity.ERROR,
        "objects/ or tasks/ is missing: the store is damaged; restore it from a backup",
    ),
    "interrupted-init": (
        Severity.WARNING,
        "an interrupted `castore init`: no castore.json yet; `castore init` completes it",
    ),
    "missing-marker": (
        Severity.ERROR,
        "castore.json is missing or empty but the store has content; restore it from a backup",
    ),
    "slot-gap": (
        Severity.ERROR,
        "chain slots are not contiguous; resume refuses this task; restore the slot",
    ),
    "slot-corrupt": (
        Severity.ERROR,
        "a chain slot that is not a valid snapshot object; restore it from a backup",
    ),
    "slot-not-published": (
        Severity.ERROR,
        "a chain slot whose snapshot object is missing from objects/",
    ),
    "snapshot-name-lost": (
        Severity.WARNING,
        "a power loss took the object name of this slot's snapshot (format 2 does not sync "
        "it); its bytes verify through the slot, and `castore gc` gives the name back",
    ),
    "seq-mismatch": (
        Severity.ERROR,
        "a snapshot in a slot whose number is not its sequence number",
    ),
    "foreign-snapshot": (Severity.ERROR, "a snapshot of another task spliced into this chain"),
    "broken-link": (
        Severity.ERROR,
        "a snapshot whose parent is not the snapshot of the slot before",
    ),
    "cycle": (Severity.ERROR, "parent links loop; the chain was forged"),
    "root-not-start": (Severity.ERROR, "slot 0 is not a start snapshot, or a later slot is"),
    "plan-changed": (
        Severity.ERROR,
        "the plan changes without an override snapshot; a foreign plan was spliced in",
    ),
    "missing-object": (
        Severity.ERROR,
        "a plan, blob or parent that a snapshot names is missing or damaged",
    ),
    "bad-frontier": (Severity.ERROR, "the frontier or the effect records do not fit the plan"),
    "illegal-transition": (
        Severity.ERROR,
        "an effect or the frontier changed in a way the protocol does not allow",
    ),
    "keyless-effect": (
        Severity.ERROR,
        "an effect in flight without an idempotency key; resolve it by hand",
    ),
    "effect-unresolved": (
        Severity.WARNING,
        "an effect's outcome is unknown; check the service, then `castore resolve`",
    ),
    "effect-stuck": (
        Severity.WARNING,
        "an effect has been SUBMITTED for long; is its worker alive?",
    ),
    "lock-held": (Severity.INFO, "a worker holds the task's lock right now"),
    "pack-truncated": (
        Severity.ERROR,
        "a pack shorter than its header says (a partial copy); restore it from a backup",
    ),
    "pack-hash-mismatch": (
        Severity.ERROR,
        "a pack's bytes do not hash to its name; restore it from a backup",
    ),
    "pack-wrong-task": (
        Severity.ERROR,
        "a task's seal names a pack of another task: spliced; restore the task from a backup",
    ),
    "pack-chain-broken": (
        Severity.ERROR,
        "a pack whose snapshots, index or header do not hold together, or do not join the "
        "chain that names it; castore never writes one; restore from a backup",
    ),
    "pack-slot-disagree": (
        Severity.ERROR,
        "a slot still present in a sealed range holds another snapshot than the pack",
    ),
    "sealed-mark-stale": (
        Severity.INFO,
        "the sealed mark is behind the newest durable seal (a run stopped before writing it); "
        "the next run or gc catches up",
    ),
    "sealed-mark-damaged": (
        Severity.ERROR,
        "the task's sealed mark cannot be read, or says what no durable seal does; resume "
        "refuses the task; restore the mark from a backup",
    ),
    "tree-missing-part": (
        Severity.ERROR,
        "a tree a chain reaches names a part that is missing, damaged or of a kind a tree "
        "cannot name; restore the part (the same bytes give the same id)",
    ),
    "tree-cycle": (
        Severity.ERROR,
        "trees that name each other in a loop: impossible without forged ids; restore them",
    ),
    "tree-too-deep": (
        Severity.WARNING,
        "trees nested deeper than castore writes (100); readers still follow them",
    ),
}


@attrs.frozen
class Finding:
    """One thing fsck found. `path` is relative to the store root."""

    code: str
    path: str
    message: str
    object_id: str | None = None
    task: str | None = None

    @property
    def severity(self) -> Severity:
        return CODES[self.code][0]

    @property
    def advice(self) -> str:
        return CODES[self.code][1]

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "path": self.path,
            "message": self.message,
            "object": self.object_id,
            "task": self.task,
            "advice": self.advice,
        }
