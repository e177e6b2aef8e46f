"""The resume brief: what a resuming model reads to continue a task, bounded by a token budget
whatever the length of the history (issue 14, item 4).

Same state, same bytes: nothing in it depends on the wall clock (ages are counted to `now_ms`,
by default the time HEAD was written), on the store's path or on the order anything was read.
Every value castore did not write itself (a result, a receipt, a reason, a key, the plan name,
the environment anchor) is escaped when it holds anything non-printable and clipped to a
fixed number of bytes, so no content can forge a line or push the brief past its budget. A
result is shown inline only when it is small, printable and looks like no credential;
otherwise by reference. The token estimate is TOKEN_RULE of the whole text, that line included.
"""

from __future__ import annotations

import shlex
from typing import Any

from castore.chain import briefview
from castore.chain.briefview import TaskView
from castore.chain.outcomes import Outcome
from castore.chain.status import frontier_action
from castore.chain.verify import VerifiedChain, VerifiedHead
from castore.errors import UsageError
from castore.format import codec, guard
from castore.format.effects import NextAction, effect_action, span, when_text
from castore.format.model import attrs
from castore.format.plans import head_digest
from castore.format.records import EffectRecord, EffectState, TransitionKind
from castore.run.budget import DEFAULT_BUDGET, MIN_BUDGET, TOKEN_RULE
from castore.run.contract import RunView

INLINE_MAX = 160  # bytes of a result's canonical JSON shown inline
FORMAT = "castore-brief/1"
# The most bytes a value castore does not write itself takes in the text (escaped, then cut).
_WIDTH = {"task": 80, "name": 60, "step": 80, "key": 72, "reason": 100, "receipt": 80, "env": 100}
_CUT = "…"
# An optional item: the forms it may take, longest first, and its JSON fields.
_Item = tuple[list[list[str]], dict[str, Any]]


