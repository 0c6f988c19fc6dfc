"""EXTRACTOR (common/work/user_extractor.py) through the real fleet: Producer -> RabbitMQ ->
WorkerThread -> the results stream, with user modules written into tmp_path."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from common.core.errors import ConfigError
from common.intake.producer import Producer
from common.store.keys import COUNTERS
from common.work.processor import Processor
from tests.helpers import (
    WorkerThread,
    output_of,
    results,
    start_worker_process,
    wait_for,
    wait_workers_ok,
)

HTML = {"Content-Type": "text/html; charset=utf-8"}
PAGE = "<html><body><h1>Widget</h1><p class=price>12.50</p><p>café</p></body></html>"

USER_MODULE = '''
import time

def extract(page):
    if page.url.endswith("/ux/hang"):
        import re
        re.search(r"(\\d+)+$", "1" * 40 + "x")  # catastrophic backtracking, holding the GIL
    if page.url.endswith("/ux/boom"):
        raise ValueError("no price here " + "x" * 300)
    if page.url.endswith("/ux/slow"):
        time.sleep(0.6)
        return {"data": {"late": True}}
    follow = ["b"] if page.url.endswith("/ux/a") else []
    return {"data": {"price": page.selector.css(".price::text").get(),
                     "h1": page.root.findtext(".//h1"), "status": page.status,
                     "server_header": "content-type" in {k.lower() for k in page.headers},
                     "has_cafe": "café" in page.text, "rules_saw": page.data},
            "follow": follow, "priority": True}

value = 42
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"ux_user_{uuid.uuid4().hex}"  # a fresh module: sys.modules caches by name
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _run(settings, redis_client, urls, **overrides) -> dict[str, dict]:
    with Producer(settings, redis_client) as producer:
        producer.submit(urls)
    overrides = {"idle_exit_s": 1.0, "concurrency": 4, **overrides}
    with WorkerThread(settings.with_overrides(**overrides)) as worker:
        assert worker.join(30) == 0
    return {r["url"]: r for r in results(redis_client)}


def test_the_function_extracts_fields_and_follows_urls_at_priority(settings, redis_client,
                                                                  site, user_module):
    for path in ("/ux/a", "/ux/b"):
        site.route(path, lambda _r: (200, HTML, PAGE.encode()))
    rules = json.dumps({"rules": [{"name": "h", "url": "/ux/", "fields": {"h1": "h1",
                                                                          "only_rule": "p"}}]})
    records = _run(settings, redis_client, [site.url("/ux/a")], crawl_enabled=True,
                   extractor=f"{user_module}:extract", extract_rules=rules)
    assert set(records) == {site.url("/ux/a"), site.url("/ux/b")}
    a = records[site.url("/ux/a")]
    assert a["data"] == {"h1": "Widget", "only_rule": "12.50", "price": "12.50", "status": 200,
                         "server_header": True, "has_cafe": True,
                         "rules_saw": {"h1": "Widget", "only_rule": "12.50"}}
    assert "data_errors" not in a and a["extractor_followed"] == 1
    b = records[site.url("/ux/b")]
    assert b["queue"] == "priority_queue" and b["depth"] == 1 and b["data"]["price"] == "12.50"


def test_follow_urls_are_followed_without_crawl_mode_and_only_they(settings, redis_client,
                                                                   site, user_module):
    site.route("/ux/a", lambda _r: (200, HTML, PAGE.encode()))
    site.route("/ux/b", lambda _r: (200, HTML, PAGE.encode()))
    records = _run(settings, redis_client, [site.url("/ux/a")],
                   extractor=f"{user_module}:extract")
    assert set(records) == {site.url("/ux/a"), site.url("/ux/b")}
    record = records[site.url("/ux/a")]
    assert record["data"]["price"] == "12.50"
    assert "data_errors" not in record and record["extractor_followed"] == 1


def test_a_raising_or_slow_function_is_recorded_stopped_and_the_worker_goes_on(
        settings, redis_client, site, user_module):
    for path in ("/ux/boom", "/ux/slow", "/ux/ok"):
        site.route(path, lambda _r: (200, HTML, PAGE.encode()))
    urls = [site.url(p) for p in ("/ux/boom", "/ux/slow", "/ux/ok")]
    records = _run(settings, redis_client, urls, extractor=f"{user_module}:extract",
                   handler_timeout_s=0.3, concurrency=1)
    assert set(records) == set(urls)
    boom = records[urls[0]]
    error = boom["data_errors"]["extractor"]
    assert error.startswith("ValueError: no price here xxx") and len(error) == 200
    assert boom["status"] == 200 and "data" not in boom
    slow = records[urls[1]]
    assert slow["data_errors"]["extractor"] == (
        "timeout: over HANDLER_TIMEOUT_S (0.3 s); stopped")
    assert "data" not in slow
    assert records[urls[2]]["data"]["price"] == "12.50"  # the same thread went on
    assert redis_client.hget(COUNTERS, "extractor_timeouts") == b"1"
    assert redis_client.hget(COUNTERS, "extractor_crashes") is None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):  # not listening, or no answer within 5 s
        return 0


def test_a_worker_whose_extractor_hangs_on_one_url_stays_healthy_and_records_every_page(
        settings, redis_client, site, user_module, tmp_path):
    paths = ["/ux/hang"] + [f"/ux/page{i}" for i in range(20)]
    for path in paths:
        site.route(path, lambda _r: (200, HTML, PAGE.encode()))
    urls = [site.url(p) for p in paths]
    with Producer(settings, redis_client) as producer:
        producer.submit(urls)
    port = _free_port()
    env = {"EXTRACTOR": f"{user_module}:extract", "HANDLER_TIMEOUT_S": "1",
           "METRICS_PORT": str(port), "METRICS_HOST": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    worker = start_worker_process(settings, "--concurrency", "2", "--idle-exit", "3", env=env)
    answers: list[int] = []
    stop = threading.Event()

    def probe() -> None:  # /healthz every 100 ms while the worker runs
        while not stop.is_set() and worker.poll() is None:
            answers.append(_healthz(port))
            time.sleep(0.1)

    try:
        assert wait_for(lambda: _healthz(port) == 200, timeout_s=30), output_of(worker)[-3000:]
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        assert wait_for(lambda: redis_client.xlen("results") >= len(urls), timeout_s=60), (
            f"{redis_client.xlen('results')} of {len(urls)} results; "
            f"health answers {answers[-20:]}\n{output_of(worker)[-3000:]}")
        stop.set()
        prober.join(5)
    finally:
        stop.set()
        if worker.poll() is None and redis_client.xlen("results") < len(urls):
            worker.kill()
    wait_workers_ok([worker], 60)
    assert len(answers) >= 3 and set(answers) == {200}, answers
    records = {r["url"]: r for r in results(redis_client)}
    assert set(records) == set(urls)
    assert records[urls[0]]["data_errors"]["extractor"].startswith("timeout:")
    assert all(records[u]["data"]["price"] == "12.50" for u in urls[1:])
    assert redis_client.hget(COUNTERS, "extractor_timeouts") == b"1"


@pytest.mark.parametrize(("value", "message"), [
    ("nocolon", r"EXTRACTOR='nocolon': expected package\.module:function, got 'nocolon'"),
    ("ux_no_such_module_zz:f", r"EXTRACTOR='ux_no_such_module_zz:f': cannot import module "
                               r"'ux_no_such_module_zz': ModuleNotFoundError"),
    ("{mod}:missing", r"EXTRACTOR='{mod}:missing': module '{mod}' has no attribute 'missing'"),
    ("{mod}:value", r"EXTRACTOR='{mod}:value': 'value' is not callable \(type int\)"),
])
def test_a_bad_extractor_stops_the_worker_at_start(settings, redis_client, user_module, value,
                                                   message):
    value, message = value.format(mod=user_module), message.format(mod=user_module)
    with pytest.raises(ConfigError, match=message):
        Processor(settings.with_overrides(extractor=value), redis_client)
