"""The crash lab: a fake remote service, a sample worker and crash campaigns."""
