"""Where results go to stay: result sinks read the ``results`` and ``failures`` streams through
a Redis consumer group each, write entries durably (rotating files, PostgreSQL, or a sink of
the user's, found by name in :mod:`common.sink.plugins`), acknowledge them only then, and trim
the streams below what every sink has acknowledged.

May import: ``common.core``, ``common.store``, and the public package's interface
``scrape_fleet.sinks`` (the engine imports the public package, never the reverse).
"""
