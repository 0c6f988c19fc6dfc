"""How fast the (shared) machine is right now: CPU time of one reference parse of a farm page.

The bench takes it before and after the phases; every per-page CPU figure moves with it, so
runs compare through it.
"""

from __future__ import annotations

import time

from bench.farm import Farm
from common.work.parse import parse_html


def reference_parse_us(farm: Farm, calls: int = 300) -> float:
    """CPU microseconds for one ``parse_html`` of a farm page in this process: a fixed piece
    of work that tells how fast the (shared) machine is right now. Every per-page CPU figure
    moves with it; compare runs through it."""
    page = farm.sites[0]
    body = (farm.root / f"site{page.index}" / "p" / "1.html").read_bytes()
    url = page.page_url(1)
    parse_html(body, url, "text/html; charset=utf-8")
    started = time.process_time()
    for _ in range(calls):
        parse_html(body, url, "text/html; charset=utf-8")
    return round((time.process_time() - started) / calls * 1e6, 1)
