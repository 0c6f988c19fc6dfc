"""Inspect and act on the dead-letter queue (failed_urls).

    python dlq.py list [--limit N] [--json]     # non-destructive, with counts by reason
    python dlq.py replay [--reason R] [--limit N]
    python dlq.py purge --yes
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_inspect import dlq_main

if __name__ == "__main__":
    cli.run(dlq_main)
