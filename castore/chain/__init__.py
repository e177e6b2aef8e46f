"""A task's history: write-once objects, chain slots and their commit point, the sealed
mark, packs, trees, verification of a chain from HEAD to its plan root, outcomes, sealing,
and HEAD read alone for status and briefs.

May import: castore.medium, castore.format, castore.errors, castore.crashpoints.
"""
