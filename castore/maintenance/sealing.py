"""Sealing a task's whole history in one SEAL commit: what `castore upgrade` does for each task,
and what a finishing run does at close (castore.chain.seal has the protocol)."""

from __future__ import annotations

from castore.chain.seal import SealReport
from castore.store import Store


def seal_task(store: Store, task_id: str) -> SealReport:
    """Seal task `task_id`'s whole history up to HEAD with a SEAL commit (upgrade, and what
    a finishing run does at close); ConflictError if another writer commits first. A task
    whose HEAD already is such a SEAL is left as it is."""
    with store.seal_run(task_id) as run:
        return run.seal_now()
