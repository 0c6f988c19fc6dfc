"""How fast the (shared) machine is right now: CPU time of one reference parse of a farm page.

The bench takes it before and after the phases; every per-page CPU figure moves with it, so
runs compare through it. The parse is libxml2's through lxml (a pinned version), the page's
tree and its text, not the fleet's own parse: a change to the fleet's code must not move the
yardstick its figures are read by (before 2026-11-27 evening it timed ``parse_html``, which
got cheaper with the code it measured).
"""

from __future__ import annotations

import time

from lxml import etree

from bench.farm import Farm


def reference_parse_us(farm: Farm, calls: int = 300) -> float:
    """CPU microseconds for one libxml2 parse of a farm page (the tree and its text) in this
    process: a fixed piece of work that tells how fast the (shared) machine is right now.
    Every per-page CPU figure moves with it; compare runs through it."""
    page = farm.sites[0]
    body = (farm.root / f"site{page.index}" / "p" / "1.html").read_bytes()
    parser = etree.HTMLParser(encoding="utf-8")

    def parse() -> int:
        return len(etree.fromstring(body, parser).xpath("string(//body)"))

    if not parse():
        raise RuntimeError("the reference page parsed to no text")
    for _ in range(30):  # warm: the first calls pay for the allocator's growth
        parse()
    started = time.process_time()
    for _ in range(calls):
        parse()
    return round((time.process_time() - started) / calls * 1e6, 1)
