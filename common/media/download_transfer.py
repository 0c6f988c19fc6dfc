"""libcurl's side of one media download: the callbacks that check the type and the cap before
the body, then stream the body into the spool file while hashing it.

:class:`MediaTransfer` extends the page fetch's :class:`~common.web.curl.Transfer` (the
open-socket guard, the header caps, a redirect stopping at the end of its headers) with what a
download decides once its headers are in, before libcurl reads a byte of the body:

* a 2xx whose media type is not one the request wants stops, ``type_refused``;
* a 2xx whose size (Content-Length, or a 206's Content-Range total) is over its type's cap
  (MEDIA_MAX_BYTES) stops, ``too_large``;
* a 206 that does not start where the spool file ends stops, ``range_mismatch``; a 200 to a
  range request starts the file and its hash again;
* a non-2xx body is not kept: up to :data:`DISCARD_BYTES` of it are read and dropped (the
  connection stays usable), a longer one ends the transfer.

The write callback appends to the spool file and the running sha256 a chunk at a time, so a
body is never held in memory; one growing past the cap (no Content-Length, or a lying one) is
stopped at the cap, ``too_large``; a spool file that cannot be written stops it,
``spool_failed``. The download (common/media/download.py) owns the spool file
and the resume decisions; this module only records what it saw in :attr:`MediaTransfer.stop`.
"""

from __future__ import annotations

import hashlib
import re
from typing import IO, Any

from common.core.media_types import cap_for, media_type_of, wanted
from common.web.curl import Transfer
from common.web.decoding import DecodeError

#: A non-2xx body is read and dropped up to this size (keep-alive), then the transfer stops.
DISCARD_BYTES = 64 * 1024
_ABORT = 0  # fewer bytes than given: libcurl stops the transfer
_BLANK = (b"\r\n", b"\n")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)


class MediaTransfer(Transfer):
    """What the callbacks see of one download: per hop (status, headers) and per download
    (the spool file, the hash, the bytes written so far)."""

    __slots__ = ("types", "caps", "spool", "hasher", "written", "range_from", "media_type",
                 "cap", "expected", "keeping", "discarded")

    def __init__(self, owner: Any) -> None:
        self.types: tuple[str, ...] = ()
        self.caps: tuple[tuple[str, int], ...] = owner.settings.media_max_bytes
        self.spool: IO[bytes] | None = None
        self.hasher = hashlib.sha256()
        self.written = 0
        self.range_from = 0
        super().__init__(owner)

    def start(self, spool: IO[bytes], types: tuple[str, ...],
              caps: tuple[tuple[str, int], ...]) -> None:
        """A new download into ``spool`` (empty) of one of ``types``, under ``caps``."""
        self.spool = spool
        self.types = types
        self.caps = caps
        self.hasher = hashlib.sha256()
        self.written = 0
        self.range_from = 0

    def finish(self) -> None:
        """The download ended: the spool file is no longer the callbacks' to write."""
        self.spool = None

    def reset(self, accept_any_type: bool = True) -> None:
        """Before each request (hop or resumed part): what its response will say."""
        super().reset(True)  # the type is judged here, by the request's media types
        self.media_type = "application/octet-stream"
        self.cap = 0
        self.expected: int | None = None  # the whole asset's size, when the response says
        self.keeping = False  # a 2xx whose body goes to the spool file
        self.discarded = 0

    def restart(self) -> None:
        """Empty the spool file and the hash (a redirect, or a 200 to a range request)."""
        if self.spool is not None:
            self.spool.seek(0)
            self.spool.truncate()
        self.hasher = hashlib.sha256()
        self.written = 0

    # -- libcurl callbacks -----------------------------------------------------------------------
    def header(self, line: bytes) -> int | None:
        verdict = super().header(line)
        if (verdict is not None or self.stop is not None or line not in _BLANK
                or 100 <= self.status < 200):
            return verdict
        if not 200 <= self.status < 300:
            return None  # the caller classifies it; its body is dropped
        return self._judge()

    def _judge(self) -> int | None:
        """End of a 2xx's headers: its type, its size and where it starts, before the body."""
        self.media_type = media_type_of(self.content_type())
        if not wanted(self.types, self.media_type):
            self.stop = "type_refused"
            self.detail = f"media type {self.media_type} is not one of {', '.join(self.types)}"
            return _ABORT
        self.cap = cap_for(self.caps, self.media_type)
        length = _int(self.header_value(b"content-length:"))
        start = 0
        if self.status == 206:
            found = _CONTENT_RANGE.fullmatch(self.header_value(b"content-range:") or "")
            if found is None or int(found.group(1)) != self.range_from:
                self.stop = "range_mismatch"
                self.detail = (f"asked for bytes from {self.range_from}, got Content-Range "
                               f"{(self.header_value(b'content-range:') or '(none)')[:80]!r}")
                return _ABORT
            start = self.range_from
            total = found.group(3)
            self.expected = int(total) if total != "*" else (
                start + length if length is not None else None)
        else:
            if self.written:
                self.restart()  # a 200 to a range request: the whole asset again
            self.expected = length
        if self.decoder is not None:
            self.expected = None  # an encoded length says nothing of the decoded size
        if self.expected is not None and self.expected > self.cap:
            self.stop = "too_large"
            self.detail = (f"{self.media_type} of {self.expected} bytes is over its cap of "
                           f"{self.cap} (MEDIA_MAX_BYTES)")
            return _ABORT
        self.keeping = self.spool is not None and self.written == start
        if not self.keeping:
            self.stop = "range_mismatch"
            self.detail = "the spool file does not end where the response starts"
            return _ABORT
        return None

    def write(self, data: bytes) -> int | None:
        if not self.keeping:
            self.discarded += len(data)
            if self.discarded > DISCARD_BYTES:
                self.stop = "discarded"
                return _ABORT
            return None
        chunk = data
        room = self.cap - self.written
        if self.decoder is not None:
            try:
                chunk = self.decoder.decode(data, room + 1)  # one byte more tells "over"
            except DecodeError as exc:
                self.stop = "invalid"
                self.detail = str(exc)
                return _ABORT
        if len(chunk) > room:
            self.stop = "too_large"
            self.detail = (f"{self.media_type} body grew past its cap of {self.cap} bytes "
                           "(MEDIA_MAX_BYTES)")
            return _ABORT
        spool = self.spool
        if spool is None:  # the download ended meanwhile (closed): nothing to write into
            self.stop = "invalid"
            self.detail = "the download ended"
            return _ABORT
        try:
            spool.write(chunk)
        except OSError as exc:  # the spool disk is full or gone: the worker's problem
            self.stop = "spool_failed"
            self.detail = f"writing the spool file failed: {exc}"
            return _ABORT
        self.hasher.update(chunk)
        self.written += len(chunk)
        return None

    # -- what the response allows ----------------------------------------------------------------
    def validator(self) -> str | None:
        """The response's ETag (strong) or Last-Modified, for If-Range, when it said it
        serves byte ranges; None when a broken transfer cannot be resumed."""
        if (self.header_value(b"accept-ranges:") or "").strip().lower() != "bytes" \
                or self.decoder is not None:
            return None
        etag = self.header_value(b"etag:")
        if etag and not etag.startswith("W/"):  # If-Range needs a strong validator
            return etag
        return self.header_value(b"last-modified:") or None


def _int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    return int(text.strip())
