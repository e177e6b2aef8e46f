"""The castore error tree: every error castore raises is a `CastoreError`.

    CastoreError
    ├── UsageError (ValueError)                  the caller asked for something invalid
    │   ├── InvalidTaskIdError                   a task id that cannot become a safe file name
    │   ├── InvalidObjectIdError                 not 64 lowercase hex digits
    │   ├── EncodingError                        a value outside the canonical data model
    │   ├── StepRepeatedError                    a growing plan decides a step id it has
    │   ├── PlanTooLongError                     a growing plan past MAX_GROWN_STEPS
    │   ├── UnsafeDurabilityError                a LangGraph durability mode that can lose a
    │   │                                        tool call's id (castore.langgraph.durability)
    │   └── PayloadError                         a snapshot that must not be written
    │       ├── SecretInPayloadError             a field or value that looks like a credential
    │       ├── SnapshotTooLargeError            over the per-snapshot size budget
    │       └── ObjectTooLargeError              over the size limit of any one object
    ├── StoreError                               the store directory itself
    │   ├── StoreNotFoundError (FileNotFoundError)
    │   │   └── BucketNotFoundError              an s3:// store's bucket is not at the endpoint
    │   ├── StoreExistsError (FileExistsError)
    │   ├── ReadOnlyStoreError                   a write asked of a store opened for reading
    │   ├── FormatVersionError                   written by a format this reader does not know
    │   ├── UnsafeEndpointError                  an S3 endpoint that let a second exclusive
    │   │                                        create succeed, or was never checked
    │   └── StoreIOError (OSError)               a system call on a store path failed (errno)
    │       └── DurabilityError                  a write/fsync failed; nothing was published
    │           └── CommitUncertainError         the commit point was taken, its fsync failed
    ├── IntegrityError                           bytes on disk are not what they claim to be
    │   ├── ObjectMissingError (KeyError)
    │   ├── ObjectCorruptError                   hash mismatch, truncation, undecodable
    │   └── UnsafeFileError                      symlink, FIFO or directory where a file belongs
    │       └── OversizedFileError               larger than any file castore writes there
    ├── TaskNotFoundError (KeyError)
    ├── TaskExistsError
    ├── TaskForgottenError                       the task was forgotten: its id is not reused
    ├── ForgetRefusedError                       forget would drop an effect still in flight
    ├── ForkError                                the snapshot to fork from cannot be forked
    ├── TaskBusyError (TimeoutError)             another local worker holds the task's lock
    ├── ConflictError                            lost the compare-and-swap on a task's HEAD
    ├── ResumeRefusedError                       the resumption gate said no
    │   ├── ChainError (also IntegrityError)     HEAD → plan root does not verify
    │   │   └── IllegalHistoryError              hash-valid, but a link the protocol forbids
    │   ├── PlanDriftError                       the caller's plan is not the task's plan
    │   │   └── ReplayDriftError                 the agent asks, at a recorded position,
    │   │                                        for another step than the one recorded
    │   ├── EnvironmentDriftError                the live environment differs from the anchor
    │   ├── KeylessEffectError                   an in-flight effect without idempotency key
    │   └── MalformedFrontierError               frontier out of range, unknown step or version
    │       └── UnknownVersionError (also FormatVersionError)
    ├── EffectError
    │   ├── IllegalTransitionError               a state change the protocol does not allow
    │   ├── EffectNotReadyError                  the effect's next action is not what was asked
    │   └── OutcomeUnknownError                  the effect is UNRESOLVED: a person must decide
    ├── StepInFlightError                        a send or call of the step may still run, in
    │                                            this process or another one on this host
    └── WorkerFailedError                        an fsck worker process died before its results

Every message says what to do next. Structured fields (`path`, `task`, `expected`,
`actual`, ...) let callers act without parsing text.

The classes live in castore.errors.usage, .storage and .task; they are all here, and each says
it is castore.errors's (its `__module__`), so tracebacks and pickles name castore.errors.X.

May import: nothing of castore (every layer imports it).
"""

from castore.errors.storage import (
    BucketNotFoundError,
    CommitUncertainError,
    DurabilityError,
    FormatVersionError,
    IntegrityError,
    ObjectCorruptError,
    ObjectMissingError,
    OversizedFileError,
    ReadOnlyStoreError,
    StoreError,
    StoreExistsError,
    StoreIOError,
    StoreNotFoundError,
    UnsafeEndpointError,
    UnsafeFileError,
    io_advice,
)
from castore.errors.task import (
    ChainError,
    ConflictError,
    EffectError,
    EffectNotReadyError,
    EnvironmentDriftError,
    ForgetRefusedError,
    ForkError,
    IllegalHistoryError,
    IllegalTransitionError,
    KeylessEffectError,
    MalformedFrontierError,
    OutcomeUnknownError,
    PlanDriftError,
    ReplayDriftError,
    ResumeRefusedError,
    StepInFlightError,
    TaskBusyError,
    TaskExistsError,
    TaskForgottenError,
    TaskNotFoundError,
    UnknownVersionError,
    WorkerFailedError,
)
from castore.errors.usage import (
    CastoreError,
    EncodingError,
    InvalidObjectIdError,
    InvalidTaskIdError,
    ObjectTooLargeError,
    PayloadError,
    PlanTooLongError,
    SecretInPayloadError,
    SnapshotTooLargeError,
    StepRepeatedError,
    UsageError,
)

__all__ = [
    "BucketNotFoundError",
    "CastoreError",
    "ChainError",
    "CommitUncertainError",
    "ConflictError",
    "DurabilityError",
    "EffectError",
    "EffectNotReadyError",
    "EncodingError",
    "EnvironmentDriftError",
    "ForgetRefusedError",
    "ForkError",
    "FormatVersionError",
    "IllegalHistoryError",
    "IllegalTransitionError",
    "IntegrityError",
    "InvalidObjectIdError",
    "InvalidTaskIdError",
    "KeylessEffectError",
    "MalformedFrontierError",
    "ObjectCorruptError",
    "ObjectMissingError",
    "ObjectTooLargeError",
    "OutcomeUnknownError",
    "OversizedFileError",
    "PayloadError",
    "PlanDriftError",
    "PlanTooLongError",
    "ReadOnlyStoreError",
    "ReplayDriftError",
    "ResumeRefusedError",
    "SecretInPayloadError",
    "SnapshotTooLargeError",
    "StepInFlightError",
    "StepRepeatedError",
    "StoreError",
    "StoreExistsError",
    "StoreIOError",
    "StoreNotFoundError",
    "TaskBusyError",
    "TaskExistsError",
    "TaskForgottenError",
    "TaskNotFoundError",
    "UnknownVersionError",
    "UnsafeEndpointError",
    "UnsafeFileError",
    "UsageError",
    "WorkerFailedError",
    "io_advice",
]

for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type):
        _value.__module__ = __name__
