"""A scripted fake model for the crash lab: deterministic given a seed, billed in its own log.

`FakeModel(seed, log).complete(task, step, messages)` answers the next action of an agent loop:
a plain tool call, an effect against the lab's fake service, or the final answer. What it
answers depends only on the seed and on what the tools returned (never on receipts, which the
service makes up), so an interrupted run and an uninterrupted one with the same seed end with
the same answer. How many actions a conversation takes is up to the script (1 to 7).

Every call it serves is appended to its log, one JSON line fsynced before the answer is
returned (task, step, a digest of the messages, pid): the bill. A campaign counts re-billed
calls from that file, not from castore. Like the fake service, this module imports nothing
from castore: it must not share bugs with the code it judges.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

Message = dict[str, Any]
Reply = dict[str, Any]

TOOLS = ("lookup", "stock")  # plain tool calls: pure functions of their arguments
EFFECTS = ("charge", "ship", "notify")  # effects: the fake service's operations
MAX_ACTIONS = 7


def messages_digest(messages: list[Message]) -> str:
    """sha256 of the canonical JSON of a conversation: what the log bills a call for."""
    data = json.dumps(messages, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(data.encode()).hexdigest()


def script(seed: str) -> list[str]:
    """The actions the model will take for `seed`, in order (the answer comes after them)."""
    rng = random.Random(f"castore-fakemodel/{seed}")  # noqa: S311 - a script, not crypto
    actions = [rng.choice(TOOLS) for _ in range(rng.randint(1, MAX_ACTIONS - len(EFFECTS)))]
    # Effects land after at least one lookup, so their payloads depend on a tool's result.
    actions[0] = "lookup"
    for effect in EFFECTS:
        if rng.random() < 0.6:
            actions.insert(rng.randint(1, len(actions)), effect)
    return actions


def lookup(sku: str) -> dict[str, Any]:
    """The plain tool `lookup`: a price, a pure function of the sku."""
    return {"sku": sku, "price": 10 + int(hashlib.sha256(sku.encode()).hexdigest()[:6], 16) % 90}


def stock(sku: str) -> dict[str, Any]:
    """The plain tool `stock`: units on hand, a pure function of the sku."""
    return {"sku": sku, "units": int(hashlib.sha256(b"stock/" + sku.encode()).hexdigest()[:4], 16)}


def _facts(messages: list[Message]) -> list[dict[str, Any]]:
    """What the tools returned so far, receipts left out (the service makes them up)."""
    facts = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, dict):
            facts.append({k: v for k, v in sorted(content.items()) if k != "receipt"})
    return facts


def decide(seed: str, messages: list[Message]) -> Reply:
    """The reply to `messages` under `seed`: {"tool", "args"} or {"answer"}."""
    turn = sum(1 for message in messages if message.get("role") == "assistant")
    tools_seen = sum(1 for message in messages if message.get("role") == "tool")
    if tools_seen != turn:
        raise ValueError(
            f"conversation out of step: {turn} replies but {tools_seen} tool results; "
            "append each action's result before asking again"
        )
    actions = script(seed)
    facts = _facts(messages)
    rng = random.Random(f"castore-fakemodel/{seed}/{turn}")  # noqa: S311 - a script
    if turn >= len(actions):
        total = sum(int(fact.get("price", 0)) for fact in facts)
        units = sum(int(fact.get("units", 0)) for fact in facts)
        done = [str(fact["tool"]) for fact in facts if "tool" in fact]
        text = f"{len(facts)} actions ({', '.join(done)}); priced {total}; {units} units seen"
        return {"answer": {"text": text, "facts": facts}}
    action = actions[turn]
    skus = [str(fact["sku"]) for fact in facts if "sku" in fact]
    if action in TOOLS:
        return {"tool": action, "args": {"sku": f"sku-{rng.randint(1, 500)}"}}
    prices = sum(int(fact.get("price", 0)) for fact in facts)
    if action == "charge":
        args: dict[str, Any] = {"amount": prices, "customer": f"cust-{rng.randint(1, 99)}"}
    elif action == "ship":
        args = {"items": skus, "bay": f"bay-{prices % 7}"}
    else:
        args = {"text": f"order of {len(skus)} item(s), {prices} EUR"}
    return {"tool": action, "args": args}


class ModelLog:
    """The model's bill: an append-only JSON-lines file, each line fsynced before the answer."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        _cut_torn_tail(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, entry: dict[str, Any]) -> None:
        """Write one whole line (one write: O_APPEND keeps it in one piece) and fsync it."""
        line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):
            raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
        os.fsync(self._fd)

    def close(self) -> None:
        """Release the file descriptor."""
        os.close(self._fd)


def _cut_torn_tail(path: Path) -> None:
    # A process killed mid-write leaves a line without its newline; the next append must not
    # glue itself onto it, or a whole call would go unread.
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    end = data.rfind(b"\n") + 1
    if end < len(data):
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)


def read_model_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every call the log bills, in order; a torn final line (a kill mid-write) is ignored."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return [json.loads(line) for line in lines if line]


class FakeModel:
    """The scripted model. `latency_s` stands for the time a real model takes to answer: the
    window in which a kill finds a call billed but its result not yet committed."""

    def __init__(self, seed: str, log: str | os.PathLike[str], *, latency_s: float = 0.0) -> None:
        self.seed = seed
        self.latency_s = latency_s
        self._log = ModelLog(log)

    def complete(self, task: str, step: str, messages: list[Message]) -> Reply:
        """Answer the conversation; the call is billed (logged, fsynced) before it returns."""
        reply = decide(self.seed, messages)
        if self.latency_s:
            time.sleep(self.latency_s)
        self._bill(task, step, messages)
        return reply

    async def acomplete(self, task: str, step: str, messages: list[Message]) -> Reply:
        """`complete` for an event loop: the latency and the fsync happen off the loop."""
        reply = decide(self.seed, messages)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        await asyncio.to_thread(self._bill, task, step, messages)
        return reply

    def _bill(self, task: str, step: str, messages: list[Message]) -> None:
        entry = {"task": task, "step": step, "args": messages_digest(messages), "pid": os.getpid()}
        self._log.append(entry)

    def close(self) -> None:
        """Close the log."""
        self._log.close()
