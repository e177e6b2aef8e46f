"""castore inside LangGraph (the optional extra castore[langgraph]): `CastoreSaver`, a
checkpointer whose every `put` is a durable castore commit, and `durable_tool`, tools that
never run twice.

`import castore` never loads this package; import it as `castore.langgraph`.

May import: castore.store, castore.run and what is below them, castore.aio and the lab (its
campaigns); it is the only importer of langgraph and langchain.
"""

from __future__ import annotations

from castore.langgraph.durability import UnsafeDurabilityError
from castore.langgraph.saver import CastoreSaver
from castore.langgraph.tool import durable_tool

__all__ = ["CastoreSaver", "UnsafeDurabilityError", "durable_tool"]
