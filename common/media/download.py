"""Streaming downloads of media assets into spool files: guarded, capped, hashed, resumable.

:class:`Downloader` is the policy around one download; the libcurl callbacks that judge the
headers and stream the body are common/media/download_transfer.py.

* The page fetch's machinery (common/web/fetch.py, curl.py): pycurl easy handles kept in a
  pool, the transfer run by :func:`common.web.multi.perform` (inside a worker's fetch loop the
  other downloads and pages go on meanwhile), the address guard in the open-socket callback on
  every connection of every hop, redirects followed here (at most MAX_REDIRECTS, http(s) only,
  ``user:password@`` dropped, the caller's ``follow`` asked), the header caps, the stalled-read
  timeout (READ_TIMEOUT_S) and one total time for the whole download (MEDIA_TIMEOUT_S, every
  resumed part included). ``Accept-Encoding: identity``: an asset is stored as the server
  has it; a server that encodes anyway is decoded under the cap.
* The body goes to a spool file (``asset-*`` in ``spool_dir``, MEDIA_SPOOL_DIR or the system's
  temporary directory) and into a running sha256 as it arrives: memory stays flat whatever
  the size. The type (``types``) and the cap of that type (MEDIA_MAX_BYTES) are checked at the
  end of the headers, before a byte of the body; a body growing past the cap is stopped there.
  On any error the spool file is removed; on success the caller owns it (and removes it).
* Resume: a transfer that breaks off mid-body (connection lost, stalled read) from a server
  that said ``Accept-Ranges: bytes`` with a strong ETag or a Last-Modified goes on with
  ``Range: bytes=N-`` and ``If-Range``: a 206 from N appends (the hash goes on), a 200 (the
  asset changed) starts again. At most :data:`MAX_RESUMES` times per download.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pycurl

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.redact import redact_url
from common.media.download_transfer import MediaTransfer
from common.web import trust
from common.web.curl import new_easy_handle, next_hop, perform_once, sendable
from common.web.curl_errors import classify
from common.web.netguard import AddressGuard

logger = logging.getLogger(__name__)

#: Resumed parts per download at most (a server that keeps breaking off is retried later).
MAX_RESUMES = 3
#: FetchError kinds of a broken transfer that a range request may continue.
_RESUMABLE_KINDS = frozenset({"timeout", "connection"})
#: Transfer stops that are the download's failure, raised with their own kind.
_FAILED_STOPS = {"type_refused": "type_refused", "too_large": "too_large",
                 "headers_too_large": "headers_too_large", "invalid": "invalid",
                 "range_mismatch": "connection"}


@dataclass
class Download:
    """One download's outcome. ``path``: the spool file holding exactly the asset's bytes
    (the caller removes it), None when no body was kept (a non-2xx, a refused redirect)."""

    url: str
    final_url: str
    status: int
    media_type: str
    size: int
    sha256: str
    path: Path | None
    elapsed_ms: float
    sent_at: float | None
    resumed: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Handle:
    curl: pycurl.Curl
    transfer: MediaTransfer
    generation: int
    verifies: bool = True


class Downloader:
    """Downloads assets with the fleet's address guard, caps and timeouts.

    Thread-safe and safe for a fetch loop's tasks: each download takes an easy handle from
    the pool (or makes one) and gives it back at its end.
    """

    def __init__(self, settings: Settings, guard: AddressGuard | None = None) -> None:
        self.settings = settings
        trust.ca_file(settings)  # a bad FETCH_CA_BUNDLE stops the process now (ConfigError)
        self.guard = guard or AddressGuard(settings.fetch_allow_networks)
        self._lock = threading.Lock()
        self._idle: list[_Handle] = []
        self._generation = 0

    def close(self) -> None:
        """Close the idle handles; one in use is closed when its download ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for handle in idle:
            handle.curl.close()

    def download(self, url: str, *, types: tuple[str, ...], spool_dir: Path | None = None,
                 headers: Sequence[str] = (), follow: Callable[[str], bool] | None = None,
                 caps: tuple[tuple[str, int], ...] | None = None) -> Download:
        """GET ``url`` into a spool file, following redirects ourselves.

        Args:
            url: an http(s) URL.
            types: media type patterns (``image/*``, ``application/pdf``, ``*``) it may be.
            spool_dir: where the spool file goes (default MEDIA_SPOOL_DIR, else the system's
                temporary directory).
            headers: more request header lines (``"Name: value"``).
            follow: called with each redirect target; False ends the download there, the
                3xx returned (path None) with the target in ``headers["location"]``.
            caps: the size cap per type (a job's); default MEDIA_MAX_BYTES.

        Returns:
            The download; a non-2xx status is returned with ``path`` None.

        Raises:
            FetchError: ``kind`` timeout, connection (transient), or blocked, type_refused,
                too_large, too_many_redirects, bad_redirect, headers_too_large, invalid.
            OSError: the spool file could not be made or written (the worker's disk).
        """
        directory = spool_dir or self.settings.media_spool_dir or None
        handle = self._take()
        transfer = handle.transfer
        path: Path | None = None
        kept = False
        try:
            fd, name = tempfile.mkstemp(dir=directory, prefix="asset-")
            path = Path(name)
            with os.fdopen(fd, "wb") as spool:
                transfer.start(spool, types, caps or self.settings.media_max_bytes)
                result = self._run(handle, url, headers, follow)
                spool.flush()
            if result.status // 100 == 2:
                result.path, kept = path, True
            return result
        finally:
            transfer.finish()
            self._give_back(handle)
            if path is not None and not kept:
                path.unlink(missing_ok=True)

    # -- one download: its hops and resumed parts ---------------------------------------------------
    def _run(self, handle: _Handle, url: str, headers: Sequence[str],
             follow: Callable[[str], bool] | None) -> Download:
        settings = self.settings
        transfer, curl = handle.transfer, handle.curl
        started = time.perf_counter()
        deadline = time.monotonic() + settings.media_timeout_s
        base = ["Accept: */*", "Accept-Encoding: identity", *headers]
        sent_at: float | None = None
        current, hops, resumed = url, 0, 0
        validator: str | None = None
        while True:
            transfer.reset()
            lines = list(base)
            if transfer.range_from:
                lines += [f"Range: bytes={transfer.range_from}-", f"If-Range: {validator}"]
            curl.setopt(pycurl.HTTPHEADER, lines)
            self._check_tls(handle, current)
            error, hop_sent_at = self._perform(handle, current, deadline)
            sent_at = sent_at if sent_at is not None else hop_sent_at
            stop = transfer.stop
            if transfer.keeping and transfer.status == 200:  # a whole asset (again)
                validator = sendable(transfer.validator())
            if error is not None and error.kind in _RESUMABLE_KINDS and transfer.keeping \
                    and transfer.written > 0:
                if validator is None or resumed >= MAX_RESUMES or time.monotonic() >= deadline:
                    error.sent_at = sent_at
                    raise error
                resumed += 1
                transfer.range_from = transfer.written
                logger.info("download of %s broke off after %d bytes (%s): resuming (%d)",
                            redact_url(current), transfer.written, error, resumed)
                continue
            if error is not None:
                error.sent_at = sent_at
                raise error
            if stop == "spool_failed":  # not the site's fault: no FetchError kind
                raise OSError(transfer.detail)
            if stop in _FAILED_STOPS:
                raise FetchError(f"{redact_url(current)}: {transfer.detail}",
                                 kind=_FAILED_STOPS[stop], sent_at=sent_at)
            elapsed_ms = (time.perf_counter() - started) * 1000
            if stop == "redirect":
                target = next_hop(current, transfer.headers().get("location", ""))
                if follow is not None and not follow(target):
                    return Download(url, current, transfer.status, transfer.media_type, 0, "",
                                    None, elapsed_ms, sent_at, resumed,
                                    {**transfer.headers(), "location": target})
                hops += 1
                if hops > settings.max_redirects:
                    raise FetchError(f"more than {settings.max_redirects} redirects",
                                     kind="too_many_redirects", sent_at=sent_at)
                current = target
                transfer.range_from = 0
                transfer.restart()
                continue
            if not transfer.keeping:  # a non-2xx: its body was not kept
                return Download(url, current, transfer.status, transfer.media_type, 0, "",
                                None, elapsed_ms, sent_at, resumed, transfer.headers())
            if transfer.expected is not None and transfer.written != transfer.expected:
                raise FetchError(f"{redact_url(current)}: got {transfer.written} of "
                                 f"{transfer.expected} bytes", kind="connection",
                                 sent_at=sent_at)
            return Download(url, current, transfer.status, transfer.media_type,
                            transfer.written, transfer.hasher.hexdigest(), None, elapsed_ms,
                            sent_at, resumed, transfer.headers())

    def _perform(self, handle: _Handle, url: str,
                 deadline: float) -> tuple[FetchError | None, float | None]:
        """One request; returns the transport's failure (None: a response came whole, or a
        callback stopped it: ``transfer.stop``) and when the request was sent."""
        curl, transfer = handle.curl, handle.transfer
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            return FetchError(f"download took longer than {self.settings.media_timeout_s:g}s "
                              "(MEDIA_TIMEOUT_S)", kind="timeout"), None
        failure, sent_at = perform_once(curl, url, remaining_ms, self.settings.connect_timeout_s)
        if failure is None or transfer.stop is not None:
            return None, sent_at
        error = classify(failure, transfer, sent_at, self.settings)
        if error.kind == "timeout":
            error = FetchError(f"{failure.args[-1]} (MEDIA_TIMEOUT_S "
                               f"{self.settings.media_timeout_s:g}s, or no byte for "
                               f"READ_TIMEOUT_S)", kind="timeout", sent_at=sent_at)
        return error, sent_at

    def _check_tls(self, handle: _Handle, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "https":
            return
        checked = not trust.insecure(self.settings, parts.hostname)
        if checked != handle.verifies:
            handle.curl.setopt(pycurl.SSL_VERIFYPEER, 1 if checked else 0)
            handle.curl.setopt(pycurl.SSL_VERIFYHOST, 2 if checked else 0)
            handle.verifies = checked

    def _take(self) -> _Handle:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        transfer = MediaTransfer(self)
        return _Handle(new_easy_handle(self.settings, transfer), transfer, self._generation)

    def _give_back(self, handle: _Handle) -> None:
        with self._lock:
            if handle.generation == self._generation:
                self._idle.append(handle)
                return
        handle.curl.close()
