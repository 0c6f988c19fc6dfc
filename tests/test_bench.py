"""The benchmark keeps working: its arithmetic, and one small end-to-end run of the one command.

The end-to-end test runs ``bash bench/run.sh --small`` (tiny farm, scrapy-redis peer included,
so the bench venv is built on a fresh machine: about 30 s the first time) and checks that the
table prints every figure with a number, and that the sinks phase drained every record of the
fleet round through both sinks, wrote each once and retired them. It asserts no target:
figures on a shared machine are the bench's output, not a test's verdict.
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
from bench.report import build_rows, round_spread
from bench.run import FIGURES, parse_args
from bench.shared import Sizes
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


def test_sink_rows_divide_by_the_fleet_rate_and_say_why_they_were_skipped():
    phases = {"fleet": {"pages_per_s": 500.0},
              "sinks": {"sink_batch": 500,
                        "files": {"rows_per_s": 1200.0, "entries": 10_000},
                        "postgres": {"skipped": "no PostgreSQL: binaries not found"}}}
    rows = {row.figure: row for row in build_rows(Sizes.from_args(parse_args([])), phases)}
    assert rows["files sink rows/s"].value == 1200.0
    assert rows["files sink / fleet pages/s"].value == pytest.approx(2.4)
    assert rows["files sink / fleet pages/s"].verdict == "FAIL"  # under 3x
    assert rows["PostgreSQL sink rows/s"].verdict == "skipped"
    assert "binaries not found" in rows["PostgreSQL sink rows/s"].unit
    assert rows["PostgreSQL sink / fleet pages/s"].verdict == "skipped"
    without = {row.figure: row for row in build_rows(Sizes.from_args(parse_args([])),
                                                     {"fleet": {"pages_per_s": 500.0}})}
    assert without["files sink rows/s"].verdict == "skipped"
    assert list(without) == list(FIGURES)
    assert [row.figure for row in build_rows(Sizes.from_args(parse_args([])), phases)] == list(
        FIGURES)


@pytest.mark.slow
@pytest.mark.integration
def test_the_cpu_rows_name_the_spread_of_their_rounds():
    fleet = {"pages_per_s": 1500.0, "cpu_ms_per_page": 1.02,
             "rounds": [{"cpu_ms_per_page": 0.97}, {"cpu_ms_per_page": 1.081}]}
    peer = {"pages_per_s": 230.0, "cpu_ms_per_page": 8.4,
            "rounds": [{"cpu_ms_per_page": 8.2}, {"cpu_ms_per_page": 8.6}]}
    rows = {r.figure: r for r in build_rows(Sizes.from_args(parse_args([])),
                                            {"fleet": fleet, "peer": peer})}
    assert rows["worker CPU per page"].unit == "ms, rounds 0.97–1.08"
    assert rows["scrapy-redis CPU per page"].unit.endswith("spider processes, rounds 8.20–8.60")
    assert round_spread({"rounds": [{"cpu_ms_per_page": 1.0}]}) == ""  # one round: no spread


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
    _check_sinks(report)


def _check_sinks(report: dict) -> None:
    """Both sinks drained the fleet round's records, wrote each once, exited 0 and were
    retired; the ratio rows divide by the fleet's pages/s of the same run."""
    rows = {row["figure"]: row for row in report["rows"]}
    fleet = report["phases"]["fleet"]
    records = fleet["rounds"][-1]["results"]
    assert records == fleet["rounds"][-1]["captured_for_sinks"] > 0
    sinks = report["phases"]["sinks"]
    assert sinks["entries"]["results"] == records
    files, postgres = sinks["files"], sinks["postgres"]
    for sink in (files, postgres):
        assert sink["entries"] == records, sink
        assert sink["exit_code"] == 0 and sink["registered_after"] == [], sink
    assert files["written"]["lines"] == files["written"]["distinct_ids"] == records
    assert files["written"]["open_parts"] == 0
    assert postgres["written"]["rows"] == sinks["urls"] == records
    for label, sink in (("files sink", files), ("PostgreSQL sink", postgres)):
        assert rows[f"{label} rows/s"]["value"] == pytest.approx(sink["rows_per_s"])
        assert rows[f"{label} / fleet pages/s"]["value"] == pytest.approx(
            sink["rows_per_s"] / fleet["pages_per_s"])
        assert rows[f"{label} / fleet pages/s"]["verdict"] in ("pass", "FAIL")
