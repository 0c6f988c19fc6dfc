"""Fairness across jobs (issue 26): a 50,000-URL job must not starve a 500-URL job.

The sizes and rates of tests/test_fairness.py's starve test, per job instead of per domain: a
small job of 500 URLs on 10 loopback hosts (50 each, 2 requests/s per domain: about 25 s) is
run alone, then, in the same test, submitted right behind a big job of 50,000 URLs of one other
host. Two ``worker.py`` processes and one ``scheduler.py run`` (the job runner) each time; the
small job's time is from its ``scrape-fleet job submit`` to its run ``finished`` (the runner's
quiet time, half a second, in both). With per-domain deferral and the runner seeding both
jobs, it finishes within 1.25x its time alone, each of its URLs recorded once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from common.core.urls import canonicalize
from devtools.services import reset_state
from devtools.testsite import TestSite, start_sites
from tests.helpers import wait_for
from tests.test_jobs_fleet import Fleet

pytestmark = pytest.mark.slow

SMALL_HOSTS = 10
SMALL_PER_HOST = 50
BIG_URLS = 50_000
FAIR_ENV = {"RATE_LIMIT": "2/second", "DEFER_LEAD_S": "10"}


@pytest.fixture
def farm() -> Iterator[tuple[list[TestSite], TestSite]]:
    small = start_sites(SMALL_HOSTS, first_host="127.0.27.1", pages=SMALL_PER_HOST)
    big = TestSite("127.0.28.1", pages=BIG_URLS).start()
    try:
        yield small, big
    finally:
        for site in (*small, big):
            site.stop()


@dataclass
class Timing:
    """Seconds from the small job's submission to each point of its run."""

    started: float  # the runner started its run
    first: float  # its sites' first request
    last: float  # their last request
    finished: float  # the run finished

    def line(self) -> str:
        return (f"started {self.started:.1f} s, first request {self.first:.1f} s, last "
                f"{self.last:.1f} s, finished {self.finished:.1f} s")


def _small_job(services, settings, redis_client, tmp_path, small: list[TestSite],
               big: TestSite | None) -> Timing:
    """The small job's run, alone or right behind the big one."""
    reset_state(services.rabbitmq_url, services.redis_url)
    for site in (*small, *([big] if big else [])):
        site.clear_log()
    urls = [site.page_url(n) for site in small for n in range(1, SMALL_PER_HOST + 1)]
    fleet = Fleet(settings, redis_client, tmp_path).start(**FAIR_ENV)
    try:
        if big is not None:
            seeds = tmp_path / "big-seeds.txt"
            seeds.write_text("".join(f"{big.page_url(n)}\n" for n in range(1, BIG_URLS + 1)))
            fleet.submit({"name": "big", "seeds": {"files": [seeds.name]}})
            assert wait_for(lambda: fleet.state("big").state == "running", 30, 0.02), (
                fleet.state("big"), fleet.logs())
        submitted, submitted_ms = time.monotonic(), time.time() * 1000
        fleet.submit({"name": "small", "seeds": {"urls": urls}})
        fleet.wait_state("small", "finished", timeout_s=150)
        finished = time.monotonic()
        if big is not None:
            big_counters = fleet.counters("big")
            print(f"\nbig job meanwhile: {big_counters} ({len(big.log)} requests)", end="")
            assert big_counters.get("known") == BIG_URLS, big_counters
    finally:
        fleet.stop()
    records = fleet.records("small")
    assert sorted(r["url"] for r in records) == sorted(canonicalize(u) for u in urls)
    counters = fleet.counters("small")
    assert counters.get("known") == counters.get("results") == len(urls), counters
    times = [r.monotonic_s - submitted for site in small for r in site.log]
    started_s = (fleet.state("small").started - submitted_ms) / 1000
    return Timing(started_s, min(times), max(times), finished - submitted)


def test_a_500_url_job_behind_a_50000_url_job_finishes_within_a_quarter_more_than_alone(
        services, settings, redis_client, tmp_path, farm):
    small, big = farm
    alone = _small_job(services, settings, redis_client, tmp_path, small, None)
    crowded = _small_job(services, settings, redis_client, tmp_path, small, big)
    ratio = crowded.finished / alone.finished
    print(f"\n{SMALL_HOSTS * SMALL_PER_HOST} URLs on {SMALL_HOSTS} hosts at 2/s, from the "
          f"submission: alone {alone.line()}; behind {BIG_URLS:,} URLs of one host "
          f"{crowded.line()}: {ratio:.2f}x")
    assert ratio <= 1.25
