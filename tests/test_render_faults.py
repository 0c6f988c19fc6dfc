"""A render worker killed with SIGKILL in the middle of a page (issue 29's Done when): real
RabbitMQ and Redis, ``worker.py`` processes, Debian's Chromium, a loopback site whose page
takes SLOW_S seconds to load its script. Another render worker takes over: every URL has
exactly one outcome, and the killed worker's Chromium does not outlive it."""

from __future__ import annotations

import json
import signal
from collections import Counter

import pytest

from common.intake.producer import Producer
from common.web.browser_procs import below, chromium_pids, process_table
from devtools.js_site import install_js_pages
from devtools.testsite import start_sites
from tests.helpers import output_of, results, start_worker_process, wait_for, wait_workers_ok

pytestmark = pytest.mark.slow


def process_tree(pid: int) -> dict[int, tuple[str, str]]:
    """Every live process below ``pid``: pid -> (name, start time); zombies hold nothing."""
    table = process_table()
    return {p: (table[p].name, table[p].started) for p in below(table, pid)
            if table[p].state != "Z"}


def still_running(processes: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """Those of ``processes`` still running (the same process: pid and start time)."""
    table = process_table()
    return {p: v for p, v in processes.items() if p in table and table[p].state != "Z"
            and (table[p].name, table[p].started) == v}


def test_a_render_worker_killed_mid_page_loses_nothing_and_leaves_no_chromium(
        settings, redis_client, own_sites, tmp_path):
    [site] = start_sites(1, first_host="127.0.0.8")
    own_sites.append(site)
    install_js_pages(site, products=4)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [
        {"path": "^/js/", "render": True, "fields": {"name": ".name"}}]}))
    env = {"EXTRACT_RULES": f"@{rules}", "ROBOTS_ENABLED": "false"}
    paths = ["/js/slow", *[f"/js/product/{n}" for n in range(4)]]
    urls = [site.url(p) for p in paths]
    with Producer(settings, redis_client) as producer:
        assert producer.submit(urls).new == len(urls)

    http = start_worker_process(settings, "--idle-exit", "4", env={**env, "WORKER_ID": "http"})
    doomed = start_worker_process(settings, "--render", env={**env, "WORKER_ID": "doomed"})
    try:
        # The page is rendering: its document was served and its script is being awaited.
        assert wait_for(lambda: site.count("/js/slow.js") >= 1, 90), output_of(doomed)[-3000:]
        below = process_tree(doomed.pid)
        assert any("chrom" in name for name, _start in below.values()), below
        # Killed mid-page: the script is still being served (it takes SLOW_S).
        assert not any(r.path == "/js/slow.js" for r, _at in site.answered)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        # Its Chromium exits when the driver sees its stdin close (no reaper of ours here).
        assert wait_for(lambda: not still_running(below), 15, step_s=0.2), still_running(below)
        assert site.count("/js/slow.js") == 1
        heir = start_worker_process(settings, "--render", "--idle-exit", "6",
                                    env={**env, "WORKER_ID": "heir"})
        wait_workers_ok([http, heir], 180)
    finally:
        for proc in (http, doomed):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    recorded = [r["url"] for r in results(redis_client)]
    failed = [json.loads(f[b"json"])["url"] for _id, f in redis_client.xrange("failures")]
    outcomes = Counter(recorded + failed)
    assert set(outcomes) == set(urls) and set(outcomes.values()) == {1}, outcomes
    by_url = {r["url"]: r for r in results(redis_client)}
    assert by_url[site.url("/js/slow")]["data"] == {"name": "slow"}
    assert by_url[site.url("/js/slow")]["worker"] == "heir"  # the killed page, rendered again
    assert site.count("/js/slow.js") == 2
    assert chromium_pids() == set()  # the heir closed its browser too
