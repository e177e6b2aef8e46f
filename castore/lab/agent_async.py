"""The sample agent on castore.aio: the loop of castore.lab.agent with every call awaited.

The model answers through `acomplete` (its latency and its fsync off the event loop), plain
tools are journaled with `arun.call`, effects go through `arun.perform` with an async send
(the blocking client runs in a thread), and the answer is appended before `arun.finish()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import castore
from castore import crashpoints
from castore.aio import AsyncRun, AsyncStore
from castore.lab.agent_steps import MAX_TURNS, PLAN, act_step, prompt, think_step, use_tool
from castore.lab.fakemodel import FakeModel, Message, Reply
from castore.lab.service import ServiceClient


def thinker(model: FakeModel) -> Callable[[str, str, list[Message]], Awaitable[Reply]]:
    """The journaled model call; a kill at agent.model_answered is a call billed, not recorded."""

    async def think(task: str, step: str, messages: list[Message]) -> Reply:
        reply = await model.acomplete(task, step, messages)
        crashpoints.reach("agent.model_answered")
        return reply

    return think


def sender(client: ServiceClient, op: str, args: dict[str, Any]) -> Callable[[str], Awaitable[str]]:
    """An effect's request, sent with the key castore hands over, without blocking the loop."""

    async def send(key: str) -> str:
        return await asyncio.to_thread(client.apply, key, op, args)

    return send


async def run_agent(
    arun: AsyncRun,
    model: FakeModel,
    client: ServiceClient,
    declared: dict[str, castore.Service],
) -> dict[str, Any]:
    """Drive the loop to its answer; every position already recorded is replayed, not redone."""
    task = arun.task_id
    messages = prompt(task)
    think = thinker(model)
    for turn in range(MAX_TURNS):
        step = think_step(turn)
        reply = await arun.call(step, think, task, step, messages)
        crashpoints.reach("agent.thought")
        messages.append({"role": "assistant", "content": reply})
        if "answer" in reply:
            answer: dict[str, Any] = reply["answer"]
            await arun.append("answer", answer)
            crashpoints.reach("agent.answered")
            await arun.finish()
            return answer
        tool, args = reply["tool"], reply["args"]
        act = act_step(turn, tool)
        if tool in declared:
            receipt = await arun.perform(act, declared[tool], sender(client, tool, args))
            observation: dict[str, Any] = {"tool": tool, "receipt": receipt}
        else:
            observation = await arun.call(act, use_tool, tool, args["sku"])
        crashpoints.reach("agent.acted")
        messages.append({"role": "tool", "content": observation})
    raise RuntimeError(f"the model of {task!r} gave no answer in {MAX_TURNS} turns")


async def run_task(
    store: castore.Store,
    task: str,
    model: FakeModel,
    client: ServiceClient,
    declared: dict[str, castore.Service],
) -> dict[str, Any]:
    """Open (or resume) `task` on an AsyncStore and run the agent to its answer."""
    async with AsyncStore(store) as astore, await astore.open_task(task, PLAN) as arun:
        return await run_agent(arun, model, client, declared)
