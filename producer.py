"""Seed URLs into the fleet.

    python producer.py URL [URL ...]
    python producer.py -f urls.txt          # one URL a line, '#' starts a comment
    python producer.py -                    # URLs on stdin
    python producer.py --priority URL       # force the priority queue

Prints one summary line; exits 0 when every URL was handled, 1 when some could not be
published, 2 on bad arguments or settings, 3 when RabbitMQ or Redis cannot be reached.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_seed import produce_main

if __name__ == "__main__":
    cli.run(produce_main)
