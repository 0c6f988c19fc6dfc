"""Taking URLs in: routing rules, the one producer path (canonicalise, dedupe, route,
confirmed publish), sitemaps, and crawl mode's links fed back through that path.

May import: ``common.core``, ``common.broker``, ``common.store``, ``common.web``.
"""
