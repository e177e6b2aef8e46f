"""Doctor: probe whether a directory's filesystem gives castore the guarantees it relies on
(public: run_doctor, DoctorReport, Check; tuning in castore.doctor.settings).

May import: castore.medium and everything below it; the probes use the filesystem directly,
since what they test is the filesystem itself.
"""

from __future__ import annotations

from castore.doctor.report import Check, DoctorReport
from castore.doctor.runner import run_doctor

__all__ = ["Check", "DoctorReport", "run_doctor"]
