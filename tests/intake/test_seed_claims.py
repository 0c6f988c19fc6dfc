"""Seeds in crawl mode are fetched once: the producer claims a seed before any worker can see
it, so a page linking to it (itself, in the worst case) counts it as a duplicate even while the
seed's confirm is still on its way. The producer runs as ``producer.py`` in a subprocess,
slowed down after its confirms by a sitecustomize module (no test hook in the product code):
the moment a slow broker confirm or a long batch opens in production."""

from __future__ import annotations

import textwrap
import time
from collections import Counter

import pytest

from devtools.testsite import TestSite
from tests.helpers import REPO_ROOT, WorkerThread, results

SEEDS = 5
#: How long the producer sits between its batch's confirms and marking the batch seen.
SLOW_MARK_S = 4.0


def slow_after_confirms(tmp_path, delay_s: float) -> str:
    """A PYTHONPATH entry whose sitecustomize sleeps ``delay_s`` after every confirm wait."""
    folder = tmp_path / "slow"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import time
        from common.broker import publisher

        _wait = publisher.ConfirmingPublisher.wait

        def wait(self, *args, **kwargs):
            confirms = _wait(self, *args, **kwargs)
            time.sleep({delay_s!r})
            return confirms

        publisher.ConfirmingPublisher.wait = wait
    """))
    return f"{folder}:{REPO_ROOT}"


@pytest.fixture
def self_linking_site():
    """Pages /self/N that link to themselves and to nothing else."""
    with TestSite("127.0.0.11", pages=1) as site:
        for n in range(SEEDS):
            site.route(f"/self/{n}", lambda _r, n=n: (
                200, {"Content-Type": "text/html"},
                f'<html><body><a href="/self/{n}">me</a></body></html>'.encode()))
        yield site


def test_a_seed_linking_to_itself_is_fetched_once_although_its_confirm_is_slow(
        settings, redis_client, run_cli, self_linking_site, tmp_path):
    site = self_linking_site
    crawl = settings.with_overrides(crawl_enabled=True, crawl_max_depth=2,
                                    idle_exit_s=SLOW_MARK_S + 2, concurrency=4)
    seeds = [site.url(f"/self/{n}") for n in range(SEEDS)]
    with WorkerThread(crawl) as worker:
        produced = run_cli("producer.py", *seeds, "--json",
                           env={"CRAWL_ENABLED": "1",
                                "PYTHONPATH": slow_after_confirms(tmp_path, SLOW_MARK_S)})
        finished = time.monotonic()
        assert produced.returncode == 0, produced.stderr[-2000:]
        assert '"new": 5' in produced.stdout
        # The window is open: the worker fetched a seed (and so read its link) while the
        # producer had the confirms but had not marked the batch seen yet.
        first = min(r.monotonic_s for r in site.log if r.path.startswith("/self/"))
        assert first < finished - SLOW_MARK_S / 2
        assert worker.join(60) == 0
    fetched = Counter(r.path for r in site.log if r.path != "/robots.txt")
    assert fetched == {f"/self/{n}": 1 for n in range(SEEDS)}, "each seed fetched once"
    records = results(redis_client)
    assert sorted(r["url"] for r in records) == sorted(seeds)
    assert [r["url"] for r in records if r.get("followed")] == [], \
        "a seed's link to itself was published again"

