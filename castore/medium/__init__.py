"""The storage seam: what the rest of castore needs from a place that holds objects and
chain slots (exclusive create, read, list, remove, flush), and the POSIX directory that is
its one implementation today, with its flush policy and task lock.

May import: castore.format, castore.errors, castore.crashpoints. Nothing above it.
"""
