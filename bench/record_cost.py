"""What building, capping and encoding one result record costs on the worker's hot path.

    .venv/bin/python -m bench.record_cost [--calls 20000] [--rounds 5]

In-process and without services: a farm page (bench/farm_pages.py, ~30 KB, ~100 links) is
parsed once, then its record is built and encoded over and over, the ways compared taking
turns in each round so a shared machine's load falls on all of them (the best round counts):

* ``uncapped``: the record as before the caps: the fetch fields, ``Page.to_dict()``, one
  ``orjson.dumps`` (the store's encode);
* ``capped``: :mod:`common.work.record` as the worker runs it: ``fetch_record``,
  ``add_page``, ``bound`` (field caps, links as an ``orjson.Fragment``, one size check),
  then the store's encode;
* ``capped, two encodes``: the same caps, but the size check encodes the whole record and
  the store encodes it again (what ``bound`` avoids with the Fragment).

Then the cost of a record (built, bounded, encoded) of a page over every field cap (100 KB
title, 1 MB description, 50,000 links) and of one whose 1,000 links of 2,000 characters
are over the byte cap, with the record sizes and flags.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402

from bench.farm_pages import Site, page_html, paragraph_pool  # noqa: E402
from common.work.parse import parse_html  # noqa: E402
from common.work.record import FIELD_CAPS, add_page, bound, fetch_record  # noqa: E402

CONTENT_TYPE = "text/html; charset=utf-8"
MAX_RECORD_BYTES = 65536
RECORD_MAX_LINKS = 1000


def farm_page() -> tuple[str, bytes]:
    """Page 7 of site 0 of a 10-site farm: the URL and the bytes."""
    sites = [Site(i, f"127.0.0.{i + 2}", 8080) for i in range(10)]
    return sites[0].page_url(7), page_html(sites[0], 7, 2000, sites, paragraph_pool()).encode()


def hostile_page(links: int = 50_000, link_chars: int = 0) -> tuple[str, bytes]:
    """Every field over its cap: 100 KB title, 1 MB description, 50,000 links, a 5,000-char
    canonical and language; with ``link_chars``, links that long (the byte cap's case)."""
    url = "http://127.0.0.2:8080/hostile.html"
    pad = "x" * link_chars
    anchors = "".join(f'<a href="/l/{i}/{pad}">{i}</a>' for i in range(links))
    html = (f'<html lang="{"x" * 5000}"><head><title>{"T" * 100_000}</title>'
            f'<meta name="description" content="{"d" * 1_000_000}">'
            f'<link rel="canonical" href="/{"c" * 5000}"></head><body>{anchors}</body></html>')
    return url, html.encode()


def response_of(url: str, body: bytes) -> Any:
    return SimpleNamespace(final_url=url, status=200, content_type=CONTENT_TYPE, body=body,
                           truncated=False, elapsed_ms=1.234, redirects=0, skipped=None)


def best_us(calls: int, rounds: int, ways: dict[str, Callable[[], object]]) -> dict[str, float]:
    """CPU microseconds per call of each way: the best of ``rounds`` rounds, ways in turn."""
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for name, call in ways.items():
            for _ in range(min(1000, calls)):
                call()
            started = time.process_time()
            for _ in range(calls):
                call()
            best[name] = min(best[name], (time.process_time() - started) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    url, body = farm_page()
    response = response_of(url, body)
    page = parse_html(body, url, CONTENT_TYPE)
    common = {"worker": "bench-1", "queue": "url_queue_ttl", "depth": 0, "attempts": 1,
              "cached": False}

    def uncapped() -> bytes:
        record = fetch_record(url, response, **common)
        record.update(page.to_dict())
        del record["canonical_truncated"]  # not in the record before the caps
        return orjson.dumps(record)

    def capped() -> bytes:
        record = fetch_record(url, response, **common)
        add_page(record, page, RECORD_MAX_LINKS)
        return orjson.dumps(bound(record, MAX_RECORD_BYTES))

    def capped_two_encodes() -> bytes:
        record = fetch_record(url, response, **common)
        add_page(record, page, RECORD_MAX_LINKS)
        for field, (cap, drop) in FIELD_CAPS.items():
            value = record.get(field)
            if value is not None and len(value) > cap:
                record[field] = None if drop else value[:cap]
        if len(orjson.dumps(record)) > MAX_RECORD_BYTES:
            raise AssertionError("a farm page never reaches the cap")
        return orjson.dumps(record)

    print(f"farm page: {len(body)} bytes, {len(page.links)} links; record "
          f"{len(uncapped())} bytes uncapped, {len(capped())} capped (+ links_count)")
    costs = best_us(args.calls, args.rounds, {"uncapped": uncapped, "capped": capped,
                                               "capped, two encodes": capped_two_encodes})
    for name, us in costs.items():
        print(f"  {name:22s} {us:6.2f} us/record  ({us - costs['uncapped']:+.2f})")

    for name, (links, link_chars) in {"hostile page": (50_000, 0),
                                      "long links": (1000, 1990)}.items():
        url, body = hostile_page(links, link_chars)
        page = parse_html(body, url, CONTENT_TYPE)
        cost = best_us(max(1, args.calls // 1000), args.rounds, {name: capped})[name]
        record = orjson.loads(capped())
        flags = sorted(k for k in record if k.endswith("_truncated") and record[k]
                       or k == "links_kept")
        print(f"{name}: {len(body):,} bytes, {len(page.links):,} links -> record "
              f"{len(capped()):,} bytes, {record['links_kept']} links kept; {cost:,.0f} us "
              f"per record; flags: {', '.join(flags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
