"""What the sample agents (castore.lab.agent, castore.lab.agent_async) share: the plan, the
prompt, the names of their steps and the plain tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import castore
from castore import crashpoints
from castore.lab import fakemodel
from castore.lab.fakemodel import Message

PLAN = castore.Plan.grow("agent")
MAX_TURNS = 32  # a model that never answers is a bug, not a long task
TOOL_FUNCTIONS: dict[str, Callable[[str], dict[str, Any]]] = {
    "lookup": fakemodel.lookup,
    "stock": fakemodel.stock,
}


def prompt(task: str) -> list[Message]:
    """The conversation a task starts from."""
    return [{"role": "user", "content": f"work through order {task} with the tools you have"}]


def think_step(turn: int) -> str:
    return f"think-{turn}"


def act_step(turn: int, tool: str) -> str:
    return f"act-{turn}-{tool}"


def use_tool(tool: str, sku: str) -> dict[str, Any]:
    """A plain tool call (journaled by run.call like the model's)."""
    result = TOOL_FUNCTIONS[tool](sku)
    crashpoints.reach("agent.tool_returned")
    return {"tool": tool, **result}
