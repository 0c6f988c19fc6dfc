"""What went over the wire, for the WARC archive (ARCHIVE=warc): :class:`ArchivingTransfer`.

The fetcher uses it instead of :class:`~common.web.curl.Transfer` when ARCHIVE=warc: the same
callbacks, plus the raw status line and header lines as received, the body bytes as transferred
(before our decoding; also capped at MAX_BODY_BYTES, so a gzip stream of empty members cannot
grow memory without end: past the cap the transfer stops and the page is marked truncated) and,
through libcurl's debug callback (VERBOSE on, nothing printed), the request headers as sent.
Each hop becomes an :class:`Exchange` for common/work/archive.py. With ARCHIVE=none none of this
runs: the plain Transfer, no debug callback, no copy.

Secrets do not reach the archive: each cookie's value in the request's ``Cookie`` header and
the response's ``Set-Cookie`` headers is replaced by ``[redacted]`` (the names and attributes
kept), unless ARCHIVE_KEEP_COOKIES=true keeps them as they went over the wire (a faithful
replay; the files then hold live sessions). A ``Proxy-Authorization`` value is always redacted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pycurl

from common.core.urls import without_credentials
from common.web.curl import Transfer

_ABORT = 0
REDACTED = b"[redacted]"
_BLANK = (b"\r\n", b"\n")
#: Transfer.stop -> the WARC-Truncated reason of the hop's record.
_CUT = {"truncated": "length", "redirect": "unspecified", "content_type": "unspecified"}


@dataclass(frozen=True, slots=True)
class Exchange:
    """One hop's request and response as they went over the wire (ARCHIVE=warc).

    ``body`` is as transferred: the Content-Encoding kept (gzip stays gzip), only the chunked
    framing removed (libcurl always de-chunks). ``cut`` says why it is incomplete: ``length``
    (a cap ended the transfer) or ``unspecified`` (not read: a redirect hop, an unwanted
    content type); None when complete.
    """

    url: str
    request: bytes  # request line and headers, as libcurl sent them
    head: bytes  # status line, header lines and the blank line, as received
    body: bytes
    ip: str | None
    sent_at: float | None
    cut: str | None


class ArchivingTransfer(Transfer):
    """A :class:`Transfer` that also keeps the raw request, response head and body."""

    __slots__ = ("request", "raw_head", "head_done", "raw", "raw_size")

    def reset(self, accept_any_type: bool) -> None:
        super().reset(accept_any_type)
        self.request = b""
        self.raw_head: list[bytes] = []
        self.head_done = False  # lines after the head are trailers, not part of it
        self.raw: list[bytes] = []
        self.raw_size = 0

    def debug(self, kind: int, data: bytes) -> None:
        if kind == pycurl.INFOTYPE_HEADER_OUT:
            # A request libcurl sends again (a re-used connection that was closed) replaces
            # the first; a head given in pieces is joined.
            done = not self.request or self.request.endswith(b"\r\n\r\n")
            self.request = data if done else self.request + data

    def header(self, line: bytes) -> int | None:
        if not self.head_done:
            if line.startswith(b"HTTP/"):
                self.raw_head = [line]  # an interim 1xx head is replaced by the final one
            else:
                self.raw_head.append(line)
        verdict = super().header(line)
        if line in _BLANK and not 100 <= self.status < 200:
            self.head_done = True
        return verdict

    def write(self, data: bytes) -> int | None:
        self.raw.append(data)
        self.raw_size += len(data)
        verdict = super().write(data)
        if verdict is None and self.raw_size > self.fetcher.settings.max_body_bytes:
            self.stop = "truncated"  # more raw bytes than the cap: a hostile encoding
            return _ABORT
        return verdict

    def exchange(self, url: str, curl: pycurl.Curl, sent_at: float | None) -> Exchange:
        """What this hop sent and received (call once ``perform()`` returned)."""
        cut = _CUT.get(self.stop or "")
        ip = curl.getinfo(pycurl.PRIMARY_IP) or None
        head = self.raw_head if self.stop != "redirect" else [_no_credentials(line)
                                                               for line in self.raw_head]
        request = self.request
        if not self.fetcher.settings.archive_keep_cookies:
            head = [_no_cookie_values(line) for line in head]
            request = b"\r\n".join(_no_cookie_values(line) for line in request.split(b"\r\n"))
        elif b"roxy-" in request:
            request = b"\r\n".join(_no_proxy_credentials(line)
                                    for line in request.split(b"\r\n"))
        return Exchange(url, request, b"".join(head),
                        b"" if cut == "unspecified" else b"".join(self.raw), ip, sent_at, cut)


def _no_credentials(line: bytes) -> bytes:
    """A Location header line without the target's ``user:password@`` (never recorded)."""
    if line[:9].lower() != b"location:" or b"@" not in line:
        return line
    value = line[9:].decode("latin-1").strip()
    return b"Location: " + without_credentials(value).encode("latin-1") + b"\r\n"


def _no_cookie_values(line: bytes) -> bytes:
    """A Cookie or Set-Cookie line with each value ``[redacted]`` (names and attributes kept),
    a Proxy-Authorization line with none; any other line as it is."""
    name, colon, value = line.partition(b":")
    lowered = name.strip().lower()
    if not colon or lowered not in (b"cookie", b"set-cookie", b"proxy-authorization"):
        return line
    end = b"\r\n" if value.endswith(b"\r\n") else b""
    value = value[:-2] if end else value
    if lowered == b"proxy-authorization":
        return name + b": " + REDACTED + end
    if lowered == b"cookie":
        pairs = [_masked(pair) for pair in value.split(b";")]
    else:  # the first pair is the cookie, the rest its attributes
        first, _, attrs = value.partition(b";")
        pairs = [_masked(first), *([attrs] if attrs else [])]
    return name + b":" + b";".join(pairs) + end


def _no_proxy_credentials(line: bytes) -> bytes:
    if line.partition(b":")[0].strip().lower() != b"proxy-authorization":
        return line
    return _no_cookie_values(line)


def _masked(pair: bytes) -> bytes:
    """``" name=value"`` -> ``" name=[redacted]"``; a pair without ``=`` is all value."""
    lead = pair[:len(pair) - len(pair.lstrip())]
    key, equals, _value = pair.strip().partition(b"=")
    return lead + (key + b"=" + REDACTED if equals else REDACTED)
