"""ARCHIVE=warc (common/work/archive.py, archive_files.py, common/web/capture.py) and the
re-parse tool (common/ops/reparse.py), against real local HTTP servers; no broker, no Redis.
tests/test_archive_fleet.py runs the same through worker processes."""

from __future__ import annotations

import gzip
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from warcio.archiveiterator import ArchiveIterator

from common.core.config import Settings, load_settings
from common.core.errors import ConfigError
from common.ops.reparse import Reparser
from common.store.results import encode
from common.web.curl import Transfer
from common.web.fetch import Fetcher, FetchResult
from common.work import archive_files
from common.work.archive import Archive
from common.work.page_record import PageReader
from devtools.testsite import TestSite
from tests.helpers import REPO_ROOT
from tests.web.test_fetch import RawServer
from tests.work.test_extract import SHOP_RULES, detail_html

WARCIO = str(Path(sys.executable).parent / "warcio")
PAGE = b"<html><head><title>Kept</title></head><body><h1>Kept page</h1>" + \
    b"<p>words </p>" * 400 + b"</body></html>"


def _settings(directory: Path, **env: str) -> Settings:
    return load_settings({"ARCHIVE": "warc", "ARCHIVE_DIR": str(directory),
                          "FETCH_ALLOW_NETWORKS": "127.0.0.0/8", **env})


def _records(path: Path) -> list:
    """Every record of a WARC file: (type, WARC headers, block bytes, offset, length)."""
    out = []
    with open(path, "rb") as stream:
        records = ArchiveIterator(stream, no_record_parse=True)
        for record in records:
            block = record.raw_stream.read()
            records.read_to_end(record)
            out.append((record.rec_type, record.rec_headers, block,
                        records.get_record_offset(), records.get_record_length()))
    return out


def _at(directory: Path, ref: dict):
    """The record a result's ``archive`` reference points at, read on its own."""
    with open(directory / ref["file"], "rb") as stream:
        stream.seek(ref["offset"])
        records = ArchiveIterator(stream)
        record = next(iter(records))
        body = record.content_stream().read()
        records.read_to_end(record)
        assert records.get_record_length() == ref["length"]
        return record, body


def _check(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WARCIO, "check", "-v", *map(str, paths)], capture_output=True,
                          text=True, timeout=60)


def _one_file(directory: Path) -> Path:
    files = sorted(directory.glob("*.warc.gz"))
    assert len(files) == 1, files
    return files[0]


def _raw_answer(head: bytes, body: bytes):
    def handler(conn: socket.socket, _server: RawServer) -> None:
        conn.sendall(head + body)

    return handler


@pytest.fixture(scope="module")
def web() -> TestSite:
    with TestSite(pages=20) as site:
        site.route("/gz", lambda _r: (200, {"Content-Type": "text/html; charset=utf-8",
                                            "Content-Encoding": "gzip"}, gzip.compress(PAGE)))
        site.route("/png", lambda _r: (200, {"Content-Type": "image/png"}, b"\x89PNG" * 50))
        site.route("/shop/item/2", lambda _r: (200, {"Content-Type": "text/html"},
                                               detail_html(2).encode()))
        yield site


# -- what a response record holds --------------------------------------------------------------

