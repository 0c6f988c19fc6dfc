"""Where results go to stay: result sinks read the ``results`` and ``failures`` streams through
a Redis consumer group each, write entries durably (rotating files, PostgreSQL), acknowledge
them only then, and trim the streams below what every sink has acknowledged.

May import: ``common.core``, ``common.store``.
"""
