"""What cookies and proxies cost a worker per page: CPU and Redis round trips.

    .venv/bin/python -m bench.realweb_cost [--pages 3000] [--rounds 3] [--sites 4] [--no-proxy]

Starts RabbitMQ and Redis (devtools.services) and an nginx farm on loopback (bench/farm.py),
then alternates rounds over the same pages, one :class:`common.work.worker.Worker` in this
process each (bench/job_cost.py's round): ``off`` (COOKIES_ENABLED=false), ``cookies`` (the
default: every page's jar looked up and kept, none set by the farm), and ``proxies`` (cookies
on, every request through a pool of three tinyproxy instances on loopback, PROXY_ROTATION
request: the proxy choice and the proxied transfer, tinyproxy's own CPU not counted). The
target (issue 28): cookies on cost at most 3 % CPU per page over off.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.farm import Farm, NginxFarm  # noqa: E402
from bench.job_cost import RoundTrips, one_round  # noqa: E402
from common.core.config import load_settings  # noqa: E402
from devtools.services import fleet_services  # noqa: E402

KINDS = ("off", "cookies", "proxies")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000, help="pages a round (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--no-proxy", action="store_true", help="skip the proxies rounds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    RoundTrips()
    per_site = max(1, args.pages // args.sites)
    kinds = KINDS[:2] if args.no_proxy else KINDS
    rows: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="realweb-cost-") as tmp, \
            contextlib.ExitStack() as stack:
        farm = Farm.generate(Path(tmp), sites=args.sites, pages=per_site)
        services = stack.enter_context(fleet_services())
        stack.enter_context(NginxFarm(farm))
        proxies = "" if args.no_proxy else _proxies(stack)
        base = {"RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url,
                "IDLE_EXIT_S": "1.0", "LOG_LEVEL": "WARNING", "RATE_LIMIT": "100000/second",
                "CACHE_TTL_S": "0", "FETCH_ALLOW_NETWORKS": "127.0.0.0/8"}
        env = {"off": {**base, "COOKIES_ENABLED": "false"}, "cookies": base,
               "proxies": {**base, "PROXY_URLS": proxies}}
        client = redis.Redis.from_url(services.redis_url)
        urls = [site.page_url(n) for site in farm.sites for n in range(1, per_site + 1)]
        for number in range(args.rounds):
            for kind in kinds:
                client.flushdb()  # a fresh seen-set: every round fetches every page
                row = one_round(load_settings(env[kind]), client, urls, None)
                rows[kind].append(row)
                print(f"round {number + 1} {kind:8}: CPU {row[0]:.0f} us/page, "
                      f"{row[1]:.2f} Redis round trips/page, {row[2]:.0f} pages/s", flush=True)
    cpu = {k: statistics.median(r[0] for r in v) for k, v in rows.items()}
    trips = {k: statistics.median(r[1] for r in v) for k, v in rows.items()}
    spread = {k: (max(r[0] for r in v) - min(r[0] for r in v)) / cpu[k] * 100
              for k, v in rows.items()}
    for kind in kinds:
        print(f"median {kind:8}: CPU {cpu[kind]:.0f} us/page "
              f"({(cpu[kind] / cpu['off'] - 1) * 100:+.1f} % over off; rounds spread "
              f"{spread[kind]:.1f} %), {trips[kind]:.2f} Redis round trips/page")
    return 0


def _proxies(stack: contextlib.ExitStack) -> str:
    """Three tinyproxy instances on loopback (devtools/proxies.py); their URLs, comma-separated."""
    from devtools.proxies import TinyProxy

    return ",".join(stack.enter_context(TinyProxy()).url for _ in range(3))


if __name__ == "__main__":
    sys.exit(main())
