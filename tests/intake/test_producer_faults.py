"""kill -9 of the producer at the worst moments of a batch: rerunning the same input gets every
URL exactly one result. The kill is injected in a subprocess through a sitecustomize module
that wraps the publisher (no test hook in the product code)."""

from __future__ import annotations

import signal
import textwrap

import pytest

from tests.helpers import WorkerThread, results

#: Where the producer dies: with its second batch published but not confirmed yet, or
#: confirmed but not yet marked seen.
KILL_POINTS = {
    "after_publish_before_confirm": "before",
    "after_confirm_before_marking_seen": "after",
}


def _killing_sitecustomize(tmp_path, when: str) -> str:
    folder = tmp_path / "inject"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import os, signal
        from common.broker import publisher

        _wait = publisher.ConfirmingPublisher.wait
        _calls = []

        def wait(self, *args, **kwargs):
            _calls.append(1)
            if len(_calls) == 2 and {when!r} == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            confirms = _wait(self, *args, **kwargs)
            if len(_calls) == 2 and {when!r} == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return confirms

        publisher.ConfirmingPublisher.wait = wait
    """))
    return str(folder)


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_producer_killed_mid_batch_and_rerun_gets_every_url_exactly_one_result(
        point, settings, redis_client, run_cli, site, tmp_path):
    urls = [site.page_url(n) for n in range(1, 41)]
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(f"{url}\n" for url in urls))
    inject = _killing_sitecustomize(tmp_path, KILL_POINTS[point])
    from tests.helpers import REPO_ROOT

    killed = run_cli("producer.py", "-f", str(listing),
                     env={"PRODUCER_BATCH": "10", "PYTHONPATH": f"{inject}:{REPO_ROOT}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

    rerun = run_cli("producer.py", "-f", str(listing), "--json",
                    env={"PRODUCER_BATCH": "10"})
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    # The first batch was confirmed and marked before the kill: the rerun skips it. The
    # killed batch was never marked seen, so the rerun publishes it (again, if it got through).
    assert '"duplicate": 10' in rerun.stdout

    with WorkerThread(settings.with_overrides(idle_exit_s=1.5, concurrency=4)) as worker:
        assert worker.join(60) == 0
    recorded = [r["url"] for r in results(redis_client)]
    assert sorted(recorded) == sorted(urls), "every URL exactly one result"
