"""The one module that imports langgraph and langchain (the optional extra castore[langgraph]).

Every other castore.langgraph module takes these names from here, so that a missing extra is
one clear ImportError at one place and `import castore` never loads either library.
"""

from __future__ import annotations

from typing import Any

try:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import (
        BaseTool,
        InjectedToolCallId,
        StructuredTool,
        create_schema_from_function,
    )
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
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command, interrupt
except ImportError as exc:  # pragma: no cover - depends on how castore was installed
    raise ImportError(
        f"castore.langgraph needs the optional dependencies ({exc}); install them with "
        "`pip install 'castore[langgraph]'`"
    ) from exc

__all__ = [
    "END",
    "START",
    "WRITES_IDX_MAP",
    "AIMessage",
    "BaseChatModel",
    "BaseCheckpointSaver",
    "BaseMessage",
    "BaseTool",
    "ChannelVersions",
    "ChatGeneration",
    "ChatResult",
    "Checkpoint",
    "CheckpointMetadata",
    "CheckpointTuple",
    "Command",
    "InMemorySaver",
    "InjectedToolCallId",
    "JsonPlusSerializer",
    "MessagesState",
    "PendingWrite",
    "RunnableConfig",
    "SerializerProtocol",
    "StateGraph",
    "StructuredTool",
    "ToolMessage",
    "ToolNode",
    "create_schema_from_function",
    "get_checkpoint_id",
    "get_checkpoint_metadata",
    "interrupt",
    "sqlite_saver",
    "tools_condition",
    "writes_sort_key",
]


def sqlite_saver() -> Any:
    """LangGraph's SqliteSaver class (package langgraph-checkpoint-sqlite, in the extra
    castore[bench]): the crash campaign's baseline and some tests use it, castore does not."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise ImportError(
            f"the LangGraph campaign's baseline needs SqliteSaver ({exc}); install it with "
            "`pip install 'castore[bench]'` (langgraph-checkpoint-sqlite)"
        ) from exc
    return SqliteSaver
