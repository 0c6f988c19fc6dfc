"""Redis state: the key schema (every key is built in ``keys``), the seen-set and done marks,
the results stream, the Redis connection.

May import: ``common.core``.
"""
