"""Brotli from a real server through the whole fleet: Debian's nginx with its brotli filter
(devtools/nginx_site.py) and a plain twin serving the same directory, one worker on real
RabbitMQ and Redis crawling both with ARCHIVE=warc.

* Every page is fetched once from each server; the brotli server answers ``br`` (the WARC
  keeps each response as transferred), the plain one sends no Content-Encoding.
* Each page's record (title, links, content_hash, bytes, text length, encoding) is the same
  from both, links and canonical aside from the server's port; each says HTTP/1.1 and
  127.0.0.1.
* The re-parse tool reads the br responses back from the WARC (common/web/decoding.py's
  decode_body) to the very records the worker stored.

Over HTTPS, HTTP/2's DATA frames carry the br stream as well (a Fetcher on its own).

Debian's nginx has no zstd module: zstd (with br, gzip and deflate) comes from the loopback
test site's /encoded/ENC/N route, whose pages give a worker the records of the plain /page/N.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import brotli
import orjson
import pytest
from warcio.archiveiterator import ArchiveIterator

from common.intake.producer import Producer
from common.web.fetch import Fetcher
from devtools.nginx_site import NginxSite
from devtools.tls import make_pki
from tests.helpers import REPO_ROOT, TEST_ENV, WorkerThread, require_tool, results

pytestmark = pytest.mark.slow

PAGES = 12
#: What a page record says about its content, the same whichever way it was transferred.
PAGE_FIELDS = ("status", "content_type", "title", "description", "language", "bytes",
               "truncated", "text_length", "content_hash", "encoding", "links_count")
WORDS = ("brotli zstd gzip deflate caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \u0434\u043e\u043c "
         "window frame member stream bomb cap body page link title").split()


def _page(n: int) -> str:
    """Page ``n``: ~30 KB of UTF-8 HTML linking to the next pages three ways."""
    links = [f"p{(n + 1) % PAGES}.html", f"/p{(n + 2) % PAGES}.html",
             f"./p{(n + 3) % PAGES}.html#part", "/index.html"]
    paragraphs = "".join(
        f"<p id='s{i}'>{' '.join(WORDS[(n * 7 + i * j) % len(WORDS)] for j in range(30))}"
        f" ({n}.{i})</p>\n" for i in range(150))
    items = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>Encoded page {n} \u2014 caf\u00e9</title>"
            f'<meta name="description" content="Page {n} of {PAGES}.">'
            f'<link rel="canonical" href="/p{n}.html"></head>'
            f"<body><h1>Page {n}</h1>{paragraphs}<ul>{items}</ul></body></html>\n")


def _write_site(root: Path) -> list[str]:
    root.mkdir()
    paths = [f"/p{n}.html" for n in range(PAGES)]
    (root / "index.html").write_text("<!doctype html><title>Index</title>" + "".join(
        f'<a href="{path}">{path}</a>' for path in paths), encoding="utf-8")
    for n in range(PAGES):
        (root / f"p{n}.html").write_text(_page(n), encoding="utf-8")
    return paths


def _warc_responses(archive_dir: Path) -> dict[str, tuple[str | None, bytes]]:
    """Target URI -> (Content-Encoding, body as transferred, de-chunked) of each response."""
    found = {}
    for path in sorted(archive_dir.glob("*.warc.gz")):
        with open(path, "rb") as stream:
            for record in ArchiveIterator(stream, no_record_parse=False):
                if record.rec_type != "response":
                    continue
                uri = record.rec_headers.get_header("WARC-Target-URI")
                encoding = record.http_headers.get_header("Content-Encoding")
                # raw body less the chunked framing; content_stream() would also decode br
                chunked = record.http_headers.get_header("Transfer-Encoding") == "chunked"
                body = record.raw_stream.read()
                found[uri] = (encoding, _unchunk(body) if chunked else body)
    return found


def _unchunk(data: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        pos = end + 4 + size


def _comparable(record: dict, base: str) -> dict:
    fields = {key: record.get(key) for key in PAGE_FIELDS}
    fields["links"] = [link.replace(base, "BASE") for link in record["links"]]
    fields["canonical"] = (record.get("canonical") or "").replace(base, "BASE")
    return fields


def test_a_brotli_site_crawled_by_a_worker_gives_the_records_of_its_plain_twin(
        settings, redis_client, tmp_path):
    require_tool("nginx", Path("/usr/sbin"))
    paths = _write_site(tmp_path / "site")
    archive_dir = tmp_path / "archive"
    with NginxSite(tmp_path / "site", brotli=True) as br, NginxSite(tmp_path / "site") as plain:
        bases = {"br": br.base_url("127.0.0.1"), "plain": plain.base_url("127.0.0.1")}
        urls = {name: [base + path for path in paths] for name, base in bases.items()}
        with Producer(settings, redis_client) as producer:
            summary = producer.submit(urls["br"] + urls["plain"])
        assert summary.new == 2 * PAGES, summary.line()
        fleet = settings.with_overrides(idle_exit_s=1.0, concurrency=4, archive="warc",
                                        archive_dir=str(archive_dir))
        with WorkerThread(fleet) as worker:
            assert worker.join(90) == 0
        logged = {"br": br.requests(), "plain": plain.requests()}

    for name in ("br", "plain"):  # each page once, all answered 200, index never asked
        pages = Counter(path for path, status in logged[name] if status == 200
                        and path != "/robots.txt")
        assert pages == Counter(paths), (name, logged[name])

    records = {r["url"]: r for r in results(redis_client)}
    assert set(records) == set(urls["br"] + urls["plain"])
    for path in paths:
        over_br = records[bases["br"] + path]
        over_plain = records[bases["plain"] + path]
        assert over_br["http_version"] == "1.1" and over_br["remote_ip"] == "127.0.0.1"
        assert over_br["title"].startswith("Encoded page") and len(over_br["links"]) >= 3
        assert 25_000 < over_br["bytes"] == len((tmp_path / "site" / path[1:]).read_bytes())
        assert _comparable(over_br, bases["br"]) == _comparable(over_plain, bases["plain"])
        assert over_plain["http_version"] == "1.1" and over_plain["remote_ip"] == "127.0.0.1"

    archived = _warc_responses(archive_dir)
    for path in paths:
        on_disk = (tmp_path / "site" / path[1:]).read_bytes()
        encoding, body = archived[bases["br"] + path]
        assert encoding == "br" and len(body) < len(on_disk) // 3
        assert brotli.decompress(body) == on_disk
        assert archived[bases["plain"] + path] == (None, on_disk)

    out = tmp_path / "again.jsonl"
    env = {**os.environ, **TEST_ENV, "ARCHIVE": "warc", "ARCHIVE_DIR": str(archive_dir)}
    again = subprocess.run([sys.executable, "reparse.py", str(archive_dir), "-o", str(out)],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr
    reparsed = {r["url"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    for url in urls["br"]:
        base = bases["br"]
        assert _comparable(reparsed[url], base) == _comparable(records[url], base), url


def test_zstd_gzip_and_br_pages_from_the_test_site_give_the_records_of_the_plain_pages(
        settings, redis_client, site):
    encodings = ("br", "zstd", "gzip", "deflate")
    pages = (1, 2, 3)
    plain = [site.page_url(n) for n in pages]
    encoded = {(name, n): site.url(f"/encoded/{name}/{n}") for name in encodings for n in pages}
    with Producer(settings, redis_client) as producer:
        assert producer.submit(plain + list(encoded.values())).new == len(pages) * 5
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0, concurrency=4)) as worker:
        assert worker.join(60) == 0
    records = {r["url"]: r for r in results(redis_client)}
    sent = {r.path: r.headers.get("Accept-Encoding") for r in site.log}
    base = site.base_url.rstrip("/")
    for (name, n), url in encoded.items():
        assert sent[f"/encoded/{name}/{n}"] == "gzip, deflate, br, zstd"
        page = _comparable(records[site.page_url(n)], base)
        assert page["title"] == f"Page {n}" and page["bytes"] > 0
        # Document-relative links resolve against /encoded/NAME/: to the same pages so sent.
        got = _comparable(records[url], base)
        got["links"] = [link.replace(f"BASE/encoded/{name}/", "BASE/page/")
                        for link in got["links"]]
        assert got == page, url
        assert any(f"/encoded/{name}/" in link for link in records[url]["links"])


def test_brotli_over_https_and_http_2_decodes_to_the_file(settings, tmp_path):
    require_tool("nginx", Path("/usr/sbin"))
    paths = _write_site(tmp_path / "site")
    pki = make_pki(tmp_path / "pki")
    fetcher = Fetcher(settings.with_overrides(fetch_ca_bundle=str(pki.ca_cert)))
    try:
        with NginxSite(tmp_path / "site", tls=pki.leaf, brotli=True) as nginx:
            for path in paths[:3]:
                result = fetcher.fetch(nginx.url(path))
                assert (result.status, result.http_version) == (200, "2")
                assert result.headers.get("content-encoding") == "br"
                assert result.body == (tmp_path / "site" / path[1:]).read_bytes()
    finally:
        fetcher.close()
