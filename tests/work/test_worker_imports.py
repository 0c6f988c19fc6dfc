"""What a plain HTTP worker process loads: not the browser driver nor the media store's client,
which only render and download workers use (their memory is the bench's worker RSS row)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO_ROOT

PROBE = """
import sys
import common.ops.cli, common.work.processor, common.work.worker  # noqa: F401
heavy = sorted({name.split('.')[0] for name in sys.modules} & {'playwright', 'minio', 'psycopg'})
print(','.join(heavy))
"""


def test_a_plain_worker_loads_neither_playwright_nor_minio_nor_psycopg() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True)

    assert done.stdout.strip() == "", f"a plain worker imported {done.stdout.strip()}"
