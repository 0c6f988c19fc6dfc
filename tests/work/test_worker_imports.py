"""What a plain HTTP worker process loads: what ``python worker.py`` imports, without the
packages only other kinds of worker, or settings a plain one does not have, use. Every module
a worker loads costs CPU at each start and memory for its whole life (the bench's worker RSS
row); these are imported where they are first used instead."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO_ROOT

#: Top-level packages a plain worker (no --render, no --media, no rules, handlers or jobs) must
#: not load, and who uses them: the browser driver (render workers), the media store's client
#: and its crypto (download workers), Postgres (the sink), the job spec's YAML, the rules' and
#: extractors' parsers, BeautifulSoup's encoding sniffer (a body no declaration decodes), the
#: ``limits`` notation parser (a RATE_LIMIT other than the plain forms).
HEAVY = ("playwright", "minio", "Crypto", "urllib3", "psycopg", "yaml", "regex", "parsel",
         "bs4", "soupsieve", "charset_normalizer", "limits")

#: What ``python worker.py`` imports before it reads its settings: the entry script itself.
PROBE = f"""
import sys
import worker  # noqa: F401
heavy = sorted({{name.split('.')[0] for name in sys.modules}} & set({HEAVY!r}))
print(','.join(heavy))
"""


def test_the_worker_entry_script_loads_none_of_the_heavy_packages_a_plain_worker_never_uses(
) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True)

    assert done.stdout.strip() == "", f"a plain worker imported {done.stdout.strip()}"


def test_the_probe_sees_a_heavy_package_the_entry_script_loads() -> None:
    # The probe's own check: were it to look at the wrong process or names, it would pass
    # whatever the worker imports.
    probe = PROBE.replace("import worker  # noqa: F401", "import worker, yaml  # noqa: F401")

    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True)

    assert "yaml" in done.stdout.strip().split(",")
