"""Re-parse archived pages (ARCHIVE=warc): results again from WARC files, with the current
extraction rules, without fetching anything.

    python reparse.py archive/                          # every *.warc.gz and *.warc in it
    python reparse.py a.warc.gz b.warc.gz -o out.jsonl  # to a file instead of stdout
    python reparse.py archive/ --rules @new-rules.yml   # other rules than EXTRACT_RULES

One JSON line per archived page: the result record as the worker would store it now (``data``,
``data_errors``, title, links...), without the fields of one fetch run, with ``archive`` (the
response record's file, offset and length). Needs neither RabbitMQ nor Redis. EXTRACT_RULES,
EXTRACTOR, MAX_BODY_BYTES, ALLOWED_CONTENT_TYPES and MAX_RECORD_BYTES apply as in the worker
(common/ops/reparse.py). Exits 0, 1 when some record could not be read, 2 on bad arguments or
rules.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.reparse import reparse_main

if __name__ == "__main__":
    cli.run(reparse_main)
