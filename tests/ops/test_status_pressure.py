"""The status view's backpressure part: Redis memory and the sinks' backlog against the
watermarks, paused workers with their reason, and a plain warning when results are being
dropped (no sink registered, the results stream at RESULTS_MAXLEN)."""

from __future__ import annotations

import io
import json
import re
import time

from rich.console import Console

from common.ops import stats
from common.store.keys import RESULTS_STREAM, SINKS, sink_group, worker_key
from common.work.pressure import BACKLOG, ERRORS, MEMORY
from tests.helpers import own_channel


def _status(run_cli, *args, env=None):
    result = run_cli("stats.py", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_results_at_the_cap_with_no_sink_registered_are_reported_as_dropped(
        settings, redis_client, run_cli):
    for _ in range(9):
        redis_client.xadd(RESULTS_STREAM, {"json": "{}"})
    env = {"RESULTS_MAXLEN": "10"}
    pressure = json.loads(_status(run_cli, "--json", env=env))["pressure"]
    assert pressure["results_dropping"] and pressure["paused"] == []
    [warning] = pressure["warnings"]
    assert "results are being dropped" in warning and "RESULTS_MAXLEN=10" in warning
    assert "export them" in warning and "register a sink" in warning
    table = _status(run_cli, env=env)
    assert "WARNING: results are being dropped" in table, table
    assert "pressure: running" in table and "no sink registered" in table

    with own_channel(settings) as channel:  # the live view (--watch) says it too
        snapshot = stats.collect(settings.with_overrides(results_maxlen=10), channel.connection,
                                 redis_client)
    console = Console(file=io.StringIO(), width=400)
    console.print(stats.render_rich(snapshot))
    assert "results are being dropped" in console.file.getvalue()

    below = json.loads(_status(run_cli, "--json", env={"RESULTS_MAXLEN": "20"}))["pressure"]
    assert not below["results_dropping"] and below["warnings"] == []

    redis_client.xgroup_create(RESULTS_STREAM, sink_group("files"), id="$")
    redis_client.sadd(SINKS, "files")  # the sinks trim now, not MAXLEN: nothing is dropped
    registered = json.loads(_status(run_cli, "--json", env=env))["pressure"]
    assert not registered["results_dropping"] and registered["warnings"] == []
    assert registered["results_backlog"]["by_sink"] == {"files": 0}


def test_a_backlog_over_the_watermark_is_shown_even_before_a_worker_reports_it(
        settings, redis_client, run_cli):
    redis_client.xgroup_create(RESULTS_STREAM, sink_group("slow"), id="0", mkstream=True)
    redis_client.sadd(SINKS, "slow")
    for _ in range(8):
        redis_client.xadd(RESULTS_STREAM, {"json": "{}"})
    env = {"RESULTS_BACKLOG_HIGH": "5", "RESULTS_BACKLOG_LOW": "2"}
    pressure = json.loads(_status(run_cli, "--json", env=env))["pressure"]
    assert pressure["paused"] == [BACKLOG]
    assert pressure["results_backlog"] == {"entries": 8, "sink": "slow", "by_sink": {"slow": 8},
                                           "high": 5, "low": 2, "over_high": True}
    assert "pressure: paused: results backlog" in _status(run_cli, env=env)


def _beat(redis_client, worker_id, pressure, beat_age_s=0.0):
    payload = {"id": worker_id, "host": "h", "pid": 1, "started": 0, "processed": 3,
               "in_flight": 0, "current": [], "interval_s": 1.0,
               "beat": time.time() - beat_age_s, "pressure": pressure}
    redis_client.set(worker_key(worker_id), json.dumps(payload), ex=60)


def test_each_workers_pause_state_and_health_are_shown_with_their_figures(
        settings, redis_client, run_cli):
    figures = {"memory_high": 0.9, "memory_low": 0.8, "backlog_high": 5, "backlog_low": 2,
               "errors_in_a_row": 0, "memory_ratio": 0.93, "backlog": 0, "backlog_sink": None}
    _beat(redis_client, "w-mem", {"paused": True, "reason": MEMORY, "unhealthy": None,
                                  **figures})
    _beat(redis_client, "w-err", {"paused": True, "reason": ERRORS, "unhealthy":
                                  "24 Redis errors in a row, the last: MISCONF",
                                  **figures, "errors_in_a_row": 24})
    _beat(redis_client, "w-ok", {"paused": False, "reason": None, "unhealthy": None,
                                 **figures}, beat_age_s=30)
    snapshot = json.loads(_status(run_cli, "--json"))
    pressure = snapshot["pressure"]
    assert pressure["paused_workers"] == {"w-mem": MEMORY, "w-err": ERRORS}
    assert pressure["unhealthy_workers"] == {
        "w-err": "24 Redis errors in a row, the last: MISCONF"}
    assert pressure["paused"] == [ERRORS, MEMORY]  # from the workers: Redis itself is fine
    stale = {w["id"]: w["stale"] for w in snapshot["workers"]}
    assert stale == {"w-err": False, "w-mem": False, "w-ok": True}
    table = _status(run_cli)
    assert "w-mem on h: paused: Redis memory (0.93 of maxmemory, resume below 0.8)" in table
    assert ("w-err on h: paused: Redis errors (24 in a row); UNHEALTHY: 24 Redis errors in a "
            "row, the last: MISCONF") in table
    assert re.search(r"w-ok on h: running; heartbeat \d+s old \(Redis refusing writes\?\)",
                     table), table
    assert stats.worker_state({"pressure": {}}) == "running"  # a worker from before pressure
