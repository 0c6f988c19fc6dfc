"""The download worker's own steps: an asset fetched to a spool file, stored, recorded.

They follow the pages' Decode, Arrive, Wait, Robots and Admit (common/media/processor.py), so
an asset waits for the same robots.txt and takes its turn in the same per-domain rate limit as
the pages of its site:

1. **FetchAsset**   the request's ``media`` checked; the asset streamed to a spool file under
                    its type's cap (common/media/download.py), with the job's types and caps;
                    a failure retried or dead-lettered as a page's fetch is, an error status
                    classified as a page's;
2. **StoreAsset**   the job's quota asked, then the spool file stored by content hash
                    (common/media/store.py): only once the store has confirmed the whole
                    object does the trip go on; the spool file is removed whatever happens;
3. **RecordAsset**  its asset record appended to ``assets`` with the URL's done mark, permit
                    re-time and counters, in one call (common/store/results.py): one record per
                    media request, even when a delivery is processed twice.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from common.broker import topology
from common.broker.messages import BadMessage
from common.core.config import Settings
from common.core.errors import (
    AMQP_CONNECTION_LOST,
    OK,
    PERMANENT,
    FetchError,
    ServiceUnavailable,
    classify_status,
)
from common.core.media_types import KINDS, check_pattern, narrow
from common.intake.crawl import ThreadProducers
from common.store.keys import ASSETS_STREAM, job_run_key
from common.store.marks import Retime
from common.store.results import ResultStore
from common.web import multi
from common.web.ratelimit import RateLimiter
from common.work import metrics
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Failure, Outcome, Retry
from common.work.steps.fetch import follow_rule
from common.work.steps.trip import Trip

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A run's asset bytes taken from its MEDIA_QUOTA_BYTES (a field of ``job:{name}:run:{n}``).
QUOTA_FIELD = "media_bytes"


def media_field(extra: dict[str, Any]) -> dict[str, Any]:
    """A media request's ``media`` field, checked: ``kind`` one of KINDS, ``types`` patterns,
    ``page`` text.

    Raises:
        BadMessage: missing (a page's message on a media queue) or malformed.
    """
    media = extra.get("media")
    if not isinstance(media, dict):
        raise BadMessage("not a media request: no 'media' object (a page's message on a "
                         "media queue?)")
    if media.get("kind") not in KINDS:
        raise BadMessage(f"media.kind must be one of {', '.join(KINDS)}, "
                         f"not {media.get('kind')!r:.80}")
    types = media.get("types")
    if types is not None:
        if not isinstance(types, list) or not types:
            raise BadMessage("media.types must be a non-empty list of media types")
        try:
            for pattern in types:
                check_pattern(pattern)
        except ValueError as exc:
            raise BadMessage(f"media.types: {exc}") from None
    if not isinstance(media.get("page", ""), str):
        raise BadMessage("media.page must be a URL")
    if not isinstance(media.get("tool", ""), str):
        raise BadMessage("media.tool must be a tool's name (yt-dlp, gallery-dl)")
    return media


def offload(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a thread of its own; a fetch loop's task waits on a pipe meanwhile,
    so the loop's other downloads go on during a blocking upload. Its exception is raised."""
    read_fd, write_fd = os.pipe()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting task, raised there
            box["error"] = exc
        finally:
            os.write(write_fd, b"x")

    thread = threading.Thread(target=run, name="asset-upload", daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            if not multi.wait_fd(read_fd, 1.0):  # not in a loop's task: wait here
                thread.join()
    finally:
        thread.join()
        os.close(read_fd)
        os.close(write_fd)
    if "error" in box:
        raise box["error"]
    return box["value"]


class FetchAsset:
    def __init__(self, downloader: Any, limiter: RateLimiter, jobs: JobBook,
                 producers: ThreadProducers, max_redirects: int, tools: Any = None) -> None:
        self.downloader = downloader  # common/media/download.py
        self.tools = tools  # common/media/tools.py: MEDIA_TOOLS' (None: none)
        self.limiter = limiter
        self.jobs = jobs
        self.producers = producers  # a redirect to another origin: a request of its own
        self.max_redirects = max_redirects

    def fetch_asset(self, trip: Trip) -> Retry | DeadLetter | None:
        """Set ``trip.asset`` (a Download with its spool file) and ``trip.retime``."""
        try:
            media = media_field(trip.message.extra)
        except BadMessage as exc:
            return DeadLetter(Failure("bad_message", error=str(exc)))
        settings = self.jobs.settings_for(trip.job)
        types = narrow(tuple(media.get("types") or KINDS[media["kind"]]), settings.media_types)
        if not types:
            return DeadLetter(Failure("fetch_type_refused", error=(
                f"{media['kind']} {media.get('types') or ''}: none of MEDIA_TYPES "
                f"{','.join(settings.media_types)}")), unless_done=True)
        tool = media.get("tool")
        if tool is not None and (self.tools is None or tool not in settings.media_tools):
            return DeadLetter(Failure("fetch_tool_refused", error=(
                f"media.tool {tool!r:.40} is not in MEDIA_TOOLS "
                f"{','.join(settings.media_tools) or '(empty)'}")), unless_done=True)
        trip.progress.enter("fetch")
        try:
            if tool is not None:  # a child process; its hashing must not hold the loop
                download = offload(functools.partial(
                    self.tools.download, trip.url, tool=tool, types=types,
                    caps=settings.media_max_bytes))
            else:
                download = self.downloader.download(trip.url, types=types,
                                                    caps=settings.media_max_bytes,
                                                    follow=follow_rule(trip.url, trip.rules))
        except FetchError as exc:
            retime = Retime(trip.admission.permit, exc.sent_at)
            failure = Failure(f"fetch_{exc.kind}", error=f"{exc.kind}: {exc}")
            return Retry(failure, retime) if exc.transient else DeadLetter(failure, retime)
        except OSError as exc:  # the spool file: this worker's disk, not the site's fault
            logger.warning("%s: spool file failed (%s): retried later", trip.url, exc)
            return Retry(Failure("spool_failed", error=f"{type(exc).__name__}: {exc}"))
        trip.retime = Retime(trip.admission.permit, download.sent_at)
        if 300 <= download.status < 400 and download.headers.get("location"):
            trip.asset = download
            return self._hand_off(trip, media, download.headers["location"])
        verdict = classify_status(download.status)
        if verdict != OK or download.path is None:
            _remove(download.path)
            failure = Failure(f"http_{download.status}", status=download.status,
                              retry_after=download.headers.get("retry-after"))
            return (DeadLetter(failure, trip.retime) if verdict in (PERMANENT, OK)
                    else Retry(failure, trip.retime))
        trip.asset = download
        return None


    def _hand_off(self, trip: Trip, media: dict[str, Any], target: str
                  ) -> Retry | DeadLetter | None:
        """A redirect the downloader did not follow (another origin, or one robots.txt
        disallows): the target goes through the producer path as a media request of its own
        (its host's robots.txt and rate limit; deduplicated), claimed for this request, before
        this one is recorded with ``redirect_to`` (common/work/redirects.py, for assets)."""
        message = trip.message
        hops = message.extra.get("hops")
        hops = (hops if type(hops) is int else 0) + 1
        if hops > self.max_redirects:
            return DeadLetter(Failure("fetch_too_many_redirects", status=trip.asset.status,
                                      error=f"more than {self.max_redirects} redirects"),
                              trip.retime)
        extra = {"media": media, "redirected_from": trip.url, "hops": hops}
        if message.extra.get("meta"):
            extra["meta"] = message.extra["meta"]
        try:
            summary = self.producers.get().submit(
                [target], depth=message.depth, claim_token=trip.token, extra=extra,
                force_priority=trip.queue == topology.MEDIA_PRIORITY_QUEUE, job=trip.job)
        except (ServiceUnavailable, redis.RedisError, *AMQP_CONNECTION_LOST) as exc:
            return Retry(Failure("redirect_not_queued", status=trip.asset.status,
                                 error=f"{type(exc).__name__}: {exc}"), trip.retime)
        if summary.failed:
            return Retry(Failure("redirect_not_queued", status=trip.asset.status,
                                 error="the broker did not confirm the redirect target"),
                         trip.retime)
        trip.handed_off = {"redirect_to": target, "redirect": (
            "queued" if summary.new else "invalid" if summary.invalid else "duplicate")}
        return None


class StoreAsset:
    def __init__(self, store: Any, client: redis.Redis, jobs: JobBook) -> None:
        self.store = store  # common/media/store.py
        self.client = client
        self.jobs = jobs

    def store_asset(self, trip: Trip) -> Retry | DeadLetter | None:
        """Set ``trip.stored`` once the store confirmed the object; the spool file goes."""
        download = trip.asset
        if trip.handed_off is not None:
            return None  # a redirect: nothing to store
        try:
            settings = self.jobs.settings_for(trip.job)
            if (end := self._over_quota(trip, settings, download.size)) is not None:
                return end
            media = trip.message.extra["media"]
            metadata = {"source-url": trip.url, "page-url": media.get("page", ""),
                        "kind": media["kind"], "job": trip.job.scope if trip.job else "",
                        "sha256": download.sha256, "size": str(download.size)}
            trip.progress.enter("store")
            started = time.monotonic()
            try:
                trip.stored = offload(self.store.put, download.path, download.sha256,
                                      download.size, download.media_type, metadata,
                                      settings.media_prefix)
            except ServiceUnavailable as exc:
                self._give_back(trip, settings, download.size)
                return Retry(Failure("store_unavailable", error=str(exc)), trip.retime)
            trip.store_ms = (time.monotonic() - started) * 1000
            return None
        finally:
            _remove(download.path)

    def _over_quota(self, trip: Trip, settings: Settings, size: int) -> DeadLetter | None:
        """Take ``size`` bytes of the run's MEDIA_QUOTA_BYTES; a dead letter when they are not
        there (none taken then). The default job has no quota."""
        quota = settings.media_quota_bytes
        if not quota or trip.job is None:
            return None
        key = job_run_key(trip.job.name, trip.job.run)
        with multi.yielding():
            taken = int(self.client.hincrby(key, QUOTA_FIELD, size))
        if taken <= quota:
            return None
        with multi.yielding():
            self.client.hincrby(key, QUOTA_FIELD, -size)
        return DeadLetter(Failure("media_quota", error=(
            f"{size} bytes over job {trip.job.scope}'s media quota of {quota} "
            f"({taken - size} stored)")), trip.retime, unless_done=True)

    def _give_back(self, trip: Trip, settings: Settings, size: int) -> None:
        if settings.media_quota_bytes and trip.job is not None:
            with multi.yielding():
                self.client.hincrby(job_run_key(trip.job.name, trip.job.run), QUOTA_FIELD,
                                    -size)


class RecordAsset:
    def __init__(self, results: ResultStore, settings: Settings) -> None:
        self.results = results
        self.worker_id = settings.worker_id

    def record_asset(self, trip: Trip) -> Outcome:
        """Append the asset record: the outcome of the delivery."""
        download, stored, message = trip.asset, trip.stored, trip.message
        media = message.extra["media"]
        if trip.handed_off is not None:
            return self._record_redirect(trip, media)
        record: dict[str, Any] = {
            "url": trip.url, "final_url": download.final_url, "page": media.get("page"),
            "kind": media["kind"], "status": download.status,
            "content_type": download.media_type, "size": download.size,
            "bytes": download.size, "sha256": download.sha256, "key": stored.key,
            "location": stored.location, "stored": "existing" if stored.existed else "new",
            "resumed": download.resumed, "elapsed_ms": round(download.elapsed_ms, 1),
            "store_ms": round(trip.store_ms, 1), "fetched_at": round(time.time(), 3),
            "worker": self.worker_id, "depth": message.depth, "attempts": message.attempts + 1}
        _common_fields(record, message, trip)
        counters = {"assets_stored" if not stored.existed else "assets_existing": 1,
                    "asset_bytes": download.size}
        with multi.yielding():
            appended = self.results.record(record, counters=counters, done=trip.done,
                                           clear_failures=message.attempts > 0,
                                           retime=trip.retime, stream=ASSETS_STREAM)
        if not appended:
            return Outcome("already_done", trip.url, detail="asset already recorded")
        metrics.ASSETS.labels("existing" if stored.existed else "new").inc()
        metrics.ASSET_BYTES.inc(download.size)
        return Outcome("result", trip.url, detail=f"{download.size} bytes, "
                       f"{'already stored' if stored.existed else 'stored'} as {stored.key}")


    def _record_redirect(self, trip: Trip, media: dict[str, Any]) -> Outcome:
        """The asset record of a redirect handed off: status, where to, what became of it."""
        download, message = trip.asset, trip.message
        record: dict[str, Any] = {
            "url": trip.url, "final_url": download.final_url, "page": media.get("page"),
            "kind": media["kind"], "status": download.status, **trip.handed_off,
            "fetched_at": round(time.time(), 3), "worker": self.worker_id,
            "depth": message.depth, "attempts": message.attempts + 1}
        _common_fields(record, message, trip)
        with multi.yielding():
            self.results.record(record, done=trip.done, clear_failures=message.attempts > 0,
                                retime=trip.retime, stream=ASSETS_STREAM)
        return Outcome("result", trip.url, detail=f"status {download.status} to "
                       f"{trip.handed_off['redirect_to']} ({trip.handed_off['redirect']})")


def _common_fields(record: dict[str, Any], message: Any, trip: Trip) -> None:
    """What every asset record carries from its message: meta, where it was redirected
    from, its job and run."""
    for name in ("meta", "redirected_from"):
        if message.extra.get(name):
            record[name] = message.extra[name]
    if trip.job is not None:
        record.update(trip.job.fields())


def _remove(path: Path | None) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return  # removed already (the downloader removes its own on an error)
