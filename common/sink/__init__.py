"""Where results go to stay: result sinks read the ``results`` and ``failures`` streams through
a Redis consumer group each, write entries durably (rotating files, PostgreSQL), acknowledge
them only then, and trim the streams below what every sink has acknowledged.

A sink of the user's is found by name in :mod:`common.sink.plugins` and implements the public
interface :class:`scrape_fleet.sinks.Sink`.

May import: ``common.core``, ``common.store``, and the public package's ``scrape_fleet.sinks``
(the engine imports the public package, never the reverse).
"""
