"""How long gc leaves an unreachable object alone by default (castore.maintenance.gc): apart
so that the CLI's parser states it without importing gc."""

DEFAULT_GRACE_S = 14 * 86400
