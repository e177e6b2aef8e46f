"""Keeping a store healthy: gc, fsck (read-only), upgrade, retention and the reclaim of
forgotten tasks. Each works on a whole store opened through castore.store.

May import: castore.store and everything below it. Never an adapter.
"""
