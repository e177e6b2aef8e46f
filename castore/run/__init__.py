"""Every writer of a task: the run (commit a step, the replay of an agent's decisions,
journaled calls), the side-effect protocol and its in-flight rule, the resumption gate, a
person's decisions, the brief, forget and fork.

May import: castore.chain and everything below it. Never castore.store or above.
"""
