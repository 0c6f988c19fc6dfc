"""Print the fleet's state: queue depths, DLQ size, seen-set size, result count.

    python stats.py           # a small table
    python stats.py --json    # the same as JSON, for scripts
"""

from __future__ import annotations

import argparse
import json

from common import cli, stats
from common.config import Settings
from common.connections import connect_rabbitmq, connect_redis


def main(settings: Settings) -> int:
    parser = argparse.ArgumentParser(description="Show the fleet's queues and counters.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    client = connect_redis(settings)
    connection = connect_rabbitmq(settings)
    try:
        snapshot = stats.collect(settings, connection, client)
    finally:
        connection.close()
    print(json.dumps(snapshot, indent=2) if args.json else stats.render(snapshot))
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
