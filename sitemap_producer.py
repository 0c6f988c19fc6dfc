"""Sitemap producer — not implemented yet (tracked in the sitemap issue).

It will discover URLs from robots.txt `Sitemap:` lines and sitemap indexes and feed them
through the same path as producer.py (common.producing.Producer). Until then it exits 2
with this message so nobody mistakes it for a working tool.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    print("sitemap_producer.py is not implemented yet; use producer.py -f urls.txt",
          file=sys.stderr)
    sys.exit(2)
