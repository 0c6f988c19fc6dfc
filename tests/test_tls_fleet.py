"""A docs-sized site over HTTPS + HTTP/2 with a private CA, crawled by the whole fleet: real
RabbitMQ and Redis, two worker processes, Debian's nginx on loopback (devtools/nginx_site.py)
with a certificate for "localhost" from a CA made by ``openssl`` (devtools/tls.py).

* With FETCH_CA_BUNDLE the whole site is crawled, each page fetched once (nginx's own access
  log is the truth), each recorded once over HTTP/2.
* Without it every seeded URL is dead-lettered ``fetch_tls_certificate`` after one attempt,
  nothing retried; once the workers trust the CA, ``dlq replay`` gets every one of them at once,
  although the robots.txt failure would still be believed for a while (dlq replay deleted it).

nginx and the CA are made once for the module.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.broker import topology
from common.intake.producer import Producer
from common.store.keys import COUNTERS, robots_key
from common.web.robots import FAILED, origin_of
from devtools.nginx_site import NginxSite
from devtools.tls import Pki, make_pki
from tests.helpers import (
    drain,
    output_of,
    own_channel,
    queue_depth,
    results,
    start_worker_process,
    wait_for,
    wait_workers_ok,
)

pytestmark = pytest.mark.slow

SECTIONS = 15
PAGES_PER_SECTION = 20  # 1 index + 15 sections + 300 pages
WORKERS = 2
ROBOTS = "User-agent: *\nDisallow: /private/\n"
#: The failed robots.txt entry outlives the whole test unless something deletes it.
LONG_RETRY_BASE_S = "120"


def _page(title: str, body: str, links: list[str]) -> str:
    items = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title></head>"
            f"<body><h1>{title}</h1><p>{body}</p><ul>{items}</ul></body></html>\n")


def _generate(root: Path) -> list[str]:
    """Write the site under ``root``; return the path of every page a crawl must record."""
    paths = ["/index.html"]
    sections = [f"/docs/s{s}/index.html" for s in range(SECTIONS)]
    (root / "index.html").write_text(_page(
        "Docs", "Start here.", [*sections, "/private/secret.html", "/index.html#top"]))
    (root / "private").mkdir()
    (root / "private" / "secret.html").write_text(_page("Secret", "Never fetched.", []))
    (root / "robots.txt").write_text(ROBOTS)
    for s in range(SECTIONS):
        folder = root / "docs" / f"s{s}"
        folder.mkdir(parents=True)
        pages = [f"p{n}.html" for n in range(PAGES_PER_SECTION)]
        # Relative links from the section index, absolute-path ones between pages.
        (folder / "index.html").write_text(_page(f"Section {s}", "Pages of this section.",
                                                 [*pages, "../../index.html"]))
        paths.append(sections[s])
        for n, name in enumerate(pages):
            links = [f"/docs/s{s}/{pages[(n + 1) % len(pages)]}",
                     f"/docs/s{(s + 1) % SECTIONS}/p{n}.html#intro", sections[s], "/index.html"]
            (folder / name).write_text(_page(f"Section {s} page {n}",
                                             f"Text of page {n} of section {s}. " * 40, links))
            paths.append(f"/docs/s{s}/{name}")
    return paths


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("docs")
    return root, _generate(root)


@pytest.fixture(scope="module")
def nginx(pki: Pki, docs: tuple[Path, list[str]]) -> Iterator[NginxSite]:
    with NginxSite(docs[0], tls=pki.leaf) as site:
        yield site


def _seed(settings, redis_client, urls: list[str]) -> None:
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _workers(settings, name: str, env: dict[str, str], *args: str) -> list[subprocess.Popen]:
    procs = [start_worker_process(settings, "--concurrency", "8", *args,
                                  env={**env, "WORKER_ID": f"{name}-{i}"})
             for i in range(WORKERS)]
    with own_channel(settings) as channel:
        ready = wait_for(lambda: channel.queue_declare(
            queue=topology.NORMAL_QUEUE, passive=True).method.consumer_count >= WORKERS, 30)
    assert ready, "\n".join(output_of(p)[-2000:] for p in procs)
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    wait_workers_ok(procs, 30)


def _failures(redis_client) -> list[dict]:
    return [json.loads(f[b"json"]) for _id, f in redis_client.xrange("failures")]


def _pages_logged(nginx: NginxSite, since: int) -> Counter[str]:
    return Counter(path.partition("#")[0] for path, status in nginx.requests(since)
                   if status == 200 and path != "/robots.txt")


def test_a_docs_site_over_https_and_http2_with_a_private_ca_is_crawled_completely_once(
        settings, redis_client, nginx, pki, docs):
    _root, paths = docs
    offset = nginx.log_offset()
    env = {"FETCH_CA_BUNDLE": str(pki.ca_cert), "CRAWL_ENABLED": "true",
           "CRAWL_MAX_DEPTH": "5"}
    procs = _workers(settings, "tls-crawl", env, "--idle-exit", "2")
    try:
        _seed(settings, redis_client, [nginx.url("/index.html")])
        wait_workers_ok(procs, 120)
    finally:
        _stop(procs)

    logged = nginx.requests(offset)
    assert Counter(path for path, _status in logged) == Counter(
        {**dict.fromkeys(paths, 1), "/robots.txt": 1}), logged
    assert {status for _path, status in logged} == {200}
    records = results(redis_client)
    by_url = Counter(r["url"] for r in records)
    assert by_url == Counter(nginx.url(p) for p in paths)
    assert {(r["status"], r["http_version"]) for r in records} == {(200, "2")}
    assert {r["title"] for r in records if r["url"] == nginx.url("/docs/s3/p7.html")} == {
        "Section 3 page 7"}
    # The link robots.txt disallows was never enqueued (the follow step asks the rules).
    assert _failures(redis_client) == []


def test_an_untrusted_certificate_dead_letters_at_once_and_a_replay_after_trusting_the_ca_succeeds(
        settings, redis_client, nginx, pki, docs, run_cli):
    _root, paths = docs
    seeded = [nginx.url(p) for p in paths[-30:]]
    offset, connections = nginx.log_offset(), nginx.connections()
    # RETRY_BASE_S long: a retry would not come back within the test, and the failed
    # robots.txt entry (kept RETRY_BASE_S) outlives it unless dlq replay deletes it.
    untrusting = _workers(settings, "tls-untrusted", {"RETRY_BASE_S": LONG_RETRY_BASE_S},
                          "--idle-exit", "1.5")
    try:
        _seed(settings, redis_client, seeded)
        wait_workers_ok(untrusting, 60)
    finally:
        _stop(untrusting)

    assert nginx.requests(offset) == []  # no request ever got past the handshake
    # One connection (robots.txt's, its certificate refused) for the whole origin: the
    # fleet's "failed" entry answered for the 30 pages, none of them tried.
    assert nginx.connections() - connections == 1
    assert results(redis_client) == []
    failures = _failures(redis_client)
    assert sorted(f["url"] for f in failures) == sorted(seeded)
    assert {(f["reason"], f["failure"], f["attempts"]) for f in failures} == {
        ("fetch_tls_certificate", "fetch_tls_certificate", 1)}
    assert all("unable to get local issuer certificate" in f["last_error"] for f in failures)
    counters = {k.decode(): int(v) for k, v in redis_client.hgetall(COUNTERS).items()}
    assert counters.get("retries", 0) == 0
    assert counters["dead_lettered:fetch_tls_certificate"] == len(seeded)
    with own_channel(settings) as channel:
        assert queue_depth(channel, topology.FAILED_QUEUE) == len(seeded)
    stored = json.loads(redis_client.get(robots_key(origin_of(seeded[0]))))
    assert (stored["status"], stored["kind"]) == (FAILED, "tls_certificate")

    trusting = _workers(settings, "tls-trusted", {"FETCH_CA_BUNDLE": str(pki.ca_cert)})
    try:
        replayed = run_cli("dlq.py", "replay", "--reason", "fetch_tls_certificate")
        assert replayed.returncode == 0, replayed.stderr
        done = wait_for(lambda: len(results(redis_client)) >= len(seeded), 30)
        assert done, "\n".join(output_of(p)[-3000:] for p in trusting)
    finally:
        _stop(trusting)

    records = results(redis_client)
    assert sorted(r["url"] for r in records) == sorted(seeded)
    assert {(r["status"], r["http_version"]) for r in records} == {(200, "2")}
    assert _pages_logged(nginx, offset) == Counter(p for p in paths[-30:])
    with own_channel(settings) as channel:
        assert drain(channel, topology.FAILED_QUEUE) == []


def test_a_worker_with_an_unreadable_ca_bundle_refuses_to_start_naming_the_variable(
        settings, run_cli, tmp_path):
    started = run_cli("worker.py", "--idle-exit", "1",
                      env={"FETCH_CA_BUNDLE": str(tmp_path / "nowhere.pem")}, timeout_s=60)
    assert started.returncode != 0
    assert "FETCH_CA_BUNDLE" in started.stderr and "consuming" not in started.stderr
