"""Bytes and names, no I/O: the canonical encoding, records, ids and digests, the
layout of a store's names, and the pure rules a chain must keep (links, history, effects,
growing plans, the secret guard).

May import: castore.errors, castore.crashpoints, and the third-party codecs it wraps
(msgspec, cattrs, blake3: each in one module). Nothing above it.
"""