def estimate_tokens(text: str) -> int:
    """The brief's token estimate of `text`: ceil(UTF-8 bytes / 4)."""
    return -(-len(text.encode("utf-8")) // 4)


def shown(text: str, width: int) -> str:
    """`text` as the brief prints it: its repr if it holds anything non-printable (a line
    break would forge a line), then cut to at most `width` UTF-8 bytes, a cut marked with …"""
    safe = text if text.isprintable() else repr(text)
    raw = safe.encode("utf-8")
    if len(raw) <= width:
        return safe
    return raw[: width - len(_CUT.encode())].decode("utf-8", "ignore") + _CUT


def shown_value(text: str, width: int) -> str:
    """A value castore did not write (a receipt, a reason, an anchor) as `shown`, unless it
    looks like a credential: a field vouched for at commit is still not put in a prompt."""
    secret = guard.secret_value(text)
    return shown(text, width) if secret is None else f"(not shown: looks like {secret})"


@attrs.frozen
class Brief:
    """A task's resume brief: `text` for a model, `data` (JSON-able) for a program, and the
    token estimate of the text (TOKEN_RULE), never more than the budget it was made for."""

    text: str
    data: dict[str, Any]
    tokens: int

    def __str__(self) -> str:
        """The text, so that `print(run.brief())` prints the brief itself."""
        return self.text


def make_brief(
    source: VerifiedChain | TaskView | RunView,
    *,
    budget_tokens: int = DEFAULT_BUDGET,
    now_ms: int | None = None,
) -> Brief:
    """The brief of a verified chain, a run (its `Run.brief`) or a TaskView. Ages and the
    next actions are as of `now_ms` (default: the time HEAD was written, so the same state
    always gives the same bytes). UsageError for a budget below MIN_BUDGET."""
    if isinstance(source, VerifiedChain):
        source = briefview.view_of_chain(source)
    elif not isinstance(source, TaskView):
        made: Brief = source.brief(budget_tokens=budget_tokens, now_ms=now_ms)
        return made
    if type(budget_tokens) is not int or budget_tokens < MIN_BUDGET:
        raise UsageError(
            f"a brief's budget is a whole number of tokens, at least {MIN_BUDGET} (the lines "
            f"every brief has take up to that); {budget_tokens!r} is not"
        )
    return _Composer(source, budget_tokens, now_ms).compose()


def age_ms(record: EffectRecord, now_ms: int) -> int:
    """An open effect's age in a brief: `now_ms` minus its first submission (the writer's
    clock; the moment from which the service may have applied it, retention's origin too),
    or minus the time it was planned if it was never submitted; never negative (a
    submission dated after `now_ms` is clock skew, which the next action names)."""
    since = record.first_submitted_ms if record.first_submitted_ms is not None else record.since_ms
    return max(0, now_ms - since)


def resolve_commands(task: str, step: str) -> list[str]:
    """The two `castore resolve` commands a person chooses between for an UNRESOLVED effect."""
    where = f"castore resolve {shlex.quote(task)} {shlex.quote(step)}"
    return [f"{where} --confirmed RECEIPT", f"{where} --not-done --reason TEXT"]


class _Composer:
    """Lays a brief out: the lines every brief has, then as many of the optional items as the
    budget holds (UNRESOLVED effects first, then other open effects, then the newest steps)."""

    def __init__(self, view: TaskView, budget: int, now_ms: int | None) -> None:
        self.view = view
        self.head = view.head
        self.budget = budget
        self.now = self.head.time_ms if now_ms is None else now_ms
        self.given_now = now_ms is not None
        self.grows = self.head.grown is not None or view.plan.grows

    def compose(self) -> Brief:
        head, view = self.head, self.view
        data: dict[str, Any] = {
            "format": FORMAT,
            "task": view.task,
            "seq": head.seq,
            "head": view.head_id,
            "plan": self._plan_data(),
            "done": head.frontier.index,
            "finished": self._finished(),
        }
        next_line, data["next"] = self._next()
        data["env"] = None if head.env is None else shown_value(head.env, _WIDTH["env"])
        data["as_of_ms"] = self.now
        data["as_of"] = "given" if self.given_now else "head"
        first = [
            self._header(),
            self._plan_line(data["plan"]),
            self._done_line(data),
            next_line,
        ]
        last = [f"env anchor: {data['env'] or 'none recorded'}"]
        groups = {
            "unresolved": [self._unresolved(r) for r in self._records(unresolved=True)],
            "effects": [self._effect(r) for r in self._records(unresolved=False)],
            "recent": [self._recent(o) for o in view.recent],
        }
        return self._fit(data, first, last, groups)

    # -- the budget -------------------------------------------------------------------------
    def _fit(
        self,
        data: dict[str, Any],
        first: list[str],
        last: list[str],
        groups: dict[str, list[_Item]],
    ) -> Brief:
        limit = self.budget * 4
        counts = {name: len(items) for name, items in groups.items()}
        reserve = _size([self._footer(self.budget)]) + _size([_omitted_line(counts)])
        used = _size(first) + _size(last) + reserve
        if used > limit:  # MIN_BUDGET and the widths make this unreachable; said if not
            raise UsageError(
                f"task {self.view.task!r}: its brief needs {-(-used // 4)} tokens; give a "
                "larger budget"
            )
        chosen: dict[str, list[tuple[list[str], dict[str, Any]]]] = {}
        for name, items in groups.items():
            chosen[name] = []
            heading = _size([self._recent_heading(1)]) if name == "recent" else 0
            for forms, item_data in items:
                extra = heading if not chosen[name] else 0
                fits = [lines for lines in forms if used + _size(lines) + extra <= limit]
                if not fits:
                    break  # a list shown with a hole in it would mislead: the rest is counted
                used += _size(fits[0]) + extra
                chosen[name].append((fits[0], item_data))
        omitted = {name: counts[name] - len(chosen[name]) for name in groups}
        lines = list(first)
        for name in ("unresolved", "effects"):
            lines += [line for item in chosen[name] for line in item[0]]
        recent = list(reversed(chosen["recent"]))  # chosen newest first, shown oldest first
        if recent:
            lines.append(self._recent_heading(len(recent)))
            lines += [line for item in recent for line in item[0]]
        lines += last
        if any(omitted.values()):
            lines.append(_omitted_line(omitted))
        for name in groups:
            data[name] = [item[1] for item in (recent if name == "recent" else chosen[name])]
        data["omitted"] = omitted
        data["budget"] = self.budget
        data["token_rule"] = TOKEN_RULE
        # The estimate counts its own digits: from the budget down, each estimate is at most
        # the one before (fewer digits, fewer bytes), so this settles on one that holds.
        tokens = self.budget
        while True:
            text = "\n".join([*lines, self._footer(tokens)]) + "\n"
            if estimate_tokens(text) == tokens:
                break
            tokens = estimate_tokens(text)
        data["tokens"] = tokens
        return Brief(text, data, tokens)

    def _footer(self, tokens: int) -> str:
        when = "given" if self.given_now else "HEAD's time"
        return (
            f"as of {_when(self.now)} ({when}); {tokens} tokens estimated as "
            f"{TOKEN_RULE}, budget {self.budget}"
        )

    def _recent_heading(self, count: int) -> str:
        return f"last {count} of {self.head.frontier.index} done:"

    # -- the lines every brief has ------------------------------------------------------
    def _header(self) -> str:
        task = shown(self.view.task, _WIDTH["task"])
        return f"castore brief: task {task}, seq {self.head.seq}, head {self.view.head_id[:12]}"

    def _plan_data(self) -> dict[str, Any]:
        plan, head = self.view.plan, self.head
        grown = head.grown
        return {
            "name": shown_value(plan.name, _WIDTH["name"]),
            "digest": head_digest(head),
            "base": head.plan,
            "grows": self.grows,
            "steps": plan.steps + (grown.steps if grown is not None else 0),
            "decided": grown.steps if grown is not None else (0 if self.grows else None),
        }

    def _plan_line(self, plan: dict[str, Any]) -> str:
        if plan["grows"]:
            shape = f"growing, {plan['steps']} steps so far ({plan['decided']} decided as it ran)"
        else:
            shape = f"fixed, {plan['steps']} steps"
        return f"plan {plan['name']}: {shape}, digest {plan['digest']}"

    def _done_line(self, data: dict[str, Any]) -> str:
        of = "" if self.grows else f" of {data['plan']['steps']}"
        return f"done: {data['done']}{of} steps{', finished' if data['finished'] else ''}"

    def _finished(self) -> bool:
        head = self.head
        if head.transition.kind is TransitionKind.FORGET:
            return False
        if head.grown is not None:
            return head.grown.finished  # FINISH committed (a seal may follow it)
        return head.frontier.step is None and not head.effects

    def _next(self) -> tuple[str, dict[str, Any]]:
        """The `next:` line and its JSON: the frontier step and its one next action."""
        head = self.head
        step, index = head.frontier.step, head.frontier.index
        transition = head.transition
        if transition.kind is TransitionKind.FORGET:
            why = shown_value(
                f"forgotten at {_when(head.time_ms)} by {transition.who}: {transition.why}",
                _WIDTH["reason"] * 2,
            )
            return f"next: nothing, {why}", _next_data(None, None, index, "done", why)
        if step is None and self.grows and not self._finished():
            why = "the plan grows as the task runs: decide the next step, or finish the task"
            return f"next: {why}", _next_data(None, None, index, "decide", why)
        verified = VerifiedHead(self.view.task, head, self.view.head_id, self.view.clock)
        action = frontier_action(verified, self.now)
        reason = shown_value(action.reason, _WIDTH["reason"])
        if step is None:
            data = _next_data(None, None, index, action.action.value, reason)
            return "next: nothing, the task is finished", data
        record = head.effect(step)
        kind = f"effect {record.state.value}" if record is not None else "plain"
        line = (
            f"next: step {shown(step, _WIDTH['step'])} ({kind}, position {index}) -> "
            f"{action.action.value}: {reason}"
        )
        return line, _next_data(step, record is not None, index, action.action.value, reason)

    # -- the optional items ---------------------------------------------------------------
    def _records(self, *, unresolved: bool) -> list[EffectRecord]:
        if self.head.transition.kind is TransitionKind.FORGET:
            return []  # the task has ended: nothing is left to do about them (log shows them)
        return [r for r in self.head.effects if (r.state is EffectState.UNRESOLVED) == unresolved]

    def _effect_data(self, record: EffectRecord, action: NextAction) -> dict[str, Any]:
        return {
            "step": record.step,
            "state": record.state.value,
            "key": None if record.key is None else shown_value(record.key, _WIDTH["key"]),
            "age_ms": age_ms(record, self.now),
            "attempts": record.attempts,
            "action": action.action.value,
            "reason": shown_value(action.reason, _WIDTH["reason"]),
        }

    def _unresolved(self, record: EffectRecord) -> _Item:
        """Its commands in full if they fit, else the line that says where to find them."""
        action = effect_action(record, self.now, self.view.clock)
        data = self._effect_data(record, action)
        data["resolve"] = commands = resolve_commands(self.view.task, record.step)
        line = (
            f"UNRESOLVED effect {shown(record.step, _WIDTH['step'])}, key {data['key']}, "
            f"age {span(data['age_ms'])}"
        )
        if record.step != self.head.frontier.step:  # the frontier's is on the `next:` line
            line += f": {data['reason']}"
        full = [
            line,
            "  a person must ask the service what became of this key, then run one of:",
            # Never cut: a cut command is not the command. Ids are bounded (FORMAT.md 8.1).
            *(f"    {command if command.isprintable() else repr(command)}" for command in commands),
        ]
        short = [line, "  a person must ask the service, then `castore resolve` it (see --json)"]
        return [full, short], data

    def _effect(self, record: EffectRecord) -> _Item:
        action = effect_action(record, self.now, self.view.clock)
        data = self._effect_data(record, action)
        line = (
            f"effect {shown(record.step, _WIDTH['step'])} {data['state']}, key {data['key']}, "
            f"age {span(data['age_ms'])}, attempts {data['attempts']}"
        )
        if record.step != self.head.frontier.step:  # the frontier's is on the `next:` line
            line += f" -> {data['action']}: {data['reason']}"
        return [[line]], data

    def _recent(self, outcome: Outcome) -> _Item:
        data: dict[str, Any] = {"step": outcome.step, "seq": outcome.seq}
        where = f"castore show {shlex.quote(self.view.task)}@{outcome.seq}"
        if outcome.receipt is not None:
            data["receipt"] = shown_value(outcome.receipt, _WIDTH["receipt"])
            text = f"receipt {data['receipt']}"
        elif outcome.result_ref is not None:
            data["ref"] = outcome.result_ref
            text = f"result stored by reference: castore show {outcome.result_ref}"
        else:
            text = self._inline(outcome.result, data, where)
        return [[f"  {shown(outcome.step, _WIDTH['step'])} (seq {outcome.seq}): {text}"]], data

    @staticmethod
    def _inline(result: Any, data: dict[str, Any], where: str) -> str:
        encoded = codec.encode_value(result).decode("utf-8")
        secret = guard.secret_value(encoded)
        if len(encoded.encode()) <= INLINE_MAX and encoded.isprintable() and secret is None:
            data["result"] = result
            return encoded
        data["bytes"] = len(encoded.encode())
        data["show"] = where
        why = f"looks like {secret}" if secret else "too long to show"
        if secret is None and not encoded.isprintable():
            why = "holds non-printable characters"
        return f"result of {data['bytes']} bytes, not shown ({why}): {where}"


def _next_data(
    step: str | None, effect: bool | None, index: int, action: str, reason: str
) -> dict[str, Any]:
    return {"step": step, "effect": effect, "index": index, "action": action, "reason": reason}


def _when(time_ms: int) -> str:
    """A time as the brief prints it: UTC to the second (the number itself if out of range)."""
    try:
        return when_text(time_ms)
    except (OverflowError, OSError, ValueError):
        return f"{time_ms} ms after the epoch"


def _omitted_line(omitted: dict[str, int]) -> str:
    names = {"unresolved": "UNRESOLVED effects", "effects": "open effects", "recent": "done steps"}
    counts = ", ".join(f"{count} {names[name]}" for name, count in omitted.items() if count)
    return f"not shown for the budget: {counts} (castore status TASK, castore log TASK)"


def _size(lines: list[str]) -> int:
    return sum(len(line.encode("utf-8")) + 1 for line in lines)
