"""The status table fitted to a terminal (common/ops/status_view.py): at 80×24 every line fits,
the lists give way first (``+N more``), and a pipe gets every line whole. No services: the
snapshot is the one ``collect`` returns for a busy fleet, written out."""

from __future__ import annotations

import pytest
from rich.console import Console

from common.ops import status_view


def _busy_snapshot(workers: int = 12, domains: int = 30) -> dict:
    queue = {"ready": 123456, "consumers": 12, "unacked": 96, "publish_rate": 41.5,
             "deliver_rate": 40.25}
    return {
        "queues": {name: dict(queue) for name in ("priority_queue", "url_queue_ttl",
                                                   "failed_urls", "expired_urls")},
        "delayed": 3210,
        "progress": {"done": 120_000, "failed": 321, "to_do": 480_000, "other": 12,
                     "total": 600_333, "percent": 20.0, "outcomes_per_s": 40.1,
                     "pages_per_s": 39.9, "rate_over_s": 60.0, "rate_from": "counters",
                     "eta_s": 11970.1, "state": "running"},
        "results": 120_000,
        "results_detail": {"recorded": 120_000, "in_stream": 150, "source": "sinks",
                           "sinks": {"files": {"written": 119_850, "waiting": 150},
                                     "postgres": {"written": 119_000, "waiting": 1000}}},
        "dead_letters": {"now": 300, "now_by_reason": {"http_404": 250, "max_retries": 50},
                         "by_reason_of": 300, "ever": 321,
                         "ever_by_reason": {"http_404": 260, "max_retries": 50,
                                            "fetch_blocked": 11}},
        "seen": 600_321, "expired": 12, "robots_blocked": 40, "retries": 900,
        "cache": {"hits": 10, "misses": 90, "hit_ratio": 0.1},
        "user_code_stopped": {"regex_timeouts": 2},
        "pressure": {"paused": [], "paused_workers": {}, "unhealthy_workers": {},
                     "redis_memory": {"used": 10_000_000, "max": 100_000_000, "ratio": 0.1,
                                      "high": 0.9, "low": 0.8, "over_high": False},
                     "results_backlog": {"entries": 150, "sink": "postgres",
                                         "by_sink": {"postgres": 150}, "high": 80_000,
                                         "low": 40_000, "over_high": False},
                     "results_dropping": False,
                     "warnings": ["results are being dropped: the results stream holds "
                                  "10,000 entries, at its cap RESULTS_MAXLEN=10,000, and no "
                                  "sink is registered"]},
        "domains": [{"domain": f"site-{n}.a-rather-long-domain-name.example.org",
                     "requests_in_window": 60 - n, "limit": 60, "window_s": 60.0}
                    for n in range(domains)],
        "throttled": [{"domain": f"slow-{n}.example", "text": "50% of its rate: 1/s of 2/s; "
                       "why: fetch_timeout"} for n in range(3)],
        "deferred": {"total": 4000, "releasing": 20,
                     "domains": [{"domain": f"site-{n}.example.org", "deferred": 400,
                                  "through_in_s": 600} for n in range(10)]},
        "workers": [{"id": f"worker-{n:02d}", "host": "host-with-a-long-name.internal",
                     "processed": 10_000 + n, "in_flight": 16,
                     "outcomes": {"result": 3000 + n, "dead_letter": 2, "delay": 7000},
                     "current": [f"https://site-{n}.example.org/a/very/long/path/{i}?query=1"
                                 for i in range(3)],
                     "pressure": ({"paused": True, "reason": "Redis memory",
                                   "memory_ratio": 0.93, "memory_low": 0.8} if n % 4 == 0
                                  else {})}
                    for n in range(workers)],
    }


@pytest.mark.parametrize(("width", "height"), [(80, 24), (60, 20), (120, 40), (80, 12)])
def test_a_busy_fleet_fits_the_terminal_with_every_section_heading_shown(width, height):
    lines = status_view.render(_busy_snapshot(), width, height).splitlines()

    assert len(lines) <= height, "\n".join(lines)
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    text = "\n".join(lines)
    assert text.startswith("progress: 120,000 done (20.0%), 321 failed, 480,000 to do")
    assert "ETA 3h19m" in text
    if height >= 20:
        assert "workers alive: 12" in text and "domains (requests in window / limit)" in text
        assert "results: 120,000 recorded; sink files: 119,850 written" in text


