"""Whom a fetch trusts, against Debian's nginx over HTTPS + HTTP/2 with a private CA made by
``openssl`` (devtools/tls.py, devtools/nginx_site.py); everything on loopback.

One nginx per certificate (valid, expired, wrong host), booted once for the module.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.core.config import Settings, load_settings
from common.core.errors import ConfigError, FetchError
from common.intake.sitemaps import SitemapReader
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import robots_key
from common.store.results import ResultStore
from common.web import trust
from common.web.fetch import Fetcher
from common.web.ratelimit import RateLimiter
from common.web.robots import origin_of, robots_fetcher
from common.work.giving_up import GivingUp
from common.work.outcome import DeadLetter, Retry
from common.work.poison import PoisonGuard
from common.work.robots_gate import RobotsGate
from common.work.steps.robots import Robots
from devtools.nginx_site import NginxSite
from devtools.tls import LEAF_HOST, WRONG_HOST, Pki, make_pki
from tests.helpers import wait_for
from tests.work.steps.conftest import failure_of, reason, trip_for

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)

#: /moved.html -> /index.html on the same site.
REDIRECTS = "        location = /moved.html { return 301 /index.html; }\n"
PAGE = b"<html><head><title>Trusted</title></head><body>hello</body></html>\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def docroot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docroot")
    (root / "index.html").write_bytes(PAGE)
    (root / "robots.txt").write_text("User-agent: *\nDisallow: /private/\n"
                                     "Sitemap: /sitemap.xml\n")
    return root


@pytest.fixture(scope="module")
def good(pki: Pki, docroot: Path) -> Iterator[NginxSite]:
    with NginxSite(docroot, tls=pki.leaf, server_extra=REDIRECTS) as site:
        yield site


@pytest.fixture(scope="module")
def expired(pki: Pki, docroot: Path) -> Iterator[NginxSite]:
    with NginxSite(docroot, tls=pki.expired) as site:
        yield site


@pytest.fixture(scope="module")
def wrong_host(pki: Pki, docroot: Path) -> Iterator[NginxSite]:
    with NginxSite(docroot, tls=pki.wrong_host) as site:
        yield site


@pytest.fixture
def make_fetcher(make_thread_fetcher: Callable[..., Fetcher]) -> Callable[..., Fetcher]:
    return make_thread_fetcher  # the fetch loop's path is tests/web/test_fetch.py's


def _fetch_error(fetcher: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url)
    return info.value


# -- the tools themselves ----------------------------------------------------------------------


def _openssl_verify(ca: Path, cert: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)],
                          capture_output=True, text=True, check=False)


def test_the_private_ca_signs_the_leaf_for_localhost_and_127_0_0_1(pki: Pki) -> None:
    assert _openssl_verify(pki.ca_cert, pki.leaf[0]).returncode == 0
    names = subprocess.run(["openssl", "x509", "-in", str(pki.leaf[0]), "-noout", "-ext",
                            "subjectAltName"], capture_output=True, text=True, check=True).stdout
    assert f"DNS:{LEAF_HOST}" in names and "IP Address:127.0.0.1" in names


def test_the_expired_leaf_is_expired_and_the_wrong_host_leaf_names_another_host(pki: Pki) -> None:
    assert "expired" in _openssl_verify(pki.ca_cert, pki.expired[0]).stderr
    names = subprocess.run(["openssl", "x509", "-in", str(pki.wrong_host[0]), "-noout", "-ext",
                            "subjectAltName"], capture_output=True, text=True, check=True).stdout
    assert f"DNS:{WRONG_HOST}" in names and LEAF_HOST not in names
    assert _openssl_verify(pki.other_ca_cert, pki.leaf[0]).returncode != 0


def test_nginx_serves_the_directory_over_https_and_logs_path_and_status(
        good: NginxSite, pki: Pki) -> None:
    offset, connections = good.log_offset(), good.connections()
    done = subprocess.run(["curl", "-sS", "--http2", "--cacert", str(pki.ca_cert), "-o", "-",
                           "-w", "%{http_version} %{http_code}", good.url("/index.html"),
                           good.url("/missing.html")],
                          capture_output=True, check=True)
    assert done.stdout.startswith(PAGE)
    assert done.stdout.endswith(b"2 404")
    assert good.await_requests(2, offset) == [("/index.html", 200), ("/missing.html", 404)]
    assert good.connections() - connections == 1  # both over one HTTP/2 connection


def test_nginx_compresses_with_brotli_when_asked(docroot: Path) -> None:
    (docroot / "big.html").write_text("<p>brotli</p>\n" * 500)
    with NginxSite(docroot, brotli=True) as site:
        done = subprocess.run(["curl", "-sS", "-D", "-", "-o", "/dev/null",
                               "-H", "Accept-Encoding: br", site.url("/big.html")],
                              capture_output=True, text=True, check=True)
    assert "content-encoding: br" in done.stdout.lower()


# -- certificate problems are permanent tls_certificate, with curl's message --------------------


def test_a_certificate_from_an_untrusted_ca_is_a_tls_certificate_error(
        good: NginxSite, make_fetcher: Callable[..., Fetcher]) -> None:
    error = _fetch_error(make_fetcher(), good.url("/index.html"))
    assert error.kind == "tls_certificate" and not error.transient
    assert str(error).startswith("curl error 60: ")
    assert "unable to get local issuer certificate" in str(error)


def test_an_expired_certificate_is_a_tls_certificate_error(
        expired: NginxSite, pki: Pki, make_fetcher: Callable[..., Fetcher]) -> None:
    error = _fetch_error(make_fetcher(fetch_ca_bundle=str(pki.ca_cert)),
                         expired.url("/index.html"))
    assert error.kind == "tls_certificate"
    assert "expired" in str(error)


def test_a_certificate_for_another_host_is_a_tls_certificate_error(
        wrong_host: NginxSite, pki: Pki, make_fetcher: Callable[..., Fetcher]) -> None:
    error = _fetch_error(make_fetcher(fetch_ca_bundle=str(pki.ca_cert)),
                         wrong_host.url("/index.html"))
    assert error.kind == "tls_certificate"
    assert LEAF_HOST in str(error)  # curl: no ... subject name matches target host 'localhost'


def test_a_handshake_reset_stays_a_transient_connection_error(
        make_fetcher: Callable[..., Fetcher]) -> None:
    """A server that reads the ClientHello and resets the TCP connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    hellos: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        hellos.append(conn.recv(4096))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # linger 0: RST

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        error = _fetch_error(make_fetcher(), f"https://localhost:{port}/")
    finally:
        server.join(timeout=5)
        listener.close()
    assert hellos and hellos[0][:1] == b"\x16"  # a TLS handshake record reached the server
    assert error.kind == "connection" and error.transient