def test_a_gzip_body_is_kept_as_transferred_with_the_head_as_received(tmp_path):
    gz = gzip.compress(PAGE)
    head = (b"HTTP/1.1 200 OK\r\nContent-Type:text/html;charset=utf-8\r\n"
            b"X-Odd:   spaced value  \r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(gz))
    settings = _settings(tmp_path)
    archive, fetcher = Archive(settings), Fetcher(settings)
    with RawServer(_raw_answer(head, gz)) as server:
        response = archive.write(fetcher.fetch(server.url("/gz?x=1")))
    archive.close()
    assert response.body == PAGE and response.exchanges == ()
    (_, info, _, _, _), (kind, warc, block, offset, length), (req_kind, req, sent, _, _) = \
        _records(_one_file(tmp_path))
    assert info.get_header("WARC-Type") == "warcinfo"
    assert kind == "response" and block == head + gz  # byte for byte, gzip kept
    assert warc.get_header("WARC-Target-URI") == server.url("/gz?x=1")
    assert warc.get_header("WARC-IP-Address") == "127.0.0.1"
    assert warc.get_header("WARC-Truncated") is None
    assert req_kind == "request" and sent.startswith(b"GET /gz?x=1 HTTP/1.1\r\n")
    assert b"\r\nUser-Agent: " + settings.user_agent.encode() + b"\r\n" in sent
    assert b"\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n" in sent
    assert req.get_header("WARC-Concurrent-To") == warc.get_header("WARC-Record-ID")
    assert response.archive == {"file": _one_file(tmp_path).name, "offset": offset,
                                "length": length}
    checked = _check(_one_file(tmp_path))
    assert checked.returncode == 0 and checked.stdout.count("digest pass") == 3, checked.stdout


def test_a_chunked_body_is_framed_as_one_chunk_and_reads_back_whole(tmp_path):
    gz = gzip.compress(PAGE)
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(part), part)
                      for part in (gz[:100], gz[100:101], gz[101:])) + b"0\r\n\r\n"
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    settings = _settings(tmp_path)
    archive, fetcher = Archive(settings), Fetcher(settings)
    with RawServer(_raw_answer(head, chunks)) as server:
        response = archive.write(fetcher.fetch(server.url("/chunked")))
    archive.close()
    assert response.body == PAGE
    record, body = _at(tmp_path, response.archive)
    assert body == PAGE  # warcio de-chunks and gunzips it
    assert _check(_one_file(tmp_path)).returncode == 0


def test_a_body_cut_at_the_cap_is_marked_truncated_in_the_record_and_the_result(tmp_path, web):
    settings = _settings(tmp_path, MAX_BODY_BYTES="1000")
    archive, fetcher = Archive(settings), Fetcher(settings)
    response = archive.write(fetcher.fetch(web.url("/big/8")))
    archive.close()
    assert response.truncated and len(response.body) == 1000
    record, body = _at(tmp_path, response.archive)
    assert record.rec_headers.get_header("WARC-Truncated") == "length"
    assert body[:1000] == response.body
    assert _check(_one_file(tmp_path)).returncode == 0


def test_a_raw_body_decoding_to_nothing_still_stops_at_the_cap(tmp_path):
    empty = gzip.compress(b"")  # 20 bytes of gzip member that decode to nothing
    body = empty * 5000  # 100 KB on the wire, nothing decoded: the decoded cap never trips
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
    settings = _settings(tmp_path, MAX_BODY_BYTES="4096")
    fetcher = Fetcher(settings)
    with RawServer(_raw_answer(head, body)) as server:
        response = fetcher.fetch(server.url("/empty-members"))
    assert response.truncated and response.body == b""
    assert 4096 < len(response.exchanges[-1].body) <= 4096 + 65536  # one read past the cap


def test_redirect_hops_are_archived_and_the_result_points_at_the_final_response(tmp_path, web):
    settings = _settings(tmp_path)
    archive, fetcher = Archive(settings), Fetcher(settings)
    response = archive.write(fetcher.fetch(web.url("/redirect/2")))
    archive.close()
    responses = [(w.get_header("WARC-Target-URI"), w.get_header("WARC-Truncated"))
                 for kind, w, *_ in _records(_one_file(tmp_path)) if kind == "response"]
    assert responses == [(web.url("/redirect/2"), "unspecified"),
                         (web.url("/redirect/1"), "unspecified"), (web.page_url(1), None)]
    record, body = _at(tmp_path, response.archive)
    assert record.rec_headers.get_header("WARC-Target-URI") == web.page_url(1)
    assert body == response.body


def test_an_error_status_and_an_unwanted_type_are_archived_too(tmp_path, web):
    settings = _settings(tmp_path)
    archive, fetcher = Archive(settings), Fetcher(settings)
    missing = archive.write(fetcher.fetch(web.url("/status/404")))
    image = archive.write(fetcher.fetch(web.url("/png")))
    archive.close()
    assert _at(tmp_path, missing.archive)[0].http_headers.get_statuscode() == "404"
    record, body = _at(tmp_path, image.archive)
    assert image.skipped == "content_type" and body == b""
    assert record.rec_headers.get_header("WARC-Truncated") == "unspecified"


def test_archive_none_keeps_nothing_and_uses_the_plain_callbacks(tmp_path, web):
    settings = load_settings({"FETCH_ALLOW_NETWORKS": "127.0.0.0/8"})
    fetcher = Fetcher(settings)
    response = fetcher.fetch(web.page_url(2))
    assert response.exchanges == () and response.archive is None
    assert type(fetcher._take().transfer) is Transfer  # the handle the fetch gave back
    assert Archive.from_settings(settings) is None


