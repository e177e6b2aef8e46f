"""Who is writing: this host's name and a fresh random token, straight from `os`.

The same values `socket.gethostname()` and `secrets.token_hex()` give (the kernel's node
name; os.urandom), without importing socket and secrets, which with what they import
(hashlib, hmac, random) took about 10 to 20 ms of every command's start (issue 26).
"""

from __future__ import annotations

import os


def host_name() -> str:
    """This host's name, as `socket.gethostname()` says it (the kernel's node name)."""
    return os.uname().nodename


def token_hex(nbytes: int) -> str:
    """`nbytes` random bytes from the system's source, as hex (`secrets.token_hex`)."""
    return os.urandom(nbytes).hex()


def random_bits(bits: int) -> int:
    """A random int of `bits` bits from the system's source (`secrets.randbits`)."""
    return int.from_bytes(os.urandom((bits + 7) // 8), "big") >> (-bits % 8)