# -- what to trust -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["add", "replace"])
def test_fetch_ca_bundle_file_trusts_the_private_ca_over_http2(
        mode: str, good: NginxSite, pki: Pki, make_fetcher: Callable[..., Fetcher]) -> None:
    fetcher = make_fetcher(fetch_ca_bundle=str(pki.ca_cert), fetch_ca_mode=mode)
    result = fetcher.fetch(good.url("/index.html"))
    assert (result.status, result.body, result.http_version) == (200, PAGE, "2")
    assert result.tls_verified is True


@pytest.mark.parametrize("mode", ["add", "replace"])
def test_fetch_ca_bundle_directory_trusts_every_pem_in_it(
        mode: str, good: NginxSite, pki: Pki, tmp_path: Path,
        make_fetcher: Callable[..., Fetcher]) -> None:
    shutil.copy(pki.other_ca_cert, tmp_path / "a-other.pem")
    shutil.copy(pki.ca_cert, tmp_path / "b-ours.crt")
    (tmp_path / "notes.txt").write_text("not a certificate, not read\n")
    fetcher = make_fetcher(fetch_ca_bundle=str(tmp_path), fetch_ca_mode=mode)
    result = fetcher.fetch(good.url("/index.html"))
    assert (result.status, result.http_version) == (200, "2")


def test_replace_mode_trusts_only_the_bundle(pki: Pki, good: NginxSite,
                                             make_fetcher: Callable[..., Fetcher]) -> None:
    fetcher = make_fetcher(fetch_ca_bundle=str(pki.other_ca_cert), fetch_ca_mode="replace")
    assert _fetch_error(fetcher, good.url("/index.html")).kind == "tls_certificate"
    replaced = Path(trust.ca_file(fetcher.settings)).read_bytes()
    added = Path(trust.ca_file(fetcher.settings.with_overrides(fetch_ca_mode="add"))).read_bytes()
    assert replaced == pki.other_ca_cert.read_bytes()
    assert pki.other_ca_cert.read_bytes().strip() in added and len(added) > 10 * len(replaced)


