"""Redis key schema — every key this project touches is built here.

    crawled_urls:{b}     SET of signed 64-bit integers. The seen-set, split into SEEN_BUCKETS
                         small sets so each stays an intset (8 bytes a member, no per-member
                         object). A URL's 128-bit fingerprint picks bucket ``b`` (hex) with its
                         top bits and stores the next 64 bits as the member. See NOTES.md #4.
    results              STREAM, one entry per fetched URL (field ``json``: the result record),
                         bounded with an approximate MAXLEN (RESULTS_MAXLEN).
    stats:counters       HASH of fleet-wide counters (released fingerprints, expired messages,
                         dead-lettered by reason, ...), incremented with HINCRBY.

Nothing else is written. ``SCAN crawled_urls:*`` walks the seen-set.
"""

from __future__ import annotations

SEEN_PREFIX = "crawled_urls:"
RESULTS_STREAM = "results"
COUNTERS = "stats:counters"


def seen_bucket(bucket: int) -> str:
    """The seen-set member key for bucket number ``bucket``."""
    return f"{SEEN_PREFIX}{bucket:x}"
