"""Jobs: many crawls on one fleet (docs/jobs.md); `scrape-fleet job` as a root script.

    python job.py submit FILE|- [--replace]    # - : the job file from standard input
    python job.py list | show NAME | runs NAME | pause NAME | resume NAME | cancel NAME
    python job.py results NAME [--run N] [--format jsonl|csv] [--limit N] | delete NAME
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_job import job_main

if __name__ == "__main__":
    cli.run(job_main)
