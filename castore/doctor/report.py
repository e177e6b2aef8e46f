"""The doctor's report: one Check per probed property, and the DoctorReport as text or JSON."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Verdict = Literal["ok", "fail", "warn", "skip"]


@dataclasses.dataclass(frozen=True)
class Check:
    """One probe of one filesystem property."""

    name: str
    verdict: Verdict
    detail: str
    required: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """Every check `run_doctor` made, in the order it made them."""

    path: str
    peer: str | None
    checks: list[Check]

    @property
    def safe(self) -> bool:
        """True when no required check failed: castore's primitives hold here."""
        return not any(c.required and c.verdict == "fail" for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called `name` (KeyError if there is none)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "peer": self.peer,
            "safe": self.safe,
            "checks": [c.to_json() for c in self.checks],
        }

    def to_text(self) -> str:
        """A human-readable table, one check per line."""
        width = max((len(c.name) for c in self.checks), default=0)
        where = self.path if self.peer is None else f"{self.path} (peer {self.peer})"
        lines = [f"castore doctor: {where}"]
        for c in self.checks:
            tag = "" if c.required else " (info)"
            lines.append(f"  {c.verdict:<4}  {c.name:<{width}}  {c.detail}{tag}")
        failed = [c.name for c in self.checks if c.required and c.verdict == "fail"]
        if failed:
            lines.append(f"NOT SAFE for castore: {', '.join(failed)} failed")
        else:
            lines.append("safe for castore: every required check passed")
        return "\n".join(lines)
