"""kill -9 of the producer at each step of a batch: claim → publish → confirm → mark seen (and
drop the claims, in the same script). Whatever the step, no URL is seen without a confirmed
message, a page never publishes a URL a producer has claimed, and rerunning the same input gets
every URL exactly one result (and in crawl mode, every seed one fetch). The kill is injected in
a subprocess through a sitecustomize module that wraps the publisher (no test hook in the
product code)."""

from __future__ import annotations

import signal
import textwrap
from collections import Counter

import pytest

from common.core.urls import fingerprint
from common.intake.producer import Producer
from common.store.dedupe import PRODUCER_TOKEN_PREFIX, SeenSet
from common.store.keys import claim_key
from devtools.testsite import TestSite
from tests.helpers import REPO_ROOT, WorkerThread, _drained, results, wait_for

#: Where the producer dies, in its second batch of 10: (wrapped publisher method, its call
#: number, before or after the call). Claimed but nothing published; published but not
#: confirmed; confirmed but not marked seen.
KILL_POINTS = {
    "after_claiming_before_publishing": ("publish", 11, "before"),
    "after_publish_before_confirm": ("wait", 2, "before"),
    "after_confirm_before_marking_seen": ("wait", 2, "after"),
}


def _killing_sitecustomize(tmp_path, point: str) -> str:
    method, call, when = KILL_POINTS[point]
    folder = tmp_path / "inject"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import os, signal
        from common.broker import publisher

        _original = publisher.ConfirmingPublisher.{method}
        _calls = []

        def wrapped(self, *args, **kwargs):
            _calls.append(1)
            if len(_calls) == {call} and {when!r} == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            answer = _original(self, *args, **kwargs)
            if len(_calls) == {call} and {when!r} == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return answer

        publisher.ConfirmingPublisher.{method} = wrapped
    """))
    return f"{folder}:{REPO_ROOT}"


def _after_the_kill(settings, redis_client, urls: list[str]) -> None:
    """The state a kill leaves: the first batch seen, the killed one not (whether or not its
    messages got through), and a page linking a killed-batch URL skips it while the dead
    producer's claim lasts."""
    seen = SeenSet(redis_client, settings.seen_buckets)
    fps = [fingerprint(url) for url in urls]
    assert seen.contains_many(fps[:10]) == [True] * 10
    assert seen.contains_many(fps[10:]) == [False] * 10, "seen without a confirmed message"
    holders = {redis_client.get(claim_key(fp.hex)) for fp in fps[10:]}
    assert len(holders) == 1 and holders.pop().startswith(PRODUCER_TOKEN_PREFIX.encode())
    with Producer(settings, redis_client) as page_producer:
        page = page_producer.submit(urls[10:11], claim_token="done:0:42")
    assert (page.new, page.duplicate) == (0, 1), "a page published a URL a producer claimed"


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_producer_killed_mid_batch_and_rerun_gets_every_url_exactly_one_result(
        point, settings, redis_client, run_cli, site, tmp_path):
    urls = [site.page_url(n) for n in range(1, 21)]
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(f"{url}\n" for url in urls))

    killed = run_cli("producer.py", "-f", str(listing),
                     env={"PRODUCER_BATCH": "10",
                          "PYTHONPATH": _killing_sitecustomize(tmp_path, point)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    _after_the_kill(settings, redis_client, urls)

    rerun = run_cli("producer.py", "-f", str(listing), "--json",
                    env={"PRODUCER_BATCH": "10"})
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    # The first batch was confirmed and marked before the kill: the rerun skips it. The
    # killed batch was never marked seen, and its claims were a dead producer's: the rerun
    # takes them over and publishes it (again, if it got through).
    assert '"new": 10, "duplicate": 10' in rerun.stdout

    with WorkerThread(settings.with_overrides(idle_exit_s=1.5, concurrency=4)) as worker:
        assert worker.join(60) == 0
    recorded = [r["url"] for r in results(redis_client)]
    assert sorted(recorded) == sorted(urls), "every URL exactly one result"


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_in_crawl_mode_seeds_linking_to_themselves_are_fetched_once_across_a_producer_kill(
        point, settings, redis_client, run_cli, tmp_path):
    with TestSite("127.0.0.12", pages=1) as site:
        for n in range(20):
            site.route(f"/self/{n}", lambda _r, n=n: (
                200, {"Content-Type": "text/html"},
                f'<html><body><a href="/self/{n}">me</a></body></html>'.encode()))
        urls = [site.url(f"/self/{n}") for n in range(20)]
        crawl = settings.with_overrides(crawl_enabled=True, idle_exit_s=6, concurrency=4)
        with WorkerThread(crawl) as worker:  # running while the producer publishes and dies
            killed = run_cli("producer.py", *urls,
                             env={"PRODUCER_BATCH": "10", "CRAWL_ENABLED": "1",
                                  "PYTHONPATH": _killing_sitecustomize(tmp_path, point)})
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
            # What got through before the kill is fetched, its links read and skipped.
            assert wait_for(lambda: _drained(settings) and not worker.worker.ledger.inflight
                            and site.count("/self/0") == 1, timeout_s=20)
            assert worker.join(60) == 0
        rerun = run_cli("producer.py", *urls, "--json",
                        env={"PRODUCER_BATCH": "10", "CRAWL_ENABLED": "1"})
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        with WorkerThread(crawl.with_overrides(idle_exit_s=1.5)) as worker:
            assert worker.join(60) == 0
        fetched = Counter(r.path for r in site.log if r.path != "/robots.txt")
    assert fetched == {f"/self/{n}": 1 for n in range(20)}, "each seed fetched once"
    records = results(redis_client)
    assert sorted(r["url"] for r in records) == sorted(urls)
    assert [r["url"] for r in records if r.get("followed")] == []
