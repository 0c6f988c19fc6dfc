"""Recrawl URLs on a schedule whose intervals adapt to how often each page changes.

    python scheduler.py run                       # the scheduler; run 2+: one leads (a lease)
    python scheduler.py add URL ... | -f FILE [--interval 1d] [--delay 0] [--keep]
    python scheduler.py sitemap https://site/ [--max-urls N]   # seed + schedule its sitemaps
    python scheduler.py show [URL ...]            # the schedule, or URLs' entries (JSON)
    python scheduler.py remove URL ...

``run``: the replica holding the lease re-enqueues due URLs as recrawls through the producer
path and learns from their results as the result sink ``scheduler`` (when no scheduler will
run any more: ``python sink.py retire scheduler``); the others stand by. SIGTERM or Ctrl-C:
the batch in hand is finished and the lease given up. ``add``: first visit after --delay
(default at once), then every --interval (default SCHEDULE_INTERVAL_S), adapted within
SCHEDULE_MIN/MAX_INTERVAL_S; --keep leaves URLs already scheduled as they are. ``sitemap``:
what sitemap_producer.py does, plus every URL not yet scheduled scheduled from its changefreq
or lastmod, first revisited one interval later. Exit 0 ok, 1 some URLs invalid or a sitemap
failed, 2 bad arguments or settings, 3 RabbitMQ or Redis unreachable.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_schedule import schedule_main

if __name__ == "__main__":
    cli.run(schedule_main)
