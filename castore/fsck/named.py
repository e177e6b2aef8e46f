"""The objects chains name (plans, result blobs), each checked once per unit of work where
its id says it lives, and the shape of each plan the chain checks need."""

from __future__ import annotations

import os
import stat

import attrs

from castore.fsck.objects import ObjectReport, check_named
from castore.layout import OBJECTS_DIR, is_object_name
from castore.records import Plan


@attrs.frozen
class PlanShape:
    """What the chain checks need of a plan: its step ids in order, and which are effects."""

    steps: tuple[str, ...]
    effects: frozenset[str]

    @classmethod
    def of(cls, plan: Plan) -> PlanShape:
        return cls(tuple(s.id for s in plan.steps), frozenset(s.id for s in plan.steps if s.effect))


class NamedObjects:
    """The objects snapshots name (plans, result blobs), each checked once per unit of work:
    a reference is judged by the object itself, read where its id says it is."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.reports: dict[str, ObjectReport | None] = {}  # None: no such object file
        self._shapes: dict[str, PlanShape | None] = {}
        self._fanouts: dict[str, bool] = {}  # fan-out name -> a real directory

    def report(self, object_id: str) -> ObjectReport | None:
        try:
            return self.reports[object_id]
        except KeyError:
            pass
        # Where fsck's listing of objects/ indexes nothing (a symlinked or non-directory
        # fan-out entry), a reference finds nothing either: never read through a symlink.
        found = None
        if is_object_name(object_id) and self._real_fanout(object_id[:2]):
            found = check_named(self.root, object_id)
        self.reports[object_id] = found
        return found

    def _real_fanout(self, fanout: str) -> bool:
        try:
            return self._fanouts[fanout]
        except KeyError:
            try:
                mode = os.lstat(os.path.join(self.root, OBJECTS_DIR, fanout)).st_mode
            except OSError:
                mode = 0
            real = self._fanouts[fanout] = stat.S_ISDIR(mode)
            return real

    def plan_shape(self, plan_id: str) -> PlanShape | None:
        """The shape of an intact plan; None if it is missing, damaged or not a plan."""
        try:
            return self._shapes[plan_id]
        except KeyError:
            report = self.report(plan_id)
            record = report.record if report is not None else None
            shape = self._shapes[plan_id] = (
                PlanShape.of(record) if isinstance(record, Plan) else None
            )
            return shape
