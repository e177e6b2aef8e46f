"""The crash lab: a fake remote service, a sample worker, a sample agent with its scripted
model, and the crash campaigns that kill them.

May import: the public API (castore) and castore.aio, as a user's code would; the service
(castore.lab.service) imports nothing of castore at all.
"""
