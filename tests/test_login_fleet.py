"""A form-login site crawled by the whole fleet (issue 28's Done when): RabbitMQ, Redis and two
``worker.py`` processes, the login declared fleet-wide (SESSION_LOGIN=@login.yml) or by a job
(``session.login``, submitted with ``scrape-fleet job submit``), the password in the workers'
environment only.

The members' site (tests/web/test_login.MembersSite) answers 403 to every member page without
the cookie its login sets on a 302, and wants its CSRF token back. Judged by the site's request
log (how many login POSTs, the Cookie headers another site saw) and the results stream (every
member page once, 200, from both workers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from common.broker import topology
from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.store.keys import SINKS
from devtools.testsite import TestSite
from tests.helpers import (
    REPO_ROOT,
    TEST_ENV,
    output_of,
    own_channel,
    results,
    start_worker_process,
    wait_for,
)
from tests.web.test_login import PASSWORD, USER, MembersSite

pytestmark = pytest.mark.slow

WORKERS = 2
SECRET_ENV = "LOGIN_TEST_PASSWORD"
#: Quick heartbeats and job ticks so the job runner sees a run end soon.
FLEET_ENV = {"JOB_TICK_S": "0.2", "JOB_QUIET_S": "0.5", "SCHEDULE_LEASE_S": "1",
             "HEARTBEAT_INTERVAL_S": "0.5", "CRAWL_MAX_DEPTH": "2"}


class LoginFleet:
    """Two workers (the password in their environment only), a scheduler when a job needs
    one, the members' site on 127.0.28.1 and another site on 127.0.28.2 it links to."""

    def __init__(self, settings: Settings, client: redis.Redis, folder: Path,
                 sites: list[TestSite]) -> None:
        self.settings, self.client, self.folder = settings, client, folder
        self.members_site = TestSite("127.0.28.1", pages=3).start()
        self.other = TestSite("127.0.28.2", pages=3).start()
        sites.extend([self.members_site, self.other])
        self.members = MembersSite(self.members_site, pages=12,
                                   outside=(self.other.page_url(1),))
        self.procs: dict[str, subprocess.Popen] = {}

    def login_file(self, **extra: object) -> Path:
        path = self.folder / "login.yml"
        path.write_text(yaml.safe_dump({**self.members.spec(), **extra}))
        return path

    def _env(self) -> dict[str, str]:
        hosts = f"{self.members_site.host},{self.other.host}"
        return {**FLEET_ENV, "CRAWL_ALLOWED_DOMAINS": hosts}

    def start_workers(self, **env: str) -> None:
        for n in range(WORKERS):
            self.procs[f"login-w{n}"] = start_worker_process(
                self.settings, "--concurrency", "4",
                env={**self._env(), **env, SECRET_ENV: PASSWORD, "WORKER_ID": f"login-w{n}"})
        with own_channel(self.settings) as channel:
            ready = wait_for(lambda: channel.queue_declare(
                queue=topology.NORMAL_QUEUE, passive=True).method.consumer_count >= WORKERS, 30)
        assert ready, self.logs()
        for proc in self.procs.values():
            assert PASSWORD not in " ".join(proc.args)  # env, never the command line

    def start_scheduler(self) -> None:
        """``scheduler.py run`` (its job runner); a reader sink registered so that the
        scheduler's own sink trims no result before the test reads it."""
        self.client.sadd(SINKS, "login-test-reader")
        env = dict(self._plain_env(), WORKER_ID="login-jobs")
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen([sys.executable, "scheduler.py", "run"], cwd=REPO_ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        proc.log_file = log  # type: ignore[attr-defined]
        self.procs["scheduler"] = proc

    def _plain_env(self) -> dict[str, str]:
        """The environment of every process but the workers: without the password."""
        env = dict(os.environ, **TEST_ENV, **self._env(), RABBITMQ_URL=self.settings.rabbitmq_url,
                   REDIS_URL=self.settings.redis_url, PYTHONUNBUFFERED="1")
        env.pop(SECRET_ENV, None)
        return env

    def submit(self, job: dict[str, object]) -> None:
        path = self.folder / f"{job['name']}.yml"
        path.write_text(yaml.safe_dump(job, sort_keys=False))
        done = subprocess.run([sys.executable, "-m", "common.ops.console", "job", "submit",
                               str(path)], cwd=REPO_ROOT, env=self._plain_env(),
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])

    def seed(self, urls: list[str]) -> None:
        with Producer(self.settings, self.client) as producer:
            assert producer.submit(urls).new == len(urls)

    def wanted(self) -> set[str]:
        return {canonicalize(u) for u in [*self.members.member_urls(), self.other.page_url(1)]}

    def crawled(self, job: str | None = None, timeout_s: float = 90) -> list[dict]:
        """The records once every member page and the other site's page has one."""
        def mine() -> list[dict]:
            return [r for r in results(self.client) if job is None or r.get("job") == job]

        assert wait_for(lambda: {r["url"] for r in mine()} >= self.wanted(), timeout_s, 0.1), (
            sorted(self.wanted() - {r["url"] for r in mine()}), self.failures(), self.logs())
        time.sleep(1)  # a duplicate would come now
        return mine()

    def failures(self) -> list[dict]:
        return [json.loads(f[b"json"]) for _id, f in self.client.xrange("failures")]

    def logs(self) -> dict[str, str]:
        return {name: output_of(proc)[-2500:] for name, proc in self.procs.items()}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def fleet(settings, redis_client, tmp_path, own_sites,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[LoginFleet]:
    monkeypatch.delenv(SECRET_ENV, raising=False)  # only the workers have it
    started = LoginFleet(settings, redis_client, tmp_path, own_sites)
    try:
        yield started
    finally:
        started.stop()


def _check_crawl(fleet: LoginFleet, records: list[dict], sessions: int) -> None:
    """Every member page once with 200 from both workers, ``sessions`` logins, no secret
    anywhere, no cookie sent to the other site."""
    members = fleet.members
    urls = Counter(r["url"] for r in records)
    assert max(urls.values()) == 1, urls  # once each
    assert {u for u in urls if fleet.members_site.netloc in u} == {
        canonicalize(u) for u in members.member_urls()}, urls
    assert canonicalize(fleet.other.page_url(1)) in urls  # (with the pages it links to)
    member = [r for r in records if "/members/" in r["url"]]
    assert {r["status"] for r in member} == {200}, [(r["url"], r["status"]) for r in member]
    assert {r["worker"] for r in member} == set(fleet.procs) - {"scheduler"}, Counter(
        r["worker"] for r in member)  # the one session served both workers
    posts = members.login_posts()
    print(f"\n{len(member)} member pages, {len(posts)} login POSTs, "
          f"{len(members.sessions)} sessions: {Counter(r['worker'] for r in member)}")
    assert len(members.sessions) == sessions and len(posts) == sessions, (posts, fleet.logs())
    for post in posts:  # the CSRF token of a login page this session fetched went back
        assert any(f"csrf_token={token}" in post.body.decode() for token in members.tokens)
    assert not [r for r in fleet.members_site.log if r.path == "/members/session"
                and r.method != "POST"]
    # The other site: fetched, never sent the members' cookies, never asked to log in.
    other = [r for r in fleet.other.log if r.path != "/robots.txt"]
    assert other and not [r for r in other if "Cookie" in r.headers or r.method == "POST"]
    stored = b"".join(v for _id, f in fleet.client.xrange("results") for v in f.values())
    assert PASSWORD.encode() not in stored
    assert not any(PASSWORD in log for log in fleet.logs().values())


def test_a_form_login_site_is_crawled_fully_by_two_workers_sharing_one_logged_in_session(fleet):
    login = fleet.login_file(success={"css": "a.logout-hint"})
    fleet.start_workers(SESSION_LOGIN=f"@{login}", CRAWL_ENABLED="true")
    fleet.seed([fleet.members.member_urls()[0]])
    records = fleet.crawled()
    _check_crawl(fleet, records, sessions=1)
    assert not fleet.failures()


def test_each_session_of_a_pool_logs_in_once(fleet):
    login = fleet.login_file()
    fleet.start_workers(SESSION_LOGIN=f"@{login}", CRAWL_ENABLED="true", SESSION_POOL_SIZE="2")
    fleet.seed([fleet.members.member_urls()[0]])
    records = fleet.crawled()
    _check_crawl(fleet, records, sessions=2)


def test_a_wrong_password_dead_letters_the_pages_as_login_failed_without_showing_it(fleet):
    fleet.members.password = "another " + PASSWORD  # the site's changed: ours is wrong now
    login = fleet.login_file()
    fleet.start_workers(SESSION_LOGIN=f"@{login}")
    urls = fleet.members.member_urls()[:4]
    fleet.seed(urls)
    assert wait_for(lambda: {f["url"] for f in fleet.failures()} >= {canonicalize(u) for u in urls},
                    60, 0.1), (fleet.failures(), fleet.logs())
    failures = fleet.failures()
    assert {f["failure"] for f in failures} == {"login_failed"}, failures
    assert all("success check failed" in f.get("last_error", "") for f in failures), failures
    assert PASSWORD not in json.dumps(failures)
    # the failed login is not tried again for every page: once for the one session
    assert len(fleet.members.login_posts()) == 1, fleet.members.login_posts()
    assert not fleet.members.sessions
    assert not any(PASSWORD in log for log in fleet.logs().values())


def test_a_job_declares_its_login_and_the_workers_read_its_password_from_their_environment(
        fleet):
    fleet.start_workers()  # no SESSION_LOGIN: the job's own login
    fleet.start_scheduler()
    fleet.submit({"name": "members", "seeds": {"urls": [fleet.members.member_urls()[0]]},
                  "crawl": {"max_depth": 2,
                            "allowed_domains": [fleet.members_site.host, fleet.other.host]},
                  "session": {"login": {
                      "url": fleet.members.login_url, "form": "form#login",
                      "fields": {"user": USER, "password": {"env": SECRET_ENV}},
                      "success": {"cookie": "member", "text": "signed in"}}}})
    records = fleet.crawled(job="members")
    _check_crawl(fleet, records, sessions=1)
    assert {r["job"] for r in records} == {"members"}
