"""Doctor: probe whether a directory's filesystem gives castore the guarantees it relies on."""

from __future__ import annotations

from castore.doctor.report import Check, DoctorReport
from castore.doctor.runner import run_doctor

__all__ = ["Check", "DoctorReport", "run_doctor"]

# The probes read these through the package when they run, so setting them here takes effect.
RACE_ROUNDS = 50
"""Rounds of each two-process race (O_CREAT|O_EXCL, and link())."""

STALE_READ_TIMEOUT = 2.0
"""Seconds a race winner's file that reads empty (a client's stale cache) is read again."""

VISIBILITY_TIMEOUT = 3.0
"""Seconds a change made through one path may take to show through the other."""

WORKER_TIMEOUT = 20.0
"""Seconds a helper process may take to answer before the check fails."""