def test_an_unusable_archive_dir_stops_the_worker_at_start(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="ARCHIVE_DIR="):
        Archive(_settings(blocker / "archive"))
    with pytest.raises(ConfigError, match="ARCHIVE="):
        load_settings({"ARCHIVE": "zip"})


# -- files: rotation, a failed write, recovery -------------------------------------------------

def test_files_rotate_by_size_and_each_is_renamed_when_closed(tmp_path, web):
    settings = _settings(tmp_path, ARCHIVE_MAX_BYTES="3000")
    archive, fetcher = Archive(settings), Fetcher(settings)
    refs = [archive.write(fetcher.fetch(web.page_url(n))).archive for n in range(1, 9)]
    open_files = list(tmp_path.glob("*.open"))
    assert len(open_files) == 1 and open_files[0].name == refs[-1]["file"] + ".open"
    archive.close()
    files = sorted(tmp_path.glob("*.warc.gz"))
    assert not list(tmp_path.glob("*.open")) and len(files) >= 3
    assert {ref["file"] for ref in refs} == {f.name for f in files}
    for path in files:  # each file stays under the cap unless one fetch alone is larger
        assert path.stat().st_size <= 3000 or len(_records(path)) == 5
        assert _records(path)[0][0] == "warcinfo"
    for n, ref in enumerate(refs, 1):
        assert _at(tmp_path, ref)[0].rec_headers.get_header("WARC-Target-URI") == web.page_url(n)
    assert _check(*files).returncode == 0


def test_a_failed_write_is_cut_off_so_the_file_ends_with_a_whole_record(tmp_path, web,
                                                                       monkeypatch):
    settings = _settings(tmp_path)
    archive, fetcher = Archive(settings), Fetcher(settings)
    archive.write(fetcher.fetch(web.page_url(1)))
    size = archive._file.size
    real_write = os.write

    def disk_full(fd: int, data) -> int:
        real_write(fd, bytes(data[:50]))  # a part goes out, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(archive_files.os, "write", disk_full)
    with pytest.raises(OSError, match="No space"):
        archive.write(fetcher.fetch(web.page_url(2)))
    monkeypatch.setattr(archive_files.os, "write", real_write)
    assert os.path.getsize(archive._file.path) == size
    archive.write(fetcher.fetch(web.page_url(3)))
    archive.close()
    assert _check(_one_file(tmp_path)).returncode == 0


@pytest.mark.parametrize("fsync", ["true", "false"])
def test_archive_fsync_makes_each_record_durable_before_write_returns(tmp_path, web, fsync):
    settings = _settings(tmp_path, ARCHIVE_FSYNC=fsync)
    archive, fetcher = Archive(settings), Fetcher(settings)
    archive.write(fetcher.fetch(web.page_url(9)))
    file = archive._file
    assert (file.synced == file.size) is (fsync == "true")
    assert file.synced >= file.header_size  # the warcinfo is synced when the file is made
    archive.close()
    assert file.synced == file.size  # and everything when it is closed


def _orphan(directory: Path, web: TestSite, cut: int) -> tuple[Path, bytes, dict]:
    """A file as a killed worker leaves it: ``NAME.warc.gz.open``, unlocked, its last record
    cut ``cut`` bytes short. Returns its final path, the bytes kept, a result's reference."""
    settings = _settings(directory / "source")
    archive, fetcher = Archive(settings), Fetcher(settings)
    kept = archive.write(fetcher.fetch(web.page_url(4))).archive
    archive.write(fetcher.fetch(web.page_url(5)))
    archive.close()
    source = _one_file(directory / "source")
    data = source.read_bytes()
    last_offset = _records(source)[-1][3]  # page 5's request: the record cut short
    orphan = directory / (source.name + ".open")
    orphan.write_bytes(data[:len(data) - cut])
    return directory / source.name, data[:last_offset], kept


@pytest.mark.parametrize("cut", [200, 4], ids=["mid-record", "gzip-trailer"])
def test_an_orphan_open_file_is_cut_to_its_last_whole_record_and_renamed(tmp_path, web, cut):
    final, kept_bytes, ref = _orphan(tmp_path, web, cut)
    Archive(_settings(tmp_path))  # a worker starting on the same directory
    assert not list(tmp_path.glob("*.open"))
    assert final.read_bytes() == kept_bytes
    assert _at(tmp_path, ref)[0].rec_headers.get_header("WARC-Target-URI") == web.page_url(4)
    assert _check(final).returncode == 0


