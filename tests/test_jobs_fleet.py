"""Jobs through the whole fleet (issue 26's Done when): RabbitMQ, Redis, two ``worker.py``
processes and ``scheduler.py run`` (whose job runner starts, seeds and finishes runs), jobs
submitted, paused, resumed and cancelled with ``scrape-fleet job``, judged by the loopback
sites' request logs (arrival and answer times), the results stream and each run's counters.

Two jobs at once keep their own pages, records and data while sharing one site's rate limit;
a cancelled job's fetches stop when the command returns (bar the requests already in flight)
and its dropped URLs are counted; a paused job sends nothing while the other goes on and
finishes every URL once resumed; kill -9 of a worker and of the runner mid-job loses nothing;
a scheduled job runs twice, each run numbered with its own counters, records, files-sink folder
and one webhook POST.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from common.broker import topology
from common.core.config import Settings
from common.core.urls import canonicalize
from common.jobs.registry import OUTCOMES, JobRef, JobRegistry, JobState, outcomes
from common.sink.files import FINAL_PREFIX, FINAL_SUFFIX, PART_PREFIX
from common.store.keys import JOBS_LEASE, SINKS
from devtools.testsite import RequestRecord, TestSite, start_sites
from tests.helpers import (
    REPO_ROOT,
    TEST_ENV,
    files_sink_process,
    output_of,
    own_channel,
    results,
    start_worker_process,
    wait_for,
)

pytestmark = pytest.mark.slow

WORKERS = 2
FETCH_LOOPS = 1  # each worker's (the default): how many admitted requests may be on their way
#: How late the in-process test sites may log a request (tests/test_adaptive_politeness.py).
SITE_LOG_TOLERANCE_S = 0.075
#: The job runner ticks fast and calls a run finished after half a second of quiet; workers
#: beat often, so the runner sees soon that none of a run's pages is in flight.
FLEET_ENV = {"JOB_TICK_S": "0.2", "JOB_QUIET_S": "0.5", "SCHEDULE_LEASE_S": "1",
             "HEARTBEAT_INTERVAL_S": "0.5", "JOB_WEBHOOK_HOSTS": "127.0.0.1",
             "FETCH_LOOPS": str(FETCH_LOOPS)}
R1 = [{"name": "r1", "path": r"^/page/\d+$", "fields": {"heading": "h1"}}]
R2 = [{"name": "r2", "path": r"^/page/\d+$",
       "fields": {"page_title": "title", "number": {"css": "h1", "type": "int",
                                                    "regex": r"(\d+)"}}}]


class Fleet:
    """Worker and scheduler processes of one test, and the ``scrape-fleet job`` command."""

    def __init__(self, settings: Settings, client: redis.Redis, folder: Path) -> None:
        self.settings, self.client, self.folder = settings, client, folder
        self.registry = JobRegistry(client)
        self.env = dict(FLEET_ENV)
        self.workers: list[subprocess.Popen] = []
        self.schedulers: dict[str, subprocess.Popen] = {}

    def start(self, workers: int = WORKERS, schedulers: Iterable[str] = ("jobs-a",),
              **env: str) -> Fleet:
        """Workers (8 pages at a time each) and schedulers with ``env`` over FLEET_ENV; a
        reader sink registered so that the scheduler's own sink trims no result."""
        self.env.update(env)
        self.client.sadd(SINKS, "fleet-test-reader")
        for _ in range(workers):
            self.workers.append(start_worker_process(
                self.settings, "--concurrency", "8",
                env={**self.env, "WORKER_ID": f"jobs-w{len(self.workers)}"}))
        for name in schedulers:
            self.start_scheduler(name)
        with own_channel(self.settings) as channel:
            ready = wait_for(lambda: channel.queue_declare(
                queue=topology.NORMAL_QUEUE, passive=True).method.consumer_count >= workers, 30)
        assert ready, self.logs()
        return self

    def start_scheduler(self, name: str) -> subprocess.Popen:
        """``python scheduler.py run`` (the job runner in it), its output in a file."""
        env = dict(os.environ, **TEST_ENV, RABBITMQ_URL=self.settings.rabbitmq_url,
                   REDIS_URL=self.settings.redis_url, PYTHONUNBUFFERED="1")
        env.update(self.env, WORKER_ID=name)
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen([sys.executable, "scheduler.py", "run"], cwd=REPO_ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        proc.log_file = log  # type: ignore[attr-defined]
        self.schedulers[name] = proc
        return proc

    def job(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``scrape-fleet job ARGS`` against the test services; it must exit 0."""
        env = dict(os.environ, **TEST_ENV, RABBITMQ_URL=self.settings.rabbitmq_url,
                   REDIS_URL=self.settings.redis_url, PYTHONUNBUFFERED="1")
        env.update(self.env)
        done = subprocess.run([sys.executable, "-m", "common.ops.console", "job", *args],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (args, done.returncode, done.stdout[-2000:],
                                      done.stderr[-3000:])
        return done

    def submit(self, spec: dict[str, Any]) -> None:
        path = self.folder / f"{spec['name']}.yml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        self.job("submit", str(path))

    def state(self, name: str) -> JobState:
        return self.registry.state(name)

    def counters(self, name: str, run: int = 1) -> dict[str, int]:
        return self.registry.counters(JobRef(name, run))

    def wait_state(self, name: str, state: str, run: int = 1, timeout_s: float = 60) -> None:
        """Wait for run ``run`` of ``name`` to be in ``state``; the evidence when it is not."""
        def there() -> bool:
            now = self.state(name)
            return now.run > run or (now.run == run and now.state == state)

        assert wait_for(there, timeout_s, 0.1), (self.state(name), self.counters(name, run),
                                                 self.logs())

    def records(self, name: str, run: int = 1) -> list[dict]:
        return [r for r in results(self.client) if r.get("job") == name and r.get("run") == run]

    def logs(self) -> dict[str, str]:
        """The last lines each process printed, for a failure's message."""
        procs = {**{f"worker {i}": p for i, p in enumerate(self.workers)}, **self.schedulers}
        return {name: output_of(proc)[-2500:] for name, proc in procs.items()}

    def stop(self) -> None:
        """SIGTERM to every process still running (finish, give up the lease), then kill."""
        procs = [*self.workers, *self.schedulers.values()]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def fleet(settings, redis_client, tmp_path) -> Iterator[Fleet]:
    started = Fleet(settings, redis_client, tmp_path)
    try:
        yield started
    finally:
        started.stop()


def _pages(site: TestSite) -> list[RequestRecord]:
    """The site's requests but robots.txt, oldest first."""
    return [r for r in site.log if r.path != "/robots.txt"]


def _min_gap(times: list[float], amount: int) -> float:
    """Shortest time in which the site saw amount + 1 requests (>= the window when polite)."""
    return min((times[i + amount] - times[i] for i in range(len(times) - amount)), default=9.9)


def _once_each(records: list[dict], urls: Iterable[str]) -> None:
    """Exactly one record for each of ``urls`` and none for anything else."""
    expected = Counter(canonicalize(u) for u in urls)
    got = Counter(r["url"] for r in records)
    assert got == expected, {"missing": sorted(expected - got), "extra": sorted(got - expected)}


def _all_accounted(counters: dict[str, int], known: int) -> None:
    assert counters.get("known") == known, counters
    assert outcomes(counters) == known, counters  # each known URL has its one outcome


def _number(url: str) -> int:
    return int(url.rstrip("/").rsplit("/", 1)[1])


def test_two_jobs_at_once_get_their_own_pages_once_with_their_own_data_and_share_a_sites_rate(
        fleet, own_sites):
    shared, a_only, b_only = start_sites(3, first_host="127.0.26.1", pages=40)
    own_sites.extend([shared, a_only, b_only])
    rate, lead_s = 4, 1
    # The fleet's limit on the shared site; the jobs' own paces (deferral: DEFER_LEAD_S on)
    # under the fleet's 1000/s on the others.
    fleet.start(RATE_LIMITS=f"{shared.host}={rate}/second", DEFER_LEAD_S=str(lead_s))
    # alpha: crawl to depth 1 from page 1 of two sites: page 1, the pages it links, the index
    alpha = {canonicalize(u) for site in (shared, a_only)
             for u in [site.page_url(1), site.url("/"),
                       *(site.page_url(m) for m in site.links_of(1))]}
    overlap = shared.links_of(1)[:3]  # bravo's seeds alpha reaches too
    only_bravo = [m for m in range(2, 41) if m not in shared.links_of(1)][:3]
    bravo = [shared.page_url(m) for m in [1, *overlap, *only_bravo]] + [
        b_only.page_url(m) for m in range(1, 11)]
    fleet.submit({"name": "alpha", "seeds": {"urls": [shared.page_url(1), a_only.page_url(1)]},
                  "crawl": {"max_depth": 1}, "rules": R1,
                  "politeness": {"rate_limit": f"{rate}/second"}})
    fleet.submit({"name": "bravo", "seeds": {"urls": bravo}, "rules": R2,
                  "politeness": {"rate_limit": "2/second"}})
    fleet.wait_state("alpha", "finished")
    fleet.wait_state("bravo", "finished")

    records = {name: fleet.records(name) for name in ("alpha", "bravo")}
    _once_each(records["alpha"], alpha)
    _once_each(records["bravo"], bravo)
    assert {r.get("job") for r in results(fleet.client)} == {"alpha", "bravo"}
    for record in records["alpha"]:  # R1's data on alpha's pages, R2's on bravo's
        if "/page/" in record["url"]:
            assert record["data"] == {"heading": f"Page {_number(record['url'])}"}, record
        else:
            assert "data" not in record, record  # the index matches no rule
    for record in records["bravo"]:
        n = _number(record["url"])
        assert record["data"] == {"page_title": f"Page {n}", "number": n}, record
    for name, urls in (("alpha", alpha), ("bravo", bravo)):
        counters = fleet.counters(name)
        _all_accounted(counters, len(urls))
        assert counters.get("results") == len(urls), counters
        # `scrape-fleet job results NAME`: the same records, the job's own
        shown = [json.loads(line) for line in fleet.job("results", name).stdout.splitlines()]
        _once_each(shown, urls)
        assert {(r["job"], r["run"]) for r in shown} == {(name, 1)}

    # Every shared URL either job wanted was fetched (the response cache may serve the second
    # job's copy), and the shared site never saw more than its rate in any 1 s window.
    seen = _pages(shared)
    wanted = {u for u in alpha | {canonicalize(u) for u in bravo} if shared.netloc in u}
    assert {canonicalize(shared.url(r.path)) for r in seen} == wanted
    times = [r.monotonic_s for r in seen]
    gap = _min_gap(times, rate)
    print(f"\nshared site: {len(times)} requests in {times[-1] - times[0]:.2f} s, the shortest "
          f"span of {rate + 1} requests {gap:.3f} s")
    assert len(times) > 2 * rate and gap >= 1.0 - SITE_LOG_TOLERANCE_S, gap
    # bravo's own pace, 2/s, on its own site: its 10 pages over 4.5 s less the lead (the first
    # lead x rate URLs go at once) less the first one's trip from the runner to the site (half
    # a second at most), where the fleet's 1000/s would take a blink.
    own = [r.monotonic_s for r in _pages(b_only)]
    print(f"bravo's site: {len(own)} requests in {own[-1] - own[0]:.2f} s")
    assert own[-1] - own[0] >= (len(own) - 1) / 2 - lead_s - 0.5, own


def _in_flight(site: TestSite, at: float) -> list[RequestRecord]:
    """The site's requests that had arrived at ``at`` and were not answered yet."""
    answered = {id(record): end for record, end in site.answered}
    return [r for r in site.log if r.monotonic_s <= at < answered.get(id(r), float("inf"))]


def test_a_cancelled_job_stops_its_fetches_when_the_command_returns_and_the_other_finishes(
        fleet, own_sites):
    slow = TestSite("127.0.26.11", pages=200, latency_s=0.15).start()
    steady = TestSite("127.0.26.12", pages=60).start()
    own_sites.extend([slow, steady])
    fleet.start(RATE_LIMITS=f"{slow.host}=4/second,{steady.host}=4/second")
    doomed = [slow.page_url(n) for n in range(1, 121)]
    kept = [steady.page_url(n) for n in range(1, 31)]
    fleet.submit({"name": "doomed", "seeds": {"urls": doomed}})
    fleet.submit({"name": "kept", "seeds": {"urls": kept}})
    assert wait_for(lambda: len(_pages(slow)) >= 10, 60, 0.02), fleet.logs()
    fleet.job("cancel", "doomed")
    returned = time.monotonic()
    in_flight = _in_flight(slow, returned)
    fleet.wait_state("kept", "finished")
    # Every URL of the cancelled run gets its outcome: the queued ones dropped as cancelled.
    assert wait_for(lambda: outcomes(fleet.counters("doomed")) >= len(doomed), 30, 0.1), (
        fleet.counters("doomed"), fleet.logs())
    time.sleep(1)  # anything still to come would come now

    late = [r for r in _pages(slow) if r.monotonic_s > returned]
    fetched = {canonicalize(slow.url(r.path)) for r in _pages(slow)}
    print(f"\ncancelled after {len(fetched)} of {len(doomed)} pages: {len(in_flight)} in flight "
          f"when the command returned, {len(late)} requests after it "
          f"({[round(r.monotonic_s - returned, 3) for r in late]} s)")
    # Only what was already admitted may still reach the site: a fetch loop's request on its
    # way, at most one a fetch loop of each worker.
    assert len(late) <= FETCH_LOOPS * WORKERS, [(r.path, r.monotonic_s - returned) for r in late]
    assert fleet.state("doomed").state == "cancelled"
    counters = fleet.counters("doomed")
    _all_accounted(counters, len(doomed))
    _once_each(fleet.records("doomed"), fetched)  # what it fetched is kept, once each
    assert counters.get("results") == len(fetched), counters
    assert counters.get("cancelled") == len(doomed) - len(fetched) > 0, counters
    assert not counters.get("failed") and not counters.get("expired"), counters

    _once_each(fleet.records("kept"), kept)
    _all_accounted(fleet.counters("kept"), len(kept))


def test_a_paused_job_sends_nothing_while_the_other_goes_on_and_once_resumed_finishes_each_url_once(
        fleet, own_sites):
    paused, going = start_sites(2, first_host="127.0.26.21", pages=60)
    own_sites.extend([paused, going])
    fleet.start(RATE_LIMITS=f"{paused.host}=4/second,{going.host}=4/second")
    waits = [paused.page_url(n) for n in range(1, 25)]
    goes = [going.page_url(n) for n in range(1, 41)]
    fleet.submit({"name": "waits", "seeds": {"urls": waits}})
    fleet.submit({"name": "goes", "seeds": {"urls": goes}})
    assert wait_for(lambda: len(_pages(paused)) >= 6, 60, 0.02), fleet.logs()
    fleet.job("pause", "waits")
    paused_at = time.monotonic()
    time.sleep(2.5)
    assert fleet.state("waits").state == "paused"
    resumed_at = time.monotonic()
    fleet.job("resume", "waits")
    fleet.wait_state("waits", "finished")
    fleet.wait_state("goes", "finished")

    during = [r.monotonic_s - paused_at for r in _pages(paused)
              if paused_at < r.monotonic_s < resumed_at]
    others = [r for r in _pages(going) if paused_at < r.monotonic_s < resumed_at]
    print(f"\npaused {resumed_at - paused_at:.1f} s: {len(during)} requests for it after the "
          f"command returned ({[round(t, 3) for t in during]} s), {len(others)} for the other")
    # In flight when the command returned: at most one a fetch loop, arriving at once; then
    # nothing for the rest of the pause.
    assert len(during) <= FETCH_LOOPS * WORKERS and all(t < 0.5 for t in during), during
    assert len(others) >= 6  # the other job went on at its site's 4/s
    counters = fleet.counters("waits")
    assert counters.get("paused", 0) > 0, counters  # its queued messages were parked
    _once_each(fleet.records("waits"), waits)
    _all_accounted(counters, len(waits))
    assert counters.get("results") == len(waits), counters
    assert Counter(r.path for r in _pages(paused)) == Counter(f"/page/{n}" for n in range(1, 25))
    _once_each(fleet.records("goes"), goes)


def test_kill_9_of_a_worker_and_of_the_job_runner_mid_job_loses_nothing_and_the_run_finishes(
        fleet, own_sites):
    sites = start_sites(3, first_host="127.0.26.31", pages=1000)
    own_sites.extend(sites)
    urls = [site.page_url(n) for site in sites for n in range(1, 1001)]
    # The runner seeds 200 URLs a batch (a confirm each): 15 batches to catch it in
    fleet.start(schedulers=["jobs-a"], PRODUCER_BATCH="200")
    assert wait_for(lambda: fleet.client.get(JOBS_LEASE) is not None, 20, 0.02), fleet.logs()
    fleet.start_scheduler("jobs-b")  # stands by while jobs-a holds the lease
    fleet.submit({"name": "sturdy", "seeds": {"urls": urls}})

    def seeding() -> bool:  # some of its seeds published, not all
        now = fleet.state("sturdy")
        return (now.state == "running" and now.seeded != now.run
                and fleet.counters("sturdy").get("known", 0) > 0)

    caught = wait_for(seeding, 20, 0.001)
    fleet.schedulers["jobs-a"].kill()
    assert fleet.schedulers["jobs-a"].wait(10) == -signal.SIGKILL
    known_at_kill = fleet.counters("sturdy").get("known", 0)
    assert wait_for(lambda: len(fleet.records("sturdy")) >= len(urls) // 3, 60, 0.05), (
        fleet.counters("sturdy"), fleet.logs())
    fleet.workers[0].kill()
    assert fleet.workers[0].wait(10) == -signal.SIGKILL
    recorded_at_kill = len(fleet.records("sturdy"))
    # The replica seeded the rest and leads; killed too, mid-job, a third one finishes the run.
    assert wait_for(lambda: b"jobs-b" in (fleet.client.get(JOBS_LEASE) or b"")
                    and fleet.state("sturdy").seeded == 1, 20, 0.02), (
        fleet.state("sturdy"), fleet.logs())
    fleet.start_scheduler("jobs-c")
    fleet.schedulers["jobs-b"].kill()
    assert fleet.schedulers["jobs-b"].wait(10) == -signal.SIGKILL
    recorded_at_second_kill = len(fleet.records("sturdy"))
    fleet.wait_state("sturdy", "finished", timeout_s=120)
    held = (fleet.client.get(JOBS_LEASE) or b"").decode()
    print(f"\nrunner killed {'mid-seeding' if caught else 'after seeding'} ({known_at_kill} of "
          f"{len(urls)} known), a worker killed at {recorded_at_kill} records, the second "
          f"runner at {recorded_at_second_kill}; lease {held!r}")

    assert caught, "the run was never seen seeding: nothing was killed mid-seeding"
    assert 0 < known_at_kill < len(urls)
    assert recorded_at_second_kill < len(urls)  # the second runner died mid-job
    assert "jobs-c" in held  # the last replica took the runner over
    _once_each(fleet.records("sturdy"), urls)
    counters = fleet.counters("sturdy")
    _all_accounted(counters, len(urls))
    assert counters.get("results") == len(urls), counters
    assert not any(counters.get(k) for k in OUTCOMES if k != "results"), counters


def _sink_lines(folder: Path) -> list[dict]:
    """Every line of the files sink's parts in ``folder``, finalized or still open."""
    out: list[dict] = []
    for path in sorted(folder.glob(f"{FINAL_PREFIX}*{FINAL_SUFFIX}")) + sorted(
            folder.glob(f"{PART_PREFIX}*")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            out += [json.loads(line) for line in handle]
    return out


def test_a_scheduled_job_runs_twice_each_run_numbered_with_its_own_results_and_one_webhook(
        fleet, settings, own_sites, tmp_path):
    site = TestSite("127.0.26.41", pages=10).start()
    hooks = TestSite("127.0.0.1", pages=1).start()
    own_sites.extend([site, hooks])
    hooks.route("/hook", lambda _r: (200, {"Content-Type": "text/plain"}, b"thanks"))
    urls = [site.page_url(n) for n in range(1, 6)]
    sink_dir = tmp_path / "sink"
    run_dirs = {n: sink_dir / "jobs" / "nightly" / f"run-{n}" for n in (1, 2)}

    def posts() -> list[dict]:
        return [json.loads(r.body) for r in hooks.log if r.method == "POST"]

    with files_sink_process(settings, sink_dir, tmp_path / "sink.log"):
        fleet.start()
        fleet.submit({"name": "nightly", "seeds": {"urls": urls}, "schedule": {"every": "3s"},
                      "webhooks": [hooks.url("/hook")]})
        fleet.wait_state("nightly", "finished", run=2, timeout_s=40)
        assert wait_for(lambda: {p.get("run") for p in posts()} >= {1, 2}, 20, 0.1), (
            posts(), fleet.logs())
        sunk = wait_for(lambda: all(len(_sink_lines(d)) >= len(urls)
                                    for d in run_dirs.values()), 20, 0.1)
        fleet.stop()  # no third run from here on
    assert sunk, (tmp_path / "sink.log").read_text()[-3000:]
    state = fleet.state("nightly")
    finished = [n for n in range(1, state.run + 1)
                if n < state.run or state.state == "finished"]
    calls = posts()
    print(f"\n{state.run} runs, {len(calls)} webhook calls: {calls}")
    assert all(p.get("job") == "nightly" and p.get("state") == "finished" for p in calls), calls
    # One POST a finished run, none for a run that did not finish
    assert Counter(p.get("run") for p in calls) == Counter(finished), calls
    runs = {n: fleet.counters("nightly", n) for n in (1, 2)}
    for n, counters in runs.items():
        _once_each(fleet.records("nightly", n), urls)
        _all_accounted(counters, len(urls))
        assert counters.get("results") == len(urls), (n, counters)
        [call] = [p for p in calls if p.get("run") == n]
        assert call["counters"]["known"] == call["counters"]["results"] == len(urls), call
        # The files sink wrote each run's records to its own folder, once each
        lines = _sink_lines(run_dirs[n])
        assert all(line["job"] == "nightly" and line["run"] == n for line in lines), lines
        _once_each(lines, urls)
    # The second run started on the schedule: 3 s after the first (or after its end), not before
    gap_ms = runs[2]["started"] - runs[1]["started"]
    assert 3000 - 250 <= gap_ms <= 3000 + (runs[1]["ended"] - runs[1]["started"]) + 2000, runs
