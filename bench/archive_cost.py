"""What ARCHIVE=warc costs a worker per page, and what ARCHIVE_FSYNC adds.

    .venv/bin/python -m bench.archive_cost [--pages 3000] [--sites 4] [--concurrency 8]
                                           [--write-only] [--writes 2000] [--json]

Two measurements, on the same farm pages (bench/farm_pages.py, ~30 KB, ~100 links):

* ``write``: :meth:`common.work.archive.Archive.write` alone, in this process, no services:
  CPU and wall time per page for the records of one plain 200 response (build, gzip, digests,
  one append), with ARCHIVE_FSYNC off and on (the fsync's wall time is the disk's, not CPU).
  Files go to a temporary directory on the file system of ``--dir`` (default: the current one,
  where ARCHIVE_DIR would be).
* ``fleet`` (unless ``--write-only``): one :class:`~common.work.worker.Worker` in this process
  crawls ``--pages`` farm pages served by nginx on loopback (bench/farm.py) three times, Redis
  and the queues reset in between: ARCHIVE=none, ARCHIVE=warc, ARCHIVE=warc with
  ARCHIVE_FSYNC=true. Worker CPU per page (getrusage of this process: RabbitMQ, Redis and nginx
  are child processes, not counted) and pages/s for each. The WARC runs include the capture in
  the fetch callbacks (raw chunks, libcurl's debug callback).

:func:`measure` returns the figures as a dict, for bench/run.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.farm import Farm, NginxFarm  # noqa: E402
from bench.farm_pages import Site, page_html, paragraph_pool  # noqa: E402
from bench.worker_cost import run_one_worker  # noqa: E402
from common.core.config import load_settings  # noqa: E402
from common.web.capture import Exchange  # noqa: E402
from common.web.fetch import FetchResult  # noqa: E402
from common.work.archive import Archive  # noqa: E402
from devtools.services import fleet_services, reset_state  # noqa: E402

MODES = {"none": {"ARCHIVE": "none"}, "warc": {"ARCHIVE": "warc"},
         "warc+fsync": {"ARCHIVE": "warc", "ARCHIVE_FSYNC": "true"}}


def _responses(count: int) -> list[FetchResult]:
    """``count`` fetch results of farm pages as the fetcher gives them with ARCHIVE=warc."""
    sites = [Site(i, f"127.0.0.{i + 2}", 8080) for i in range(4)]
    pool = paragraph_pool()
    out = []
    for n in range(count):
        site = sites[n % len(sites)]
        url = site.page_url(n // len(sites) + 1)
        body = page_html(site, n // len(sites) + 1, 2000, sites, pool).encode()
        path = url.split(str(site.port), 1)[1]
        request = (f"GET {path} HTTP/1.1\r\nHost: {site.host}:{site.port}\r\nUser-Agent: "
                   "scrape-fleet/0.1\r\nAccept: text/html\r\nAccept-Encoding: gzip, deflate"
                   "\r\n\r\n").encode()
        head = (b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 12:00:00 GMT\r\n"
                b"Content-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n"
                b"Connection: keep-alive\r\n\r\n" % len(body))
        exchange = Exchange(url, request, head, body, site.host, time.time(), None)
        out.append(FetchResult(url, url, 200, "text/html; charset=utf-8", body, 1.0,
                               exchanges=(exchange,)))
    return out


def measure_write(writes: int, directory: Path) -> dict[str, Any]:
    """Per page: CPU and wall µs of Archive.write, fsync off and on, and the bytes written."""
    responses = _responses(writes)
    figures: dict[str, Any] = {"page_bytes": sum(len(r.body) for r in responses) // writes}
    for name, fsync in (("write", "false"), ("write+fsync", "true")):
        with tempfile.TemporaryDirectory(prefix="archive-cost-", dir=directory) as tmp:
            settings = load_settings({"ARCHIVE": "warc", "ARCHIVE_DIR": tmp,
                                      "ARCHIVE_FSYNC": fsync, "WORKER_ID": "bench"})
            archive = Archive(settings)
            archive.write(responses[0])  # the file is opened outside the measurement
            cpu, wall = time.process_time(), time.perf_counter()
            for response in responses[1:]:
                archive.write(response)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            archive.close()
            size = sum(p.stat().st_size for p in Path(tmp).glob("*.warc.gz"))
        n = writes - 1
        figures[name] = {"cpu_us": round(cpu / n * 1e6), "wall_us": round(wall / n * 1e6)}
        figures["archive_bytes_per_page"] = size // writes
    return figures


def measure_fleet(pages: int, sites: int, concurrency: int, directory: Path) -> dict[str, Any]:
    """Worker CPU per page and pages/s for each of :data:`MODES`, on the same farm pages."""
    per_site = max(1, pages // sites)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="archive-cost-farm-") as farm_dir, \
            tempfile.TemporaryDirectory(prefix="archive-cost-", dir=directory) as warc_dir:
        farm = Farm.generate(Path(farm_dir), sites=sites, pages=per_site)
        urls = [site.page_url(n) for site in farm.sites for n in range(1, per_site + 1)]
        with fleet_services() as services, NginxFarm(farm):
            for mode, env in MODES.items():
                reset_state(services.rabbitmq_url, services.redis_url)
                settings = load_settings({
                    "RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url,
                    "IDLE_EXIT_S": "1.0", "WORKER_CONCURRENCY": str(concurrency),
                    "LOG_LEVEL": "WARNING", "RATE_LIMIT": "100000/second", "CACHE_TTL_S": "0",
                    "FETCH_ALLOW_NETWORKS": "127.0.0.0/8", "ARCHIVE_DIR": warc_dir, **env})
                client = redis.Redis.from_url(services.redis_url)
                worker, before, after, wall_s = run_one_worker(settings, client, list(urls))
                client.close()
                n = max(1, worker.processed)
                cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                figures[mode] = {"pages": worker.processed, "cpu_ms": round(cpu_s / n * 1e3, 3),
                                 "pages_per_s": round(n / wall_s)}
    base = figures["none"]["cpu_ms"]
    for mode in ("warc", "warc+fsync"):
        figures[mode]["cpu_vs_none"] = round(figures[mode]["cpu_ms"] / base, 3)
    return figures


def measure(*, pages: int = 3000, sites: int = 4, concurrency: int = 8, writes: int = 2000,
            directory: Path = Path("."), fleet: bool = True) -> dict[str, Any]:
    """The figures of both measurements (``fleet=False``: the write one only)."""
    figures = {"write": measure_write(writes, directory)}
    if fleet:
        figures["fleet"] = measure_fleet(pages, sites, concurrency, directory)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000, help="farm pages crawled per mode")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="WORKER_CONCURRENCY")
    parser.add_argument("--writes", type=int, default=2000, help="Archive.write calls timed")
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help="where the temporary WARC files go (its file system matters)")
    parser.add_argument("--write-only", action="store_true", help="no services, no farm")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    figures = measure(pages=args.pages, sites=args.sites, concurrency=args.concurrency,
                      writes=args.writes, directory=args.dir, fleet=not args.write_only)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    write = figures["write"]
    print(f"Archive.write of a {write['page_bytes']} B page ({write['archive_bytes_per_page']} B "
          f"of WARC): {write['write']['cpu_us']} us CPU, {write['write']['wall_us']} us wall; "
          f"with fsync {write['write+fsync']['cpu_us']} us CPU, "
          f"{write['write+fsync']['wall_us']} us wall")
    for mode, row in figures.get("fleet", {}).items():
        ratio = f", {row['cpu_vs_none']:.2f}x none" if "cpu_vs_none" in row else ""
        print(f"ARCHIVE={mode}: {row['pages']} pages, worker CPU {row['cpu_ms']} ms/page"
              f"{ratio}, {row['pages_per_s']} pages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
