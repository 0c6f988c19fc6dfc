"""Export results as JSON Lines or CSV, from the files sink's parts (SINK_DIR) or the stream.

    python export.py                                  # every record, JSON Lines, on stdout
    python export.py --format csv -o results.csv      # CSV with a header, to a file
    python export.py --from 1714564800000-0           # from a stream id (inclusive)
    python export.py --since 2024-05-01T12:00:00Z     # from a time (ISO 8601 or epoch seconds)
    python export.py --limit 100                      # at most 100 records
    python export.py --follow                         # then wait for new records until stopped
    python export.py --sink-dir /data/results         # from the files sink's parts (SINK_DIR)
    python export.py --files-only --sink-dir DIR      # the parts alone, Redis down or gone

With SINK_DIR set and holding the files sink's parts, they are read (the sink trims the
stream): common/ops/cli_export.py. A line on stderr says where the records came from.

JSON Lines: the stored record with its stream id as ``id``. CSV columns: see
common/ops/export.py CSV_COLUMNS. Reads in batches (constant memory); logs a summary line with the
last id on stderr. Exits 0 when done (--follow: also when stopped with Ctrl-C or SIGTERM),
2 on bad arguments, 3 when Redis cannot be reached (not with --files-only), 130 when an export without --follow is
interrupted.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_export import export_main

if __name__ == "__main__":
    cli.run(export_main)
