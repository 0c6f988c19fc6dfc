"""Tests of the test tooling itself: local services, fixtures and the loopback test site."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
import redis
import requests
from lxml import html as lxml_html

from common.broker import topology
from common.ops import servers
from devtools.services import (
    FleetServices,
    LocalRedis,
    ServicesUnavailable,
    find_binaries,
    fleet_services,
)
from devtools.services import fleet as services_fleet
from devtools.testsite import TestSite, start_sites


def _redis_binary_or_skip() -> str:
    try:
        return find_binaries(["redis"])["redis-server"]
    except ServicesUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


# -- services and fixtures ---------------------------------------------------------------


def test_redis_fixture_answers_ping_on_an_empty_database(redis_client):
    assert redis_client.ping() is True
    assert redis_client.dbsize() == 0


def test_rabbitmq_fixture_delivers_a_published_message(amqp_channel):
    queue = amqp_channel.queue_declare(queue="", exclusive=True).method.queue
    amqp_channel.basic_publish(exchange="", routing_key=queue, body=b"hello")

    method, _properties, body = amqp_channel.basic_get(queue=queue, auto_ack=True)

    assert method is not None
    assert body == b"hello"


def test_settings_fixture_leaves_the_topology_declared_and_empty(settings, amqp_channel):
    assert settings.rabbitmq_url and settings.redis_url
    for spec in topology.QUEUES:
        declared = amqp_channel.queue_declare(queue=spec.name, passive=True)
        assert declared.method.message_count == 0


def test_services_are_reached_over_loopback(services: FleetServices):
    for url in (services.rabbitmq_url, services.redis_url):
        host = requests.utils.urlparse(url).hostname
        assert host in {"localhost"} or host.startswith("127.")


def test_run_cli_passes_the_service_urls_to_the_script(run_cli, settings, tmp_path: Path):
    script = tmp_path / "show_env.py"
    script.write_text("import os\nprint(os.environ['RABBITMQ_URL'])\nprint(os.environ['EXTRA'])\n")

    result = run_cli(str(script), env={"EXTRA": "yes"}, timeout_s=30)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [settings.rabbitmq_url, "yes"]


@pytest.mark.slow
def test_stop_app_makes_the_broker_refuse_connections_until_start_app(services):
    if services.rabbitmq is None:
        pytest.skip("the broker was not started by these tests")
    broker = services.rabbitmq

    broker.stop_app()
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(broker.connection_parameters(connection_attempts=1,
                                                                 socket_timeout=2))
    finally:
        broker.start_app()

    connection = pika.BlockingConnection(pika.URLParameters(services.rabbitmq_url))
    assert connection.is_open
    connection.close()


def test_local_redis_with_appendonly_keeps_data_across_a_restart():
    binary = _redis_binary_or_skip()
    with LocalRedis(appendonly=True, binary=binary) as server:
        port, data_dir = server.port, server.dir
        client = redis.Redis.from_url(server.url)
        client.set("survives", "yes")
        client.close()

        server.restart()

        client = redis.Redis.from_url(server.url)
        assert client.get("survives") == b"yes"
        client.close()
        assert (server.port, server.dir) == (port, data_dir)
    assert data_dir is not None and not data_dir.exists()


def test_local_redis_answers_again_after_a_crash_restart():
    binary = _redis_binary_or_skip()
    with LocalRedis(binary=binary) as server:
        server.restart(kill=True)

        client = redis.Redis.from_url(server.url)
        assert client.ping() is True
        client.close()


def test_fleet_services_uses_urls_from_the_environment_as_is():
    env = {"RABBITMQ_URL": "amqp://u:p@127.0.0.1:1/%2F", "REDIS_URL": "redis://127.0.0.1:1/3"}

    with fleet_services(env) as found:
        assert (found.rabbitmq_url, found.redis_url) == (env["RABBITMQ_URL"], env["REDIS_URL"])
        assert found.rabbitmq is None and found.redis is None
        assert found.sources == {"rabbitmq": "env", "redis": "env"}


def test_docker_is_not_asked_when_docker_host_is_not_on_this_machine():
    # Returns before any connection is attempted: nothing is sent to that address.
    assert services_fleet._docker_engine_answers({"DOCKER_HOST": "tcp://10.9.8.7:2375"}) is False


def test_missing_binaries_error_says_how_to_install_them(monkeypatch):
    monkeypatch.setattr(servers, "RABBITMQ_BIN_DIRS", ("/nonexistent",))
    monkeypatch.setattr(servers, "REDIS_BIN_DIRS", ("/nonexistent",))
    monkeypatch.setenv("PATH", "/nonexistent")

    with pytest.raises(RuntimeError, match="apt-get install -y rabbitmq-server redis-server"):
        find_binaries()


# -- the test site -----------------------------------------------------------------------


def test_test_site_serves_pages_with_links_and_logs_requests(site: TestSite):
    response = requests.get(site.page_url(5), timeout=5)

    assert response.status_code == 200
    doc = lxml_html.fromstring(response.content)
    doc.make_links_absolute(response.url)
    assert doc.findtext(".//title") == "Page 5"
    assert doc.get("lang") == "en"
    assert doc.xpath("string(//link[@rel='canonical']/@href)") == site.page_url(5)
    assert doc.xpath("string(//meta[@name='description']/@content)")
    hrefs = [a.get("href") for a in doc.xpath("//ul/li/a")]
    assert hrefs == [site.page_url(m) for m in site.links_of(5)]
    assert len(hrefs) == site.links_per_page
    raw_hrefs = lxml_html.fromstring(response.content).xpath("//ul/li/a/@href")
    assert any(h.startswith("http://") for h in raw_hrefs)
    assert any(h.startswith("/page/") for h in raw_hrefs)
    assert any(h.isdigit() for h in raw_hrefs)

    [record] = site.requests_for("/page/")
    assert site.count("/page/5") == 1
    assert (record.method, record.path, record.host) == ("GET", "/page/5", site.netloc)
    assert record.client[0] == "127.0.0.1"
    assert record.monotonic_s <= time.monotonic()


def test_pages_are_identical_on_every_request_and_out_of_range_pages_are_404(site):
    first = requests.get(site.page_url(7), timeout=5).content
    assert requests.get(site.page_url(7), timeout=5).content == first
    assert requests.get(site.page_url(site.pages + 1), timeout=5).status_code == 404
    assert requests.get(site.url("/page/0"), timeout=5).status_code == 404


def test_index_links_to_every_page(site):
    doc = lxml_html.fromstring(requests.get(site.url("/"), timeout=5).content)
    assert len(doc.xpath("//a[starts-with(@href, '/page/')]")) == site.pages


def test_latin1_page_has_iso_8859_1_bytes_and_its_charset_only_in_a_meta_tag(site):
    response = requests.get(site.url("/latin1"), timeout=5)

    assert response.headers["Content-Type"] == "text/html"
    assert "Caf\xe9".encode("latin-1") in response.content
    assert b"caf\xc3\xa9" not in response.content
    assert b"charset=iso-8859-1" in response.content
    assert lxml_html.fromstring(response.content).findtext(".//title") == "Café Latin-1"


def test_nocharset_page_is_utf8_with_no_declared_charset(site):
    response = requests.get(site.url("/nocharset"), timeout=5)

    assert response.headers["Content-Type"] == "text/html"
    assert b"charset" not in response.content.lower()
    assert "naïve café" in response.content.decode("utf-8")


def test_status_redirect_retry_after_binary_and_big_routes_answer_as_documented(site):
    assert requests.get(site.url("/status/503"), timeout=5).status_code == 503
    assert requests.get(site.url("/status/204"), timeout=5).content == b""

    redirected = requests.get(site.url("/redirect/3"), timeout=5)
    assert [r.status_code for r in redirected.history] == [302, 302, 302]
    assert redirected.url == site.page_url(1)

    limited = requests.get(site.url("/retry-after/7"), timeout=5)
    assert (limited.status_code, limited.headers["Retry-After"]) == (429, "7")

    binary = requests.get(site.url("/binary"), timeout=5)
    assert binary.headers["Content-Type"] == "application/octet-stream"
    assert len(binary.content) == 4096

    big = requests.get(site.url("/big/64"), timeout=5)
    assert len(big.content) == 64 * 1024
    assert big.content.endswith(b"</html>\n")


def test_flaky_route_fails_n_times_per_key_then_recovers(site):
    codes = [requests.get(site.url("/flaky/a/2"), timeout=5).status_code for _ in range(3)]
    other = requests.get(site.url("/flaky/b/1"), timeout=5).status_code

    assert codes == [503, 503, 200]
    assert other == 503


def test_slow_route_waits_and_latency_applies_to_every_response():
    with TestSite(latency_s=0.2, pages=3) as slow_site:
        started_s = time.monotonic()
        assert requests.get(slow_site.url("/slow/0.1"), timeout=5).status_code == 200
        assert time.monotonic() - started_s >= 0.3


def test_robots_txt_is_404_by_default_and_served_when_configured(site):
    assert requests.get(site.url("/robots.txt"), timeout=5).status_code == 404
    with TestSite(robots_txt="User-agent: *\nDisallow: /private\n") as other:
        response = requests.get(other.url("/robots.txt"), timeout=5)
        assert response.status_code == 200
        assert "Disallow: /private" in response.text


def test_custom_route_answers_and_is_logged(site):
    site.route("/custom", lambda req: (201, {"X-Seen": req.user_agent}, b"made"))

    response = requests.get(site.url("/custom?x=1"), headers={"User-Agent": "probe"}, timeout=5)

    assert (response.status_code, response.content, response.headers["X-Seen"]) == (
        201, b"made", "probe")
    assert site.count("/custom?x=1") == 1


def test_head_requests_get_headers_without_a_body(site):
    response = requests.head(site.page_url(1), timeout=5)
    assert response.status_code == 200
    assert int(response.headers["Content-Length"]) > 0
    assert response.content == b""


def test_start_sites_gives_distinct_loopback_hosts():
    sites = start_sites(3, pages=5)
    try:
        assert [s.host for s in sites] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        for s in sites:
            assert requests.get(s.page_url(1), timeout=5).status_code == 200
            [record] = s.log
            assert record.host == s.netloc
            assert record.client[0] == "127.0.0.1"
    finally:
        for s in sites:
            s.stop()


def test_test_site_refuses_non_loopback_addresses():
    with pytest.raises(ValueError, match="loopback"):
        TestSite("10.0.0.1")


def test_routes_a_test_adds_to_the_session_site_are_undone_after_it(test_site):
    before = test_site.routes()
    test_site.route("/slow/1", lambda _r: (200, {"Content-Type": "text/plain"}, b"fast"))
    test_site.route("/t-devtools/extra", lambda _r: (200, {"Content-Type": "text/plain"}, b"x"))
    assert requests.get(test_site.url("/t-devtools/extra"), timeout=5).text == "x"
    test_site.restore_routes(before)  # what the `site` fixture does after every test
    assert test_site.routes() == before
    assert requests.get(test_site.url("/t-devtools/extra"), timeout=5).status_code == 404
    assert requests.get(test_site.url("/slow/1"), timeout=5).text != "fast"
