"""The control plane: an HTTP API (FastAPI, OpenAPI at /api/docs) and a web UI over jobs,
results, dead letters, workers and queues, every call authenticated by a token.

May import: every room (it drives what the commands of ``common.ops`` drive).
"""
