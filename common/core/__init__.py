"""What every room shares: settings read once, the error classes, URLs and their fingerprints,
backoff and the reconnect policy.

May import: nothing else in ``common``.
"""