def test_at_80x24_the_lists_give_way_with_how_many_are_not_shown():
    lines = status_view.render(_busy_snapshot(), 80, 24).splitlines()
    text = "\n".join(lines)

    assert "dead letters now: 300 (http_404 250, max_retries 50)" in text
    assert "ever: 321 (http_404 260, max_retries 50, fetch_blocked 11)" in text
    workers_at = next(i for i, line in enumerate(lines) if line.startswith("workers alive"))
    shown = [line for line in lines[workers_at + 1:] if line.startswith("  worker-")]
    assert len(shown) >= 3, "\n".join(lines)
    assert lines[workers_at] == f"workers alive: 12 (+{12 - len(shown)} more)"
    assert any(line.startswith("domains (requests in window / limit): (+") for line in lines)


def test_a_pipe_gets_every_worker_and_every_line_whole():
    snapshot = _busy_snapshot(workers=40)
    text = status_view.render(snapshot)

    assert sum(line.startswith("  worker-") for line in text.splitlines()) == 40
    assert "current=https://site-39.example.org/a/very/long/path/0?query=1" in text
    assert ("  worker-00 on host-with-a-long-name.internal: paused: Redis memory (0.93 of "
            "maxmemory, resume below 0.8), done=3000 failed=2 delayed=7000 in_flight=16") in text
    assert "pause above 0.9, resume below 0.8" in text  # the pressure line in full
    assert "domains (requests in window / limit): (+20 more)" in text  # the top 10 listed


def test_the_live_view_fits_the_same_way():
    console = Console(record=True, width=80, height=24, force_terminal=True)
    console.print(status_view.render_rich(_busy_snapshot(), 80, 24))
    lines = console.export_text().rstrip("\n").splitlines()

    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert any(line.startswith("workers alive: 12") for line in lines)


def test_a_snapshot_without_workers_or_domains_still_says_so():
    snapshot = _busy_snapshot(workers=0, domains=0)
    snapshot["throttled"], snapshot["deferred"] = [], {"total": 0, "releasing": 0,
                                                       "domains": []}
    lines = status_view.render(snapshot, 80, 24).splitlines()

    assert lines[-1] == "workers alive: 0" and not any("more" in line for line in lines)
    assert not any(line.startswith(("domains", "throttled", "deferred")) for line in lines)


def test_the_counters_line_shows_session_retires_and_logins_only_once_there_are_some():
    snapshot = _busy_snapshot()
    snapshot["counters"] = {"retries": 900}
    assert "sessions retired" not in status_view.render(snapshot)
    snapshot["counters"] = {"sessions_retired": 12, "session_logins": 4,
                            "session_logins_failed": 1}
    assert "sessions retired: 12  logins: 4 (1 failed)" in status_view.render(snapshot)


def test_a_render_worker_row_shows_its_browsers_and_an_http_worker_what_it_sent_to_render():
    snapshot = _busy_snapshot(workers=2)
    snapshot["queues"].update({name: {"ready": 7, "consumers": 1, "unacked": 2,
                                      "publish_rate": 1.0, "deliver_rate": 1.0}
                               for name in ("render_priority", "render_queue")})
    snapshot["workers"][0]["outcomes"]["render"] = 5
    snapshot["workers"][1]["renderer"] = {"threads": 2, "alive": 2, "browsers": 1, "pages": 40,
                                          "launches": 1, "memory_mb": 351.2, "closed": False}
    text = status_view.render(snapshot)

    assert "in_flight=16 to_render=5" in text
    assert "browsers=1/2 rendered=40 mem=351.2MiB" in text
    fitted = status_view.render(snapshot, 100, 40)
    assert any(line.startswith("render_queue") for line in fitted.splitlines())
