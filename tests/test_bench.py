"""The benchmark keeps working: its arithmetic, and one small end-to-end run of the one command.

The end-to-end test runs ``bash bench/run.sh --small`` (tiny farm, scrapy-redis peer included,
so the bench venv is built on a fresh machine: about 30 s the first time) and checks that the
table prints every figure with a number. It asserts no target: figures on a shared machine
are the bench's output, not a test's verdict.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess

import pytest

from bench.farm import parse_log_line
from bench.figures import Row, min_duration_s, percentile, rate_per_s, windows_over_limit
from bench.run import FIGURES
from devtools.services import FleetServices
from tests.helpers import REPO_ROOT

BENCH_TIMEOUT_S = 600


def test_rate_is_count_over_the_span_of_the_log():
    assert rate_per_s([10.0, 10.5, 11.0, 12.0]) == pytest.approx(2.0)
    assert rate_per_s([5.0]) == 0.0


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 50) == 10.0
    assert percentile(values, 95) == 19.0
    assert math.isnan(percentile([], 95))


def test_limit_bound_is_bursts_one_window_apart():
    assert min_duration_s(1, 5, 1.0) == 0.0
    assert min_duration_s(5, 5, 1.0) == 0.0
    assert min_duration_s(6, 5, 1.0) == 1.0
    assert min_duration_s(101, 5, 1.0) == 20.0


def test_windows_over_limit_counts_every_overfull_sliding_window():
    paced = [i * 0.2 for i in range(20)]  # exactly 5 per second
    assert windows_over_limit(paced, 5, 1.0) == 0
    burst = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 2.0]
    assert windows_over_limit(burst, 5, 1.0) == 1
    assert windows_over_limit([0.0, 0.0, 0.0], 2, 1.0) == 1


def test_access_log_line_parses_with_quoted_user_agent():
    line = ('1795303145.701 127.0.0.7:34789 200 30109 "/p/1.html?b=3" '
            '"scrape-fleet/0.1 (bench)" 0.001\n')
    parsed = parse_log_line(line)
    assert parsed is not None
    assert (parsed.host, parsed.status, parsed.uri) == ("127.0.0.7", 200, "/p/1.html?b=3")
    assert parsed.user_agent == "scrape-fleet/0.1 (bench)"
    assert parse_log_line("garbage") is None


def test_missing_value_renders_as_not_available():
    assert Row("x", None).value_text() == "n/a"
    assert Row("x", 12345.6).value_text() == "12,346"


@pytest.mark.slow
@pytest.mark.integration
def test_small_bench_prints_every_figure_with_a_number(services: FleetServices, tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, RABBITMQ_URL=services.rabbitmq_url, REDIS_URL=services.redis_url)
    done = subprocess.run(["bash", "bench/run.sh", "--small", "--json", str(out)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=BENCH_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-4000:]
    table = done.stdout
    for figure in FIGURES:
        match = re.search(rf"^{re.escape(figure)}\s+(-?[\d,]+(?:\.\d+)?)\s", table, re.M)
        assert match, f"row {figure!r} missing or not numeric in:\n{table}"
    report = json.loads(out.read_text())
    assert [row["figure"] for row in report["rows"]] == list(FIGURES)
    assert all(isinstance(row["value"], int | float) for row in report["rows"])
    assert report["phases"]["fleet"]["pages_logged"] == report["farm"]["sites"] * report["farm"]["pages"]
