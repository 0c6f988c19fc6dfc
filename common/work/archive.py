"""ARCHIVE=warc: every fetched response kept as it was transferred, in WARC 1.1 files.

One :class:`Archive` per worker process, shared by its fetch tasks. For every response the
fetcher returned (any status; cache hits were fetched before and are not archived again) the
processor calls :meth:`Archive.write` before the outcome is stored, and the result record gets
``archive: {"file": NAME.warc.gz, "offset": N, "length": L}``: the gzip member of the final
response record (``seek(N)``, then warcio's ArchiveIterator reads it).

Per fetch, for each hop (redirects first, the final response last), a ``response`` record
then a ``request`` record (``WARC-Concurrent-To`` the response), each its own gzip member
(zlib level 1: warcio's own level 9 would add about half a page's CPU; NOTES #38):

* response: the status line and header lines exactly as received, then the body as
  transferred: a gzip body stays gzip. libcurl always removes chunked framing, so a chunked
  body is framed again as one chunk, keeping the head true. A body cut at MAX_BODY_BYTES has
  ``WARC-Truncated: length``; a body never read (a redirect hop's, an unwanted content type's)
  ``WARC-Truncated: unspecified``. ``WARC-Target-URI`` is the URL of that hop (the final URL
  for the final response), ``WARC-IP-Address`` the address libcurl connected to.
* request: the request line and headers as libcurl sent them.

Digests: ``WARC-Block-Digest`` and ``WARC-Payload-Digest`` (sha1, base32, warcio's Digester),
computed here because warcio's writer would rebuild the HTTP head from its parsed form.

Durability: a fetch's records are one ``write`` of the open file (common/work/archive_files.py)
under the writer's lock, so they are in the file before the result that points at them is
stored, and a killed worker leaves at most a partial last record, cut off when the next
worker starts. ARCHIVE_FSYNC adds an fsync before the result is stored (one fsync covers
every thread's records written before it).
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import threading
import time
import zlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders, StatusAndHeadersParser
from warcio.timeutils import datetime_to_iso_date
from warcio.utils import Digester
from warcio.warcwriter import WARCWriter

from common.core.config import Settings
from common.core.errors import ConfigError
from common.web.capture import Exchange
from common.web.curl import first_header, parse_head
from common.web.fetch import FetchResult
from common.work.archive_files import SUFFIX, WarcFile, recover_orphans
from common.work.outcome import Outcome

__all__ = ["FILE_PREFIX", "Archive", "with_archive"]

logger = logging.getLogger(__name__)

FILE_PREFIX = "fleet"
GZIP_LEVEL = 1
WARC_VERSION = "1.1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._]+")


class Archive:
    """The WARC writer of one worker process (thread-safe)."""

    def __init__(self, settings: Settings) -> None:
        self.directory = Path(settings.archive_dir)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError("not writable")
            recover_orphans(self.directory)
        except OSError as exc:
            raise ConfigError(f"ARCHIVE_DIR={settings.archive_dir!r} cannot be used: "
                              f"{exc}") from None
        self.max_bytes = settings.archive_max_bytes
        self.fsync = settings.archive_fsync
        self.worker = _UNSAFE.sub("_", settings.worker_id).strip("_") or "worker"
        self._info = {"software": "scrape-fleet (warcio)", "format": "WARC File Format 1.1",
                      "conformsTo": "https://iipc.github.io/warc-specifications/"
                                    "specifications/warc-format/warc-1.1/",
                      "hostname": socket.gethostname(), "worker": settings.worker_id,
                      "http-header-user-agent": settings.user_agent,
                      "robots": "obey" if settings.robots_enabled else "ignore"}
        self._lock = threading.Lock()
        self._file: WarcFile | None = None
        self._serial = 0
        self._local = threading.local()

    @classmethod
    def from_settings(cls, settings: Settings) -> Archive | None:
        """The worker's archive, or None with ARCHIVE=none."""
        return cls(settings) if settings.archive == "warc" else None

    def write(self, response: FetchResult) -> FetchResult:
        """Append ``response``'s records; returns it with ``archive`` (the final response
        record's reference) set and the raw exchanges let go. A response fetched without
        ARCHIVE=warc (no exchanges) is returned as it is.

        Raises:
            OSError: the file could not be written (it is left ending with a whole record).
        """
        if not response.exchanges:
            return response
        members = self._members(response.exchanges)
        blob = b"".join(members)
        final_at = len(blob) - len(members[-1]) - len(members[-2])
        with self._lock:
            file = self._file_for(len(blob))
            offset = file.append(blob)
        if self.fsync:
            file.sync(offset + len(blob))
        ref = {"file": file.name, "offset": offset + final_at, "length": len(members[-2])}
        return replace(response, exchanges=(), archive=ref)

    def close(self) -> None:
        """Close (and rename) the open file; the next write starts a new one."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    # -- files ----------------------------------------------------------------------------------
    def _file_for(self, size: int) -> WarcFile:
        """The file to append ``size`` bytes to: a new one when the open one would pass
        ARCHIVE_MAX_BYTES (a blob larger than that gets a file of its own)."""
        current = self._file
        if current is not None and current.size + size > self.max_bytes \
                and current.size > current.header_size:
            current.close()
            current = self._file = None
        if current is None:
            current = self._file = self._new_file()
        return current

    def _new_file(self) -> WarcFile:
        while True:
            self._serial += 1
            now = time.time()
            stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now)) + f"{now % 1:.3f}"[2:]
            name = f"{FILE_PREFIX}-{stamp}-{self.worker}-{self._serial:05d}{SUFFIX}"
            if (self.directory / name).exists():
                continue
            warcinfo = self._writer().create_warcinfo_record(name, self._info)
            try:
                file = WarcFile(self.directory, name, _gzip(self._serialise(warcinfo)))
            except FileExistsError:
                continue
            logger.info("worker %s writing WARC file %s", self.worker, file.path)
            return file

    # -- records --------------------------------------------------------------------------------
    def _writer(self) -> WARCWriter:
        writer = getattr(self._local, "writer", None)
        if writer is None:
            writer = self._local.writer = WARCWriter(None, gzip=False, warc_version=WARC_VERSION)
        return writer

    def _serialise(self, record: ArcWarcRecord) -> bytes:
        writer = self._writer()
        writer.out = io.BytesIO()
        writer.write_record(record)
        return writer.out.getvalue()

    def _members(self, exchanges: tuple[Exchange, ...]) -> list[bytes]:
        """Each hop's response and request records, one gzip member each, in file order."""
        members = []
        for exchange in exchanges:
            date = _warc_date(exchange.sent_at)
            _status, lines, _rest = parse_head(exchange.head)
            body = exchange.body
            chunked = "chunked" in (first_header(lines, b"transfer-encoding:") or "").lower()
            if chunked and exchange.cut != "unspecified":
                body = (b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
            fields = [("WARC-Target-URI", exchange.url), ("WARC-Date", date)]
            if exchange.ip:
                fields.append(("WARC-IP-Address", exchange.ip))
            response_id = StatusAndHeadersParser.make_warc_id()
            response = _http_record("response", response_id, fields, exchange.head, body,
                                    [("WARC-Truncated", exchange.cut)] if exchange.cut else [])
            request = _http_record("request", StatusAndHeadersParser.make_warc_id(), fields,
                                   exchange.request, b"",
                                   [("WARC-Concurrent-To", response_id)])
            members += [_gzip(self._serialise(response)), _gzip(self._serialise(request))]
        return members


def with_archive(outcome: Outcome, response: FetchResult) -> Outcome:
    """``outcome`` with the archive reference of ``response`` in its failure record, if it
    has one (an HTTP error status dead-lettered at once or after its last retry)."""
    if outcome.record is not None and response.archive is not None:
        outcome.record["archive"] = response.archive
    return outcome


def _http_record(kind: str, record_id: str, fields: list[tuple[str, str]], head: bytes,
                 body: bytes, more: list[tuple[str, str]]) -> ArcWarcRecord:
    """A ``response`` or ``request`` record whose block is ``head`` + ``body`` byte for byte."""
    block_digest, payload_digest = Digester("sha1"), Digester("sha1")
    block_digest.update(head)
    block_digest.update(body)
    payload_digest.update(body)
    headers = StatusAndHeaders("", [("WARC-Type", kind), ("WARC-Record-ID", record_id),
                                    *fields, *more,
                                    ("WARC-Block-Digest", str(block_digest)),
                                    ("WARC-Payload-Digest", str(payload_digest))],
                               protocol=f"WARC/{WARC_VERSION}")
    block = head + body
    return ArcWarcRecord("warc", kind, headers, io.BytesIO(block), None,
                         f"application/http; msgtype={kind}", len(block))


def _warc_date(sent_at: float | None) -> str:
    moment = datetime.fromtimestamp(time.time() if sent_at is None else sent_at, UTC)
    return datetime_to_iso_date(moment.replace(tzinfo=None), use_micros=True)


def _gzip(data: bytes) -> bytes:
    """One gzip member (level 1: see the module docstring)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return compressor.compress(data) + compressor.flush()
