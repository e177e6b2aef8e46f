"""A sample agent worker: an order with three effects, using only castore's public API.

    python -m castore.lab.worker --store S --task T --service URL --mode lookup

Steps: quote → charge (effect: payments) → reserve → ship (effect: shipping) → notify
(effect: email) → summary. Later steps use earlier results and receipts, so a resumed run
must get them back exactly. Exit status: 0 finished, 3 interrupted (a service call failed;
run again), 4 lost a commit race, or another copy held the task past the lock's wait (run
again; the wait is told on stderr as it begins), 6 an effect's outcome is unknown (a person
must resolve it), 2 refused (drift or a broken chain).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import castore
from castore import NOT_FOUND, Reconciled, Service, found, unknown
from castore.lab.service import ServiceClient, ServiceError

EXIT_DONE, EXIT_REFUSED, EXIT_INTERRUPTED, EXIT_CONFLICT, EXIT_UNKNOWN = 0, 2, 3, 4, 6

PLAN = castore.Plan.build(
    "order",
    "quote",
    castore.effect("charge", "quote"),
    castore.Step("reserve", after=("charge",)),
    castore.effect("ship", "reserve"),
    castore.effect("notify", "ship"),
    castore.Step("summary", after=("notify",)),
)
EFFECTS = ("charge", "ship", "notify")
RETENTION_S = 24 * 3600


def services(client: ServiceClient, mode: str, *, blind: bool = False) -> dict[str, Service]:
    """How each effect's service is declared for a service mode.

    `blind` misdeclares the service as deduplicating when it does not: a resubmission is then
    sent blindly. It exists to prove the campaign catches duplicates; never do this.
    """

    def lookup(key: str) -> Reconciled:
        try:
            receipt = client.lookup(key)
        except ServiceError as exc:
            return unknown(str(exc))
        return NOT_FOUND if receipt is None else found(receipt)

    def declare(name: str) -> Service:
        if blind:
            return Service(name, idempotent=True, retention=RETENTION_S * 365)
        if mode == "idempotent":
            return Service(name, idempotent=True, retention=RETENTION_S)
        if mode == "lookup":
            return Service(name, reconcile=lookup)
        return Service(name)

    return {"charge": declare("payments"), "ship": declare("shipping"), "notify": declare("email")}


def plain_result(run: castore.Run, step: str, order: dict[str, Any]) -> Any:
    """The deterministic result of a plain step, from the order and earlier results."""
    if step == "quote":
        return {"amount": order["qty"] * order["price"], "currency": "EUR"}
    if step == "reserve":
        return {
            "slot": f"bay-{run.result('quote')['amount'] % 7}",
            "charged": run.receipt("charge"),
        }
    if step == "summary":
        return {
            "amount": run.result("quote")["amount"],
            "slot": run.result("reserve")["slot"],
            "receipts": {name: run.receipt(name) for name in EFFECTS},
        }
    raise KeyError(step)


def payload(run: castore.Run, step: str, order: dict[str, Any]) -> dict[str, Any]:
    """What each effect sends: built from earlier results, identical on every attempt."""
    if step == "charge":
        return {"amount": run.result("quote")["amount"], "customer": order["customer"]}
    if step == "ship":
        return {"slot": run.result("reserve")["slot"], "items": order["qty"]}
    return {"to": order["customer"], "charge": run.receipt("charge"), "ship": run.receipt("ship")}


def sender(client: ServiceClient, step: str, body: dict[str, Any]) -> Callable[[str], str]:
    """The request of one effect: sent with the idempotency key castore hands over."""

    def send(key: str) -> str:
        return client.apply(key, step, body)

    return send


def work(
    run: castore.Run, client: ServiceClient, declared: dict[str, Service], order: dict[str, Any]
) -> None:
    """Run every remaining step; effects go through run.perform (the next-action table)."""
    for step in run.pending():
        if step in declared:
            run.perform(step, declared[step], sender(client, step, payload(run, step, order)))
        else:
            run.commit_step(step, plain_result(run, step, order))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--service", required=True, help="base URL of the fake service")
    parser.add_argument("--mode", choices=("idempotent", "lookup", "none"), required=True)
    parser.add_argument("--blind-resubmit", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    order = {"customer": f"cust-{args.task}", "qty": 3, "price": 1250}
    client = ServiceClient(args.service, timeout=10.0)
    store = castore.Store.open(args.store, create=True)
    print("ready", flush=True)
    try:
        with store.open_task(args.task, PLAN) as run:
            work(run, client, services(client, args.mode, blind=args.blind_resubmit), order)
            print(json.dumps({"done": run.result("summary")}, sort_keys=True), flush=True)
    except castore.OutcomeUnknownError as exc:
        print(f"unresolved: {exc.step} {exc.key}", flush=True)
        return EXIT_UNKNOWN
    except castore.ConflictError:
        return EXIT_CONFLICT
    except castore.TaskBusyError as exc:  # another copy of this task still runs: run again
        print(f"busy: {exc}", file=sys.stderr)
        return EXIT_CONFLICT
    except castore.ResumeRefusedError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ServiceError as exc:
        print(f"interrupted: {type(exc).__name__}: {exc}", flush=True)
        return EXIT_INTERRUPTED
    return EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
