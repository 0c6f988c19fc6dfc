"""The fleet's status: queues, delays, dead letters, rates, cache, domains, workers.

    python stats.py            # a table
    python stats.py --json     # the same as JSON, for scripts
    python stats.py --watch    # a live view, refreshed every 2 s (Ctrl-C to leave)
"""

from __future__ import annotations

import argparse
import json

from common.broker.connection import connect_rabbitmq
from common.core.config import Settings
from common.ops import cli, stats
from common.store.connection import connect_redis


def main(settings: Settings) -> int:
    parser = argparse.ArgumentParser(description="Show the fleet's status.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print JSON instead of a table")
    mode.add_argument("--watch", action="store_true", help="live view on the terminal")
    parser.add_argument("--interval", type=float, default=2.0, help="--watch refresh seconds")
    args = parser.parse_args()
    client = connect_redis(settings)
    connection = connect_rabbitmq(settings)
    try:
        if args.watch:
            try:
                stats.watch(settings, connection, client, args.interval)
            except KeyboardInterrupt:
                return cli.EXIT_OK
        snapshot = stats.collect(settings, connection, client)
    finally:
        if connection.is_open:
            connection.close()
    print(json.dumps(snapshot, indent=2) if args.json else stats.render(snapshot))
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
