"""castore: a crash-safe, content-addressed checkpoint store for agents and their side effects.

The public API is every name in `__all__` (plus castore.aio and castore.langgraph). The
library is in layers, each a package whose docstring says what it owns: castore.format,
castore.medium, castore.chain, castore.run, castore.store, castore.maintenance, then the
adapters (aio, langgraph, watch, doctor, lab, cli); tests/test_layers.py keeps the imports
pointing down. This module imports from the layers below it and never an adapter, each
name's module only when the name is first used (PEP 562): `import castore` costs a few
milliseconds, not the whole library (a CLI or a status read starts fast).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy, mkdocstrings and readers see; at run time: _WHERE below
    from castore.chain.trees import RawRef, Tree, TreeRef
    from castore.errors import (
        CastoreError,
        ChainError,
        CommitUncertainError,
        ConflictError,
        DurabilityError,
        EffectError,
        EffectNotReadyError,
        EncodingError,
        EnvironmentDriftError,
        FormatVersionError,
        IllegalHistoryError,
        IllegalTransitionError,
        IntegrityError,
        InvalidObjectIdError,
        InvalidTaskIdError,
        KeylessEffectError,
        MalformedFrontierError,
        ObjectCorruptError,
        ObjectMissingError,
        OutcomeUnknownError,
        PayloadError,
        PlanDriftError,
        PlanTooLongError,
        ReplayDriftError,
        ResumeRefusedError,
        SecretInPayloadError,
        SnapshotTooLargeError,
        StepInFlightError,
        StepRepeatedError,
        StoreError,
        StoreExistsError,
        StoreIOError,
        StoreNotFoundError,
        TaskBusyError,
        TaskExistsError,
        TaskNotFoundError,
        UnknownVersionError,
        UnsafeFileError,
        UsageError,
    )
    from castore.format.effects import (
        NOT_FOUND,
        Action,
        NextAction,
        Reconciled,
        Service,
        found,
        unknown,
    )
    from castore.format.envdigest import env_digest, tree_digest
    from castore.format.plans import head_digest, plan_id
    from castore.format.records import BlobRef, EffectState, Grown, Plan, Snapshot, Step, effect
    from castore.run.contract import Position
    from castore.run.journal import vouch
    from castore.run.run import Run
    from castore.run.settings import derive_key, derive_step_key
    from castore.store import Store

__version__ = "0.2.0.dev0"

__all__ = [
    "NOT_FOUND",
    "Action",
    "BlobRef",
    "CastoreError",
    "ChainError",
    "CommitUncertainError",
    "ConflictError",
    "DurabilityError",
    "EffectError",
    "EffectNotReadyError",
    "EffectState",
    "EncodingError",
    "EnvironmentDriftError",
    "FormatVersionError",
    "Grown",
    "IllegalHistoryError",
    "IllegalTransitionError",
    "IntegrityError",
    "InvalidObjectIdError",
    "InvalidTaskIdError",
    "KeylessEffectError",
    "MalformedFrontierError",
    "NextAction",
    "ObjectCorruptError",
    "ObjectMissingError",
    "OutcomeUnknownError",
    "PayloadError",
    "Plan",
    "PlanDriftError",
    "PlanTooLongError",
    "Position",
    "RawRef",
    "Reconciled",
    "ReplayDriftError",
    "ResumeRefusedError",
    "Run",
    "SecretInPayloadError",
    "Service",
    "Snapshot",
    "SnapshotTooLargeError",
    "Step",
    "StepInFlightError",
    "StepRepeatedError",
    "Store",
    "StoreError",
    "StoreExistsError",
    "StoreIOError",
    "StoreNotFoundError",
    "TaskBusyError",
    "TaskExistsError",
    "TaskNotFoundError",
    "Tree",
    "TreeRef",
    "UnknownVersionError",
    "UnsafeFileError",
    "UsageError",
    "__version__",
    "derive_key",
    "derive_step_key",
    "effect",
    "env_digest",
    "found",
    "head_digest",
    "plan_id",
    "tree_digest",
    "unknown",
    "vouch",
]

# Each public name -> the module that defines it, imported on first use.
_WHERE: dict[str, str] = {
    "RawRef": "castore.chain.trees",
    "Tree": "castore.chain.trees",
    "TreeRef": "castore.chain.trees",
    "CastoreError": "castore.errors",
    "ChainError": "castore.errors",
    "CommitUncertainError": "castore.errors",
    "ConflictError": "castore.errors",
    "DurabilityError": "castore.errors",
    "EffectError": "castore.errors",
    "EffectNotReadyError": "castore.errors",
    "EncodingError": "castore.errors",
    "EnvironmentDriftError": "castore.errors",
    "FormatVersionError": "castore.errors",
    "IllegalHistoryError": "castore.errors",
    "IllegalTransitionError": "castore.errors",
    "IntegrityError": "castore.errors",
    "InvalidObjectIdError": "castore.errors",
    "InvalidTaskIdError": "castore.errors",
    "KeylessEffectError": "castore.errors",
    "MalformedFrontierError": "castore.errors",
    "ObjectCorruptError": "castore.errors",
    "ObjectMissingError": "castore.errors",
    "OutcomeUnknownError": "castore.errors",
    "PayloadError": "castore.errors",
    "PlanDriftError": "castore.errors",
    "PlanTooLongError": "castore.errors",
    "ReplayDriftError": "castore.errors",
    "ResumeRefusedError": "castore.errors",
    "SecretInPayloadError": "castore.errors",
    "SnapshotTooLargeError": "castore.errors",
    "StepInFlightError": "castore.errors",
    "StepRepeatedError": "castore.errors",
    "StoreError": "castore.errors",
    "StoreExistsError": "castore.errors",
    "StoreIOError": "castore.errors",
    "StoreNotFoundError": "castore.errors",
    "TaskBusyError": "castore.errors",
    "TaskExistsError": "castore.errors",
    "TaskNotFoundError": "castore.errors",
    "UnknownVersionError": "castore.errors",
    "UnsafeFileError": "castore.errors",
    "UsageError": "castore.errors",
    "NOT_FOUND": "castore.format.effects",
    "Action": "castore.format.effects",
    "NextAction": "castore.format.effects",
    "Reconciled": "castore.format.effects",
    "Service": "castore.format.effects",
    "found": "castore.format.effects",
    "unknown": "castore.format.effects",
    "env_digest": "castore.format.envdigest",
    "tree_digest": "castore.format.envdigest",
    "head_digest": "castore.format.plans",
    "plan_id": "castore.format.plans",
    "BlobRef": "castore.format.records",
    "EffectState": "castore.format.records",
    "Grown": "castore.format.records",
    "Plan": "castore.format.records",
    "Snapshot": "castore.format.records",
    "Step": "castore.format.records",
    "effect": "castore.format.records",
    "Position": "castore.run.contract",
    "vouch": "castore.run.journal",
    "Run": "castore.run.run",
    "derive_key": "castore.run.settings",
    "derive_step_key": "castore.run.settings",
    "Store": "castore.store",
}


def __getattr__(name: str) -> Any:
    """A public name's value, importing its module the first time it is asked for."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'castore' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain global, no call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
