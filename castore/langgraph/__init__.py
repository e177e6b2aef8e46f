"""castore inside LangGraph (the optional extra castore[langgraph]): tools that never run twice.

`import castore` never loads this package; import it as `castore.langgraph`.
"""

from castore.langgraph.durability import UnsafeDurabilityError
from castore.langgraph.tool import durable_tool

__all__ = ["UnsafeDurabilityError", "durable_tool"]
