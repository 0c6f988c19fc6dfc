"""The worker's pipeline: the I/O loop and its ack bookkeeping, what happens to one message,
HTML parsing, heartbeats and metrics.

May import: every room but ``common.sink`` and ``common.ops``.
"""
