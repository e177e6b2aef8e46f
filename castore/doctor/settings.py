"""What the doctor's probes are tuned by: rounds and timeouts. The probes read them here when
they run, so a test or a caller that sets them (castore.doctor.settings.RACE_ROUNDS = 5)
changes the next run."""

RACE_ROUNDS = 50
"""Rounds of each two-process race (O_CREAT|O_EXCL, and link())."""

STALE_READ_TIMEOUT = 2.0
"""Seconds a race winner's file that reads empty (a client's stale cache) is read again."""

VISIBILITY_TIMEOUT = 3.0
"""Seconds a change made through one path may take to show through the other."""

WORKER_TIMEOUT = 20.0
"""Seconds a helper process may take to answer before the check fails."""
