"""The sites' side of a URL's journey: fetching under the address guard and caps, robots.txt,
the fleet-wide per-domain rate limit, the response cache.

May import: ``common.core``, ``common.store``.
"""
