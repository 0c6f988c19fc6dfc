"""The media stage: download workers, the asset store, asset records (docs/media.md).

A page's rule (``media:``) or handler (``page.download``) turns the assets it references into
media requests: work messages with a ``media`` field, fingerprinted apart from pages
(:func:`common.core.urls.identity_url`) and published to the media queues
(``media_priority``, ``media_queue``). A download worker (``scrape-fleet work --media``) takes
each through the pages' own steps for politeness (robots.txt, the domain's rate limit, shared
with its pages), streams it to a spool file under its type's cap (download.py), stores it once
by content hash (store.py) and appends its asset record to the ``assets`` stream.
May import: ``common.core``, ``common.broker``, ``common.store``, ``common.web``, ``common.intake``,
``common.jobs``, ``common.work`` (the download worker runs the pages' own steps for politeness).
"""