def test_a_live_writers_open_file_is_left_alone(tmp_path, web):
    settings = _settings(tmp_path)
    live, fetcher = Archive(settings), Fetcher(settings)
    live.write(fetcher.fetch(web.page_url(6)))
    path, size = live._file.path, live._file.size
    Archive(settings.with_overrides(worker_id="another"))  # recovers nothing: it is locked
    assert path.exists() and path.stat().st_size == size
    live.close()
    assert _check(_one_file(tmp_path)).returncode == 0


# -- re-parse ----------------------------------------------------------------------------------

def _worker_record(settings: Settings, url: str, response: FetchResult) -> dict:
    record = PageReader(settings).read(url, response, queue="q", depth=0, attempts=1,
                                       cached=False).record
    return orjson.loads(orjson.dumps(record))


def test_reparse_reads_each_response_back_as_the_fetcher_read_it(tmp_path, web):
    rules = tmp_path / "rules.yml"
    rules.write_text(SHOP_RULES)
    settings = _settings(tmp_path / "warc", EXTRACT_RULES=f"@{rules}", MAX_BODY_BYTES="3000")
    archive, fetcher = Archive(settings), Fetcher(settings)
    paths = ["/gz", "/redirect/3", "/status/404", "/png", "/big/5", "/shop/item/2"]
    fetched = {}
    for path in paths:
        response = archive.write(fetcher.fetch(web.url(path)))
        fetched[web.url(path)] = _worker_record(settings, web.url(path), response)
    archive.close()
    again = [orjson.loads(encode(record))  # as the output line carries it
             for record in Reparser(settings).records(_one_file(tmp_path / "warc"))]
    assert [r["url"] for r in again] == list(fetched)  # hops folded into the page they led to
    for record in again:
        original = fetched[record["url"]]
        for key in ("final_url", "status", "bytes", "truncated", "redirects", "skipped",
                    "content_hash", "text_length", "title", "links", "archive", "data",
                    "data_errors"):
            assert record.get(key) == original.get(key), (record["url"], key)
    assert again[-1]["data"]["sku"] == "SKU-0002" and again[-1]["data_errors"]


def test_the_reparse_script_applies_other_rules_without_fetching(tmp_path, web, run_script):
    settings = _settings(tmp_path / "warc")
    archive, fetcher = Archive(settings), Fetcher(settings)
    archive.write(fetcher.fetch(web.url("/shop/item/2")))
    archive.close()
    rules = tmp_path / "rules.yml"
    rules.write_text("- name: sku\n  path: '^/shop/item/'\n  fields: {sku: \"[itemprop=sku]\"}\n")
    web.clear_log()
    out = tmp_path / "out.jsonl"
    done = run_script(str(tmp_path / "warc"), "-o", str(out), "--rules", f"@{rules}")
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [line["data"] for line in lines] == [{"sku": "SKU-0002"}]
    assert "fetched_at" not in lines[0] and lines[0]["archive"]["offset"] > 0
    assert web.log == []  # nothing was fetched
    bad = run_script(str(tmp_path / "warc"), "--rules", "@" + str(tmp_path / "missing.yml"))
    assert bad.returncode == 2 and "missing.yml" in bad.stderr


@pytest.fixture
def run_script():
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("EXTRACT_RULES", "EXTRACTOR", "ARCHIVE")}
        return subprocess.run([sys.executable, "reparse.py", *args], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    return run


def test_a_record_reads_back_from_its_offset_alone(tmp_path, web):
    settings = _settings(tmp_path)
    archive, fetcher = Archive(settings), Fetcher(settings)
    refs = [archive.write(fetcher.fetch(web.page_url(n))).archive for n in (7, 8)]
    archive.close()
    data = _one_file(tmp_path).read_bytes()
    for n, ref in zip((7, 8), refs, strict=True):
        member = data[ref["offset"]:ref["offset"] + ref["length"]]
        record = next(iter(ArchiveIterator(io.BytesIO(member))))
        assert record.rec_headers.get_header("WARC-Target-URI") == web.page_url(n)
