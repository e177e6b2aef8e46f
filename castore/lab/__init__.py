"""The crash lab: a fake remote service, a sample worker, a sample agent with its scripted
model, and the crash campaigns that kill them."""
