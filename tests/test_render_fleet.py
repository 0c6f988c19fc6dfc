"""Rendering through the whole fleet (issue 29): real RabbitMQ and Redis, ``worker.py``
processes (HTTP workers and ``--render`` workers driving Debian's Chromium), a loopback site
whose content is written by JavaScript, judged by the site's request log and the results.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from common.broker import topology
from common.intake.producer import Producer
from devtools.testsite import start_sites
from tests.helpers import drain, results, start_worker_process, wait_workers_ok

pytestmark = pytest.mark.slow


def _html(body: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "text/html; charset=utf-8"}, body.encode()


def _scripted(title: str) -> str:
    """A JavaScript shell: the heading and the product are written by its script."""
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body><div id=app></div>"
            "<script>document.getElementById('app').innerHTML = "
            f"'<h1 class=name>{title}</h1><span class=price>9.99</span>';</script></body></html>")


def _plain(title: str) -> str:
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body><h1 class=name>"
            f"{title}</h1><span class=price>1.00</span><p>{'plain text ' * 40}</p></body></html>")


def test_a_rule_sends_scripted_pages_to_render_workers_and_plain_pages_stay_on_http(
        settings, redis_client, own_sites, amqp_channel, tmp_path):
    [site] = start_sites(1)
    own_sites.append(site)
    scripted = [f"/app/{i}" for i in range(6)]
    plain = [f"/plain/{i}" for i in range(6)]
    for path in scripted:
        site.route(path, lambda _r, p=path: _html(_scripted(f"app {p[5:]}")))
    for path in plain:
        site.route(path, lambda _r, p=path: _html(_plain(f"plain {p[7:]}")))
    rules = tmp_path / "rules.yml"
    rules.write_text(json.dumps({"rules": [
        {"name": "app", "path": "^/app/", "render": True,
         "fields": {"name": ".name", "price": {"css": ".price", "type": "float"}}},
        {"name": "plain", "path": "^/plain/",
         "fields": {"name": ".name", "price": {"css": ".price", "type": "float"}}}]}))
    env = {"EXTRACT_RULES": f"@{rules}", "ROBOTS_ENABLED": "false"}
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url(p) for p in scripted + plain])
    procs = [start_worker_process(settings, "--idle-exit", "4", env={**env, "WORKER_ID": "http"}),
             start_worker_process(settings, "--render", "--idle-exit", "8",
                                  env={**env, "WORKER_ID": "render"})]
    wait_workers_ok(procs, 180)

    found = {r["url"]: r for r in results(redis_client)}
    assert Counter(r["url"] for r in results(redis_client)).most_common(1)[0][1] == 1
    for path in scripted:
        record = found[site.url(path)]
        assert (record["worker"], record.get("rendered")) == ("render", True), record
        assert record["data"] == {"name": f"app {path[5:]}", "price": 9.99}
    for path in plain:
        record = found[site.url(path)]
        assert (record["worker"], record.get("rendered")) == ("http", None), record
        assert record["data"] == {"name": f"plain {path[7:]}", "price": 1.0}
    fetched = Counter(r.path for r in site.log)
    assert all(fetched[p] == 1 for p in scripted + plain), fetched
    assert drain(amqp_channel, topology.FAILED_QUEUE) == []
