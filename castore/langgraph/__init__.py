"""castore inside LangGraph: `CastoreSaver`, a checkpointer whose every `put` is a durable
castore commit (install the extra: `pip install 'castore[langgraph]'`)."""

from __future__ import annotations

from castore.langgraph.saver import CastoreSaver

__all__ = ["CastoreSaver"]
