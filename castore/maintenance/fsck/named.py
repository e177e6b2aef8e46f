"""The objects chains name (plans, result blobs), each checked once per unit of work where
its id says it lives, and the shape of each plan the chain checks need."""

from __future__ import annotations

from typing import Any

from castore.chain import references
from castore.chain.trees import MAX_TREE_DEPTH, PART_KINDS, Tree
from castore.format.layout import OBJECTS_DIR, is_object_name, object_relpath
from castore.format.model import attrs
from castore.format.records import Plan
from castore.maintenance.fsck.findings import Finding
from castore.maintenance.fsck.objects import ObjectReport, check_named
from castore.medium.base import Medium


@attrs.frozen
class PlanShape:
    """What the chain checks need of a plan: its step ids in order, and which are effects."""

    steps: tuple[str, ...]
    effects: frozenset[str]
    grows: bool = False  # v2: more steps are decided as the task runs (FORMAT.md 7.9)

    @classmethod
    def of(cls, plan: Plan) -> PlanShape:
        return cls(
            tuple(s.id for s in plan.steps),
            frozenset(s.id for s in plan.steps if s.effect),
            bool(plan.grows),
        )


class NamedObjects:
    """The objects snapshots name (plans, result blobs), each checked once per unit of work:
    a reference is judged by the object itself, read where its id says it is."""

    def __init__(self, medium: Medium) -> None:
        self.medium = medium
        self.reports: dict[str, ObjectReport | None] = {}  # None: no such object file
        self._shapes: dict[str, PlanShape | None] = {}
        self._fanouts: dict[str, bool] = {}  # fan-out name -> a real directory
        self._heights: dict[str, int] = {}  # trees followed: id -> trees nested, itself counted
        self._reached: list[str] = []  # parts reached through trees since the last drain
        self.unreadable = False  # a damaged tree or pack whose names cannot be read

    def report(self, object_id: str, *, followed: bool = True) -> ObjectReport | None:
        """The report of a named object; a tree is followed at once, so that its report
        carries its tree findings (and the reports of its parts follow it). `followed`: named
        where a tree or pack may be (a result, a part), so what a damaged one names counts."""
        found = self._check(object_id)
        if not followed:
            return found
        if found is not None and found.kind == "tree" and object_id not in self._heights:
            self._follow(object_id)
            found = self.reports[object_id]
        elif found is not None and found.damaged and object_id not in self._heights:
            self._heights[object_id] = 0  # looked at once
            self._reached.extend(self._named_anyway(object_id))
        return found

    def _named_anyway(self, object_id: str) -> list[str]:
        """What a damaged tree or pack still names, read as gc reads it (gc keeps those, so
        fsck must not call them unreachable; if gc cannot read them, it keeps everything)."""
        try:
            loaded = references.load_key(self.medium, object_relpath(object_id))
            return list(references.named_by(*loaded)) if isinstance(loaded, tuple) else []
        except references.UnreadableNames:
            self.unreadable = True
            return []

    def drain_reached(self) -> list[str]:
        """The ids reached through trees since the last call (what a task refers to)."""
        reached, self._reached = self._reached, []
        return reached

    def _check(self, object_id: str) -> ObjectReport | None:
        try:
            return self.reports[object_id]
        except KeyError:
            pass
        # Where fsck's listing of objects/ indexes nothing (a symlinked or non-directory
        # fan-out entry), a reference finds nothing either: never read through a symlink.
        found = None
        if is_object_name(object_id) and self._real_fanout(object_id[:2]):
            found = check_named(self.medium, object_id)
        self.reports[object_id] = found
        return found

    def _follow(self, root: str) -> None:
        """Check every part the tree `root` reaches, depth first without recursion: a part
        missing or damaged, a loop, a nesting deeper than castore writes are findings of the
        tree that names them, each tree judged once."""
        stack = [self._frame(root)]
        on_path = {root}
        while stack:
            tree_id, pending, tallest = stack[-1]
            if not pending:
                stack.pop()
                on_path.discard(tree_id)
                height = self._heights[tree_id] = tallest + 1
                if height == MAX_TREE_DEPTH + 1:  # each too-deep nesting has one such tree
                    message = (
                        f"it heads {height} nested trees (castore writes at most {MAX_TREE_DEPTH})"
                    )
                    self._add(tree_id, "tree-too-deep", message)
                if stack:
                    stack[-1][2] = max(stack[-1][2], height)
                continue
            name, part = pending.pop()
            self._reached.append(part)
            if part in on_path:
                self._add(tree_id, "tree-cycle", f"part {name!r} names {part}, which names it back")
                continue
            if part in self._heights:
                stack[-1][2] = max(stack[-1][2], self._heights[part])
                continue
            found = self._check(part)
            if found is None or found.damaged or found.kind not in PART_KINDS:
                what = "missing or damaged" if found is None or found.damaged else f"a {found.kind}"
                self._add(tree_id, "tree-missing-part", f"part {name!r} names {part}: {what}")
            elif found.kind == "tree":
                on_path.add(part)
                stack.append(self._frame(part))

    def _frame(self, tree_id: str) -> list[Any]:
        """[tree id, its (name, part) pairs left to look at, tallest part tree so far]."""
        report = self.reports[tree_id]
        record = report.record if report is not None else None
        refs = record.refs if isinstance(record, Tree) else {}
        return [tree_id, sorted(refs.items(), reverse=True), 0]

    def _add(self, tree_id: str, code: str, message: str) -> None:
        report = self.reports[tree_id]
        if report is None:  # only trees that were read are followed: never the case
            return
        finding = Finding(code, object_relpath(tree_id), message, tree_id)
        self.reports[tree_id] = attrs.evolve(report, findings=(*report.findings, finding))

    def _real_fanout(self, fanout: str) -> bool:
        try:
            return self._fanouts[fanout]
        except KeyError:
            try:
                kind = self.medium.stat(f"{OBJECTS_DIR}/{fanout}").kind
            except OSError:
                kind = ""
            real = self._fanouts[fanout] = kind == "directory"
            return real

    def plan_shape(self, plan_id: str) -> PlanShape | None:
        """The shape of an intact plan; None if it is missing, damaged or not a plan."""
        try:
            return self._shapes[plan_id]
        except KeyError:
            report = self._check(plan_id)
            record = report.record if report is not None else None
            shape = self._shapes[plan_id] = (
                PlanShape.of(record) if isinstance(record, Plan) else None
            )
            return shape
