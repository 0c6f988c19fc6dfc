"""Whom a fetch trusts, against Debian's nginx over HTTPS + HTTP/2 with a private CA made by
``openssl`` (devtools/tls.py, devtools/nginx_site.py); everything on loopback.

One nginx per certificate (valid, expired, wrong host), booted once for the module.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.nginx_site import NginxSite
from devtools.tls import LEAF_HOST, WRONG_HOST, Pki, make_pki

PAGE = b"<html><head><title>Trusted</title></head><body>hello</body></html>\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def docroot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docroot")
    (root / "index.html").write_bytes(PAGE)
    (root / "robots.txt").write_text("User-agent: *\nDisallow: /private/\n")
    return root


@pytest.fixture(scope="module")
def good(pki: Pki, docroot: Path) -> Iterator[NginxSite]:
    with NginxSite(docroot, tls=pki.leaf) as site:
        yield site


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
    offset = good.log_offset()
    done = subprocess.run(["curl", "-sS", "--http2", "--cacert", str(pki.ca_cert), "-o", "-",
                           "-w", "%{http_version} %{http_code}", good.url("/index.html"),
                           good.url("/missing.html")],
                          capture_output=True, check=True)
    assert done.stdout.startswith(PAGE)
    assert done.stdout.endswith(b"2 404")
    assert good.requests(offset) == [("/index.html", 200), ("/missing.html", 404)]


def test_nginx_compresses_with_brotli_when_asked(docroot: Path) -> None:
    (docroot / "big.html").write_text("<p>brotli</p>\n" * 500)
    with NginxSite(docroot, brotli=True) as site:
        done = subprocess.run(["curl", "-sS", "-D", "-", "-o", "/dev/null",
                               "-H", "Accept-Encoding: br", site.url("/big.html")],
                              capture_output=True, text=True, check=True)
    assert "content-encoding: br" in done.stdout.lower()
