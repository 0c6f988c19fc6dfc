"""The fleet's status: queues, delays, dead letters, rates, cache, domains, workers.

    python stats.py            # a table
    python stats.py --json     # the same as JSON, for scripts
    python stats.py --watch    # a live view, refreshed every 2 s (Ctrl-C to leave)
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_inspect import status_main

if __name__ == "__main__":
    cli.run(status_main)
