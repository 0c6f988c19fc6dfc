"""Seed URLs into the fleet from sites' sitemaps and feeds.

    python sitemap_producer.py https://site.example/            # robots.txt Sitemap: lines,
                                                                 # else /sitemap.xml
    python sitemap_producer.py https://site.example/news.xml.gz # a sitemap or feed directly
    python sitemap_producer.py SITE [SITE ...] --since 2024-05-01 --max-urls 10000 --priority

URLs go through the same path as producer.py (common.intake.producer.Producer). Prints one summary
line per site (``site=… sitemaps=N errors=N filtered=N read=… new=…``); progress on stderr
while it runs (common.ops.progress: a bar on a terminal, a line every few seconds otherwise). Exits 0 when everything was read and published, 1 when some sitemap failed or
some URL could not be published, 2 on bad arguments or settings, 3 when RabbitMQ or Redis
cannot be reached. common/intake/sitemaps.py has the walk (discovery, indexes, --since),
common/intake/sitemap_files.py the formats and their limits.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_seed import sitemap_main

if __name__ == "__main__":
    cli.run(sitemap_main)
