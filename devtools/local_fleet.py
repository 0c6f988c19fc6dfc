"""Run the whole fleet end to end on this machine, without Docker.

    python -m devtools.local_fleet [--workers 2] [--pages 200] [--sites 3]

Starts RabbitMQ and Redis (the Debian binaries, in a temp dir, on free loopback ports — or the
ones RABBITMQ_URL/REDIS_URL point at), a demo web site on loopback addresses, N worker
processes; seeds every page plus some duplicates and invalid URLs with producer.py; waits for
the workers to drain the queues; prints stats.py's table and a summary line; stops everything.
Everything it talks to is on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

from devtools.services import fleet_services
from devtools.testsite import start_sites

REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pages", type=int, default=200, help="pages per demo site")
    parser.add_argument("--sites", type=int, default=3, help="demo sites (127.0.0.1, .2, ...)")
    parser.add_argument("--timeout", type=float, default=300, help="give up after this long")
    parser.add_argument("--rate-limit", default="25/second",
                        help="per-domain limit for the demo (RATE_LIMIT wins when set)")
    args = parser.parse_args(argv)

    print(f"starting RabbitMQ, Redis and {args.sites} demo site(s)...", flush=True)
    sites = start_sites(args.sites, pages=args.pages)
    try:
        with fleet_services() as services, tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, RABBITMQ_URL=services.rabbitmq_url,
                       REDIS_URL=services.redis_url, PYTHONUNBUFFERED="1",
                       LOG_LEVEL=os.environ.get("LOG_LEVEL", "WARNING"),
                       RATE_LIMIT=os.environ.get("RATE_LIMIT", args.rate_limit),
                       # The demo sites live on loopback, which the address guard refuses
                       # by default.
                       FETCH_ALLOW_NETWORKS="127.0.0.0/8")
            if services.management_url:
                print(f"RabbitMQ management UI: {services.management_url}", flush=True)
                parts = urlsplit(services.management_url)
                user, password = services.management_auth or ("guest", "guest")
                env["RABBITMQ_MANAGEMENT_URL"] = (f"{parts.scheme}://{quote(user)}:"
                                                  f"{quote(password)}@{parts.netloc}")
            seeds = Path(tmp) / "seeds.txt"
            urls = [site.page_url(n) for site in sites for n in range(1, args.pages + 1)]
            extras = urls[:20] + ["ftp://example.invalid/file", "not a url",
                                  sites[0].url("/status/404"), sites[0].url("/latin1")]
            seeds.write_text("\n".join(["# demo seeds", *urls, *extras]) + "\n")

            started = time.monotonic()
            workers = [subprocess.Popen(
                [sys.executable, "worker.py", "--idle-exit", "4",
                 "--concurrency", "8"], cwd=REPO_ROOT, env=dict(env, WORKER_ID=f"local-{i + 1}"))
                for i in range(args.workers)]
            produced = subprocess.run([sys.executable, "producer.py", "-f", str(seeds)],
                                      cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                      timeout=args.timeout, check=False)
            print(f"producer: {produced.stdout.strip()}", flush=True)
            if produced.returncode != 0:
                print(produced.stderr, file=sys.stderr)
            codes = []
            for worker in workers:
                remaining = max(1.0, args.timeout - (time.monotonic() - started))
                try:
                    codes.append(worker.wait(timeout=remaining))
                except subprocess.TimeoutExpired:
                    worker.terminate()
                    codes.append(worker.wait(timeout=60))
            elapsed_s = time.monotonic() - started
            stats = subprocess.run([sys.executable, "stats.py", "--json"], cwd=REPO_ROOT,
                                   env=env, capture_output=True, text=True, check=False)
            table = subprocess.run([sys.executable, "stats.py"], cwd=REPO_ROOT, env=env,
                                   capture_output=True, text=True, check=False)
            print(table.stdout, end="")
            snapshot = json.loads(stats.stdout) if stats.returncode == 0 else {}
            fetched = sum(len(site.requests_for("/")) for site in sites)
            print(f"summary: seeded={len(urls) + len(extras)} results={snapshot.get('results')} "
                  f"dead_lettered={snapshot.get('dead_lettered')} "
                  f"requests_seen_by_sites={fetched} workers={args.workers} "
                  f"exit_codes={codes} elapsed={elapsed_s:.1f}s", flush=True)
            ok = produced.returncode == 0 and all(c == 0 for c in codes) and stats.returncode == 0
            print("to crawl your own URLs with a fleet that stays up: `pip install .`, then "
                  "`scrape-fleet up` (docs/getting-started.md)", flush=True)
            return 0 if ok else 1
    finally:
        for site in sites:
            site.stop()


if __name__ == "__main__":
    sys.exit(main())
