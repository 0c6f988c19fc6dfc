"""The fleet's status: where every URL is (done, failed, to do), results per sink, dead letters
now and ever, the rate and an ETA, queues, domains, workers.

    python stats.py            # a table, fitted to the terminal (a pipe gets every line whole)
    python stats.py --json     # the same numbers as JSON, for scripts (keys:
                               # common/ops/status_view.py)
    python stats.py --watch    # a live view, refreshed every 2 s (Ctrl-C to leave)
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_inspect import status_main

if __name__ == "__main__":
    cli.run(status_main)