def test_ssl_cert_file_from_the_environment_is_honoured(
        good: NginxSite, pki: Pki, make_fetcher: Callable[..., Fetcher],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_cert))  # OpenSSL's variable, not a knob
    result = make_fetcher().fetch(good.url("/index.html"))
    assert (result.status, result.http_version) == (200, "2")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.other_ca_cert))  # replaces the roots
    with pytest.raises(FetchError) as refused:
        make_fetcher().fetch(good.url("/index.html"))
    assert refused.value.kind == "tls_certificate"


def _bad_bundle(problem: str, tmp_path: Path) -> Path:
    if problem == "missing":
        return tmp_path / "nowhere.pem"
    if problem == "empty_dir":
        return tmp_path
    junk = tmp_path / "junk.pem"
    junk.write_text("this is not a certificate\n")
    return junk


_BAD_BUNDLES = [("FETCH_CA_BUNDLE", "missing"), ("FETCH_CA_BUNDLE", "not_pem"),
                ("FETCH_CA_BUNDLE", "empty_dir"), ("SSL_CERT_FILE", "missing"),
                ("SSL_CERT_FILE", "not_pem"), ("SSL_CERT_FILE", "empty_dir")]


def _with_bad_bundle(variable: str, problem: str, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings with FETCH_CA_BUNDLE bad, or the environment's SSL_CERT_FILE bad."""
    bad = str(_bad_bundle(problem, tmp_path))
    settings = Settings().with_overrides(fetch_allow_networks=LOOPBACK)
    if variable == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", bad)
        return settings
    return settings.with_overrides(fetch_ca_bundle=bad)


@pytest.mark.parametrize(("variable", "problem"), _BAD_BUNDLES)
def test_a_bad_bundle_is_a_config_error_naming_the_variable_before_anything_is_fetched(
        variable: str, problem: str, tmp_path: Path, good: NginxSite,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _with_bad_bundle(variable, problem, tmp_path, monkeypatch)
    offset = good.log_offset()
    with pytest.raises(ConfigError, match=variable):
        fetcher = Fetcher(settings)
        try:
            fetcher.fetch(good.url("/index.html"))
        finally:
            fetcher.close()
    assert good.requests(offset) == []


@pytest.mark.parametrize(("variable", "problem"), _BAD_BUNDLES[::3])
def test_a_bad_bundle_is_a_config_error_when_the_fetcher_is_made(
        variable: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _with_bad_bundle(variable, problem, tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=variable):
        Fetcher(settings).close()


def test_ssl_cert_file_naming_a_directory_is_a_config_error(
        tmp_path: Path, pki: Pki, good: NginxSite, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(pki.ca_cert, tmp_path / "ca.pem")
    settings = Settings().with_overrides(fetch_allow_networks=LOOPBACK)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path))
    with pytest.raises(ConfigError, match="SSL_CERT_FILE"):
        fetcher = Fetcher(settings)
        try:
            fetcher.fetch(good.url("/index.html"))
        finally:
            fetcher.close()


def test_fetch_insecure_domains_fetches_without_checking_and_says_so(
        good: NginxSite, make_fetcher: Callable[..., Fetcher]) -> None:
    loaded = load_settings({"FETCH_INSECURE_DOMAINS": LEAF_HOST})
    fetcher = make_fetcher(fetch_insecure_domains=loaded.fetch_insecure_domains)
    result = fetcher.fetch(good.url("/index.html"))
    assert (result.status, result.tls_verified, result.http_version) == (200, False, "2")
    strict = make_fetcher()  # another host name for the same server is still checked
    assert _fetch_error(strict, good.url("/index.html", host="127.0.0.1")).kind == \
        "tls_certificate"


# -- robots.txt behind a certificate problem (the worker's robots step) --------------------------


def _giving_up(settings: Settings, client) -> GivingUp:
    return GivingUp(settings, client, RateLimiter(client, settings),
                    DoneSet(client, settings.seen_buckets), SeenSet(client, settings.seen_buckets),
                    ResultStore(client, settings.results_maxlen),
                    PoisonGuard(client, settings.poison_deliveries, settings.failures_ttl_s))


def test_a_robots_txt_behind_an_untrusted_certificate_dead_letters_the_page_at_once(
        settings, redis_client, good: NginxSite) -> None:
    gate = RobotsGate(settings, redis_client, RateLimiter(redis_client, settings),
                      robots_fetcher(settings))
    connections = good.connections()
    try:
        step = Robots(gate)
        first, second = (trip_for(good.url(f"/page{n}.html")) for n in (1, 2))
        ends = [step.ask_robots(first), step.ask_robots(second)]
    finally:
        gate.fetcher.close()
    assert good.connections() - connections == 1  # one refused handshake for both

    for end in ends:  # the second from the fleet's entry, without a fetch of its own
        assert isinstance(end, DeadLetter)
        assert failure_of(end) == "fetch_tls_certificate"
        assert end.failure.error.startswith("tls_certificate: robots.txt: curl error 60: ")
    outcome = _giving_up(settings, redis_client).settle(first, ends[0])
    assert reason(outcome) == "fetch_tls_certificate"
    assert outcome.publishes[0].headers["attempts"] == 1
    ttl_ms = redis_client.pttl(robots_key(origin_of(good.url("/"))))
    assert 0 < ttl_ms <= settings.retry_base_s * 1000


def test_a_robots_txt_handshake_reset_retries_and_the_retry_asks_again(
        settings, redis_client) -> None:
    resets: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed by the test
            conn.recv(4096)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            resets.append(1)

    threading.Thread(target=serve, daemon=True).start()
    gate = RobotsGate(settings, redis_client, RateLimiter(redis_client, settings),
                      robots_fetcher(settings))
    try:
        step = Robots(gate)
        url = f"https://localhost:{port}/page.html"
        end = step.ask_robots(trip_for(url))
        assert isinstance(end, Retry) and failure_of(end) == "robots_unavailable"
        assert end.failure.error.startswith("connection: ")
        first_retry_s = settings.retry_base_s / 2  # the shortest first backoff
        assert wait_for(lambda: redis_client.get(robots_key(origin_of(url))) is None,
                        first_retry_s)
        again = step.ask_robots(trip_for(url))
    finally:
        gate.fetcher.close()
        listener.close()
    assert isinstance(again, Retry) and len(resets) == 2  # robots.txt asked again


# -- the same trust for redirects and sitemaps ----------------------------------------------------


def test_a_redirect_hop_is_checked_with_the_same_trust(
        good: NginxSite, expired: NginxSite, pki: Pki, docroot: Path,
        make_fetcher: Callable[..., Fetcher]) -> None:
    fetcher = make_fetcher(fetch_ca_bundle=str(pki.ca_cert))
    result = fetcher.fetch(good.url("/moved.html"))
    assert (result.status, result.body, result.redirects) == (200, PAGE, 1)
    assert result.tls_verified is True and result.http_version == "2"
    away = f"        location = /away.html {{ return 302 {expired.url('/index.html')}; }}\n"
    with NginxSite(docroot, tls=pki.leaf, server_extra=away) as bouncer:
        error = _fetch_error(fetcher, bouncer.url("/away.html"))
        assert bouncer.await_requests() == [("/away.html", 302)]  # the first hop was trusted
    assert error.kind == "tls_certificate" and "expired" in str(error)


def test_sitemaps_and_their_robots_txt_are_read_with_fetch_ca_bundle(
        settings, redis_client, good: NginxSite, pki: Pki, docroot: Path) -> None:
    (docroot / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>{good.url('/index.html')}</loc></url></urlset>\n")
    reader = SitemapReader(settings.with_overrides(fetch_ca_bundle=str(pki.ca_cert)),
                           redis_client)
    origin = good.base_url()
    try:
        assert reader.robots_sitemaps(origin) == [good.url("/sitemap.xml")]
        sitemap = reader.read(good.url("/sitemap.xml"))
    finally:
        reader.fetcher.close()
    assert [entry.url for entry in sitemap.pages] == [good.url("/index.html")]
