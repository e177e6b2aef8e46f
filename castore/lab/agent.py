"""The crash lab's sample agent: a model decides each next action, an unknown number of times.

    python -m castore.lab.agent --store S --task T --service URL --mode lookup --seed 7 \\
        --model-log model.jsonl [--async]

Each position of the loop is one journaled model call (`run.call`: billed once, its reply
recorded), then the action it chose: a plain tool through `run.call`, or an effect through
`run.perform` against the lab's fake service, declared per service mode. The last reply is
the answer: recorded with `run.append`, then `run.finish()`. A resumed agent replays the
recorded positions without calling the model or the service again. Exit status as the sample
worker's (castore.lab.worker): 0 finished, 2 refused, 3 interrupted, 4 lost a race, 6 an
effect's outcome is unknown (a person must resolve it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import castore
from castore import crashpoints
from castore.lab import worker
from castore.lab.agent_steps import MAX_TURNS, PLAN, act_step, prompt, think_step, use_tool
from castore.lab.fakemodel import FakeModel, Message, Reply
from castore.lab.service import ServiceClient, ServiceError


def thinker(model: FakeModel) -> Callable[[str, str, list[Message]], Reply]:
    """The journaled model call; a kill at agent.model_answered is a call billed, not recorded."""

    def think(task: str, step: str, messages: list[Message]) -> Reply:
        reply = model.complete(task, step, messages)
        crashpoints.reach("agent.model_answered")
        return reply

    return think


def sender(client: ServiceClient, op: str, args: dict[str, Any]) -> Callable[[str], str]:
    """An effect's request, sent with the key castore hands over."""

    def send(key: str) -> str:
        return client.apply(key, op, args)

    return send


def _given(reply: Reply, *_: object) -> Reply:
    return reply


def run_agent(
    run: castore.Run,
    model: FakeModel,
    client: ServiceClient,
    declared: dict[str, castore.Service],
    *,
    pay_first: bool = False,
) -> dict[str, Any]:
    """Drive the loop to its answer; every position already recorded is replayed, not redone.

    `pay_first` makes a broken agent that asks the model before castore can answer from the
    journal, so every replay pays again: it exists to prove the campaign catches re-billed
    calls. Never do this."""
    messages = prompt(run.task_id)
    think = thinker(model)
    for turn in range(MAX_TURNS):
        step = think_step(turn)
        if pay_first:
            paid = think(run.task_id, step, messages)
            reply = run.call(step, functools.partial(_given, paid), run.task_id, step, messages)
        else:
            reply = run.call(step, think, run.task_id, step, messages)
        crashpoints.reach("agent.thought")
        messages.append({"role": "assistant", "content": reply})
        if "answer" in reply:
            answer: dict[str, Any] = reply["answer"]
            run.append("answer", answer)
            crashpoints.reach("agent.answered")
            run.finish()
            return answer
        tool, args = reply["tool"], reply["args"]
        if tool in declared:
            receipt = run.perform(act_step(turn, tool), declared[tool], sender(client, tool, args))
            observation: dict[str, Any] = {"tool": tool, "receipt": receipt}
        else:
            observation = run.call(act_step(turn, tool), use_tool, tool, args["sku"])
        crashpoints.reach("agent.acted")
        messages.append({"role": "tool", "content": observation})
    raise RuntimeError(f"the model of {run.task_id!r} gave no answer in {MAX_TURNS} turns")


def run_task(
    store: castore.Store,
    task: str,
    model: FakeModel,
    client: ServiceClient,
    declared: dict[str, castore.Service],
    *,
    pay_first: bool = False,
) -> dict[str, Any]:
    """Open (or resume) `task` and run the agent to its answer."""
    with store.open_task(task, PLAN) as run:
        return run_agent(run, model, client, declared, pay_first=pay_first)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--service", required=True, help="base URL of the fake service")
    parser.add_argument("--mode", choices=("idempotent", "lookup", "none"), required=True)
    parser.add_argument("--seed", required=True, help="the fake model's seed")
    parser.add_argument("--model-log", required=True, help="the fake model's bill (JSON lines)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the model's answer time")
    parser.add_argument("--async", dest="use_async", action="store_true", help="asyncio agent")
    parser.add_argument("--pay-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pay_first and args.use_async:
        parser.error("--pay-first is a broken sync agent only; leave out --async")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = ServiceClient(args.service, timeout=10.0)
    model = FakeModel(args.seed, args.model_log, latency_s=args.latency_ms / 1000)
    store = castore.Store.open(args.store, create=True)
    declared = worker.services(client, args.mode)
    print("ready", flush=True)
    try:
        if args.use_async:
            from castore.lab import agent_async  # noqa: PLC0415 - only the async agent needs it

            answer = asyncio.run(agent_async.run_task(store, args.task, model, client, declared))
        else:
            answer = run_task(store, args.task, model, client, declared, pay_first=args.pay_first)
        print(json.dumps({"answer": answer}, sort_keys=True), flush=True)
    except castore.OutcomeUnknownError as exc:
        print(f"unresolved: {exc.step} {exc.key}", flush=True)
        return worker.EXIT_UNKNOWN
    except castore.ConflictError:
        return worker.EXIT_CONFLICT
    except castore.ResumeRefusedError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return worker.EXIT_REFUSED
    except ServiceError as exc:
        print(f"interrupted: {type(exc).__name__}: {exc}", flush=True)
        return worker.EXIT_INTERRUPTED
    finally:
        model.close()
    return worker.EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
