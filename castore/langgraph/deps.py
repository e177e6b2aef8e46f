"""The only castore module that imports LangGraph or LangChain: every other module of
castore.langgraph takes these names from here, so `import castore` never needs them and a
missing extra fails in one place, with one message."""

from __future__ import annotations

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "castore.langgraph needs LangGraph: pip install 'castore[langgraph]'"
    ) from exc

__all__ = [
    "WRITES_IDX_MAP",
    "BaseCheckpointSaver",
    "ChannelVersions",
    "Checkpoint",
    "CheckpointMetadata",
    "CheckpointTuple",
    "PendingWrite",
    "RunnableConfig",
    "SerializerProtocol",
    "get_checkpoint_id",
    "get_checkpoint_metadata",
    "writes_sort_key",
]
