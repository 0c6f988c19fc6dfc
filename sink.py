"""Run a result sink: results and failure records written durably, then trimmed from Redis.

    python sink.py files [--dir DIR]      # gzip JSON Lines parts in DIR (default SINK_DIR)
    python sink.py postgres               # upsert into POSTGRES_TABLE at POSTGRES_URL
    python sink.py retire NAME            # unregister a sink: SREM sinks, XGROUP DESTROY
    python sink.py files --idle-exit 5    # exit 0 after 5 s with nothing new (tests, one-offs)

A sink reads the streams ``results`` and ``failures`` through its consumer group
``sink:{name}`` (``--name``, default the sink's kind; one process per name), acknowledges an
entry once it is written durably, and trims the streams below what every registered sink has
acknowledged. SIGTERM or Ctrl-C stop it after the current batch. Exit 0 ok, 1 stopped with a
batch unwritten or the sink's group gone (retire: no such sink), 2 bad arguments or settings,
3 Redis or the sink's store unreachable.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_run import sink_main

if __name__ == "__main__":
    cli.run(sink_main)
