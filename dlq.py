"""Inspect and act on the dead-letter queue (failed_urls).

    python dlq.py list [--limit N] [--json]     # non-destructive, with counts by reason
    python dlq.py replay [--reason R] [--limit N]
    python dlq.py purge --yes
"""

from __future__ import annotations

import argparse

from common.broker.connection import connect_rabbitmq
from common.core.config import Settings
from common.ops import cli, dlq
from common.store.connection import connect_redis


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Dead-letter queue tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="show dead letters without removing them")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="JSON lines, one per message")
    again = sub.add_parser("replay", help="send dead letters back through routing")
    again.add_argument("--reason", help="only messages with this reason (e.g. max_retries)")
    again.add_argument("--limit", type=int, default=None)
    purge = sub.add_parser("purge", help="delete every dead letter")
    purge.add_argument("--yes", action="store_true", help="really purge")
    return parser.parse_args()


def main(settings: Settings) -> int:
    args = parse_args()
    connection = connect_rabbitmq(settings)
    try:
        if args.command == "list":
            letters = dlq.browse(connection, args.limit)
            if args.json:
                if letters:
                    print(dlq.to_json_lines(letters))
                return cli.EXIT_OK
            for letter in letters:
                h = letter.as_dict()
                line = (f"{letter.reason:<20} attempts={h.get('attempts', 0)} "
                        f"status={h.get('last_status', '-')} {letter.url}  "
                        f"{h.get('last_error', '')}")
                print(cli.escape_controls(line))  # URLs and errors came from outside
            print(f"{len(letters)} shown; by reason: {dlq.count_by_reason(letters)}")
            return cli.EXIT_OK
        if args.command == "replay":
            summary = dlq.replay(settings, connection, connect_redis(settings),
                                 reason=args.reason, limit=args.limit)
            print(f"replayed={summary.matched} unreplayable={summary.skipped_unreplayable} "
                  f"{summary.produced.line()}")
            return cli.EXIT_PARTIAL if summary.produced.failed else cli.EXIT_OK
        if not args.yes:
            print("purge deletes every dead letter: add --yes")
            return cli.EXIT_CONFIG
        print(f"purged {dlq.purge(connection)} dead letters")
        return cli.EXIT_OK
    finally:
        if connection.is_open:
            connection.close()


if __name__ == "__main__":
    cli.run(main)
