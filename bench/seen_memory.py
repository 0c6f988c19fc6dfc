"""Redis memory per URL of the seen-set at ``--seen-urls`` fingerprints (1M at full size), and
whether the set is exact.

``used_memory`` is read before and after :meth:`SeenSet.add_many` of the fingerprints; then
``--seen-probe`` non-members must all be reported absent and as many members present.
"""

from __future__ import annotations

import time
from typing import Any

from bench.shared import Ctx, fleet_env, log, reset
from common.core.config import load_settings
from common.core.urls import fingerprint
from common.store.dedupe import SeenSet


def phase_seen(ctx: Ctx) -> dict[str, Any]:
    """Redis memory per seen URL at ``seen_urls`` fingerprints, and exactness."""
    reset(ctx.services)
    n, probe = ctx.sizes.seen_urls, ctx.sizes.seen_probe
    settings = load_settings(fleet_env(ctx.services, ctx.sizes.concurrency))
    meter = ctx.redis()
    loader = ctx.redis()
    seen = SeenSet(loader, settings.seen_buckets)
    before = int(meter.info("memory")["used_memory"])
    added = 0
    batch = 10_000
    for start in range(0, n, batch):
        fps = [fingerprint(f"http://seen.bench.invalid/u/{i}") for i in range(start,
                                                                             min(n, start + batch))]
        added += sum(seen.add_many(fps))
    loader.close()  # frees the loader's query buffer before the second reading
    time.sleep(0.2)
    after = int(meter.info("memory")["used_memory"])
    keys = int(meter.dbsize())
    checker = SeenSet(meter, settings.seen_buckets)
    false_positives = 0
    missing = 0
    for start in range(0, probe, batch):
        stop = min(probe, start + batch)
        absent = [fingerprint(f"http://seen.bench.invalid/absent/{i}") for i in range(start, stop)]
        false_positives += sum(checker.contains_many(absent))
        step = max(1, n // probe)
        present = [fingerprint(f"http://seen.bench.invalid/u/{i * step}")
                   for i in range(start, stop) if i * step < n]
        missing += sum(1 for hit in checker.contains_many(present) if not hit)
    count = checker.count()
    meter.close()
    log(f"seen-set: {n} URLs, {(after - before) / n:.2f} bytes each, "
        f"{false_positives} false positives in {probe}")
    return {
        "urls": n,
        "added_new": added,
        "count": count,
        "buckets": settings.seen_buckets,
        "keys": keys,
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_url": (after - before) / n,
        "non_members_checked": probe,
        "false_positives": false_positives,
        "members_checked": probe,
        "members_missing": missing,
    }
