"""One S3 bucket through minio-py: the wire side of the asset store's S3 kind (store.py).

Any S3-compatible server: MinIO, AWS, moto in the tests. The endpoint and region are settings
(S3_ENDPOINT_URL, empty for AWS; S3_REGION); the credentials never are: minio's own chain
reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, then the AWS credentials file
(AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE).

An upload from MEDIA_MULTIPART_BYTES on is a multipart upload in parts of that size, so an
object appears under its key only with CompleteMultipartUpload, after every part arrived; a
smaller one is one PUT, which S3 stores whole or not at all. A worker killed midway leaves
an incomplete upload (invisible, but billed): :meth:`S3Bucket.open` adds a lifecycle rule
that aborts those after a day, when the server takes one.

Errors: the server unreachable, timing out or answering an error become
:class:`~common.core.errors.ServiceUnavailable` (transient: the caller retries the
delivery); at :meth:`S3Bucket.open`, a bad bucket name, no credentials or credentials the
server refuses are a :class:`~common.core.errors.ConfigError`. No message carries a key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.commonconfig import ENABLED, Filter
from minio.credentials import AWSConfigProvider, ChainedProvider, EnvAWSProvider
from minio.error import MinioException, S3Error
from minio.helpers import MAX_PART_SIZE, MIN_PART_SIZE, check_bucket_name
from minio.lifecycleconfig import AbortIncompleteMultipartUpload, LifecycleConfig, Rule

from common.core.config import Settings
from common.core.errors import ConfigError, ServiceUnavailable

logger = logging.getLogger(__name__)

AWS_ENDPOINT = "https://s3.amazonaws.com"
META_PREFIX = "x-amz-meta-"
#: The lifecycle rule :meth:`S3Bucket.open` adds: incomplete uploads aborted after a day.
ABORT_RULE_ID = "scrape-fleet-abort-incomplete-uploads"
ABORT_AFTER_DAYS = 1
_MISSING = {"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"}
_REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidBucketName"}
#: Connect fast, wait long enough for a 16 MiB part on a slow link; retried by urllib3.
_HTTP_TIMEOUT = urllib3.Timeout(connect=10, read=120)
_HTTP_RETRY = urllib3.Retry(total=3, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504])


class S3Bucket:
    """One bucket of an S3-compatible server, for the asset store.

    Args:
        settings: S3_ENDPOINT_URL, S3_REGION, MEDIA_MULTIPART_BYTES.
        bucket: the bucket's name (created by :meth:`open` when missing).

    Raises:
        ConfigError: a bad bucket name, endpoint or part size.
    """

    def __init__(self, settings: Settings, bucket: str) -> None:
        try:
            check_bucket_name(bucket, strict=True)
        except ValueError:
            raise ConfigError(f"MEDIA_STORE: {bucket!r} is not a valid S3 bucket name (3-63 "
                              "lower-case letters, digits, '.' and '-')") from None
        self.bucket = bucket
        self.name = f"s3://{bucket}"
        self.part_size = settings.media_multipart_bytes
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ConfigError(f"MEDIA_MULTIPART_BYTES={self.part_size} is outside S3's part "
                              f"sizes ({MIN_PART_SIZE} to {MAX_PART_SIZE} bytes)")
        url = urlsplit(settings.s3_endpoint_url or AWS_ENDPOINT)
        if url.scheme not in ("http", "https") or not url.hostname or url.path.strip("/") \
                or url.username or url.query:
            raise ConfigError("S3_ENDPOINT_URL must be http(s)://host[:port] with no path, "
                              "query or user")
        self.endpoint = f"{url.scheme}://{url.netloc}"
        self._provider = ChainedProvider([EnvAWSProvider(), AWSConfigProvider()])
        self._client = Minio(
            url.netloc, secure=url.scheme == "https", region=settings.s3_region or None,
            credentials=self._provider,
            http_client=urllib3.PoolManager(timeout=_HTTP_TIMEOUT, retries=_HTTP_RETRY,
                                            maxsize=10))

    def open(self) -> None:
        """Check the credentials, create the bucket when missing, ask for the abort rule.

        Raises:
            ConfigError: no credentials, or the server refuses them.
            ServiceUnavailable: the server does not answer (the caller retries the start).
        """
        try:
            self._provider.retrieve()
        except ValueError:
            raise ConfigError("no S3 credentials: set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or an AWS credentials file") from None
        try:
            with self._talking("open the bucket"):
                if not self._client.bucket_exists(self.bucket):
                    self._make_bucket()
        except ServiceUnavailable as exc:
            if isinstance(exc.__cause__, S3Error) and exc.__cause__.code in _REFUSED:
                raise ConfigError(str(exc)) from None
            raise
        self._abort_incomplete_uploads()

    def _make_bucket(self) -> None:
        try:
            self._client.make_bucket(self.bucket)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
            # another worker created it between our check and our create: what we wanted
        logger.info("media store: created bucket %s at %s", self.name, self.endpoint)

    def _abort_incomplete_uploads(self) -> None:
        """Add the rule aborting incomplete multipart uploads, keeping the bucket's others."""
        try:
            config = self._client.get_bucket_lifecycle(self.bucket)
            rules = list(config.rules) if config else []
            if any(rule.abort_incomplete_multipart_upload for rule in rules):
                return
            rules.append(Rule(ENABLED, rule_filter=Filter(prefix=""), rule_id=ABORT_RULE_ID,
                              abort_incomplete_multipart_upload=AbortIncompleteMultipartUpload(
                                  ABORT_AFTER_DAYS)))
            self._client.set_bucket_lifecycle(self.bucket, LifecycleConfig(rules))
        except (MinioException, urllib3.exceptions.HTTPError, ValueError) as exc:
            logger.warning("media store %s: the server did not take the lifecycle rule that "
                           "aborts incomplete uploads (%s): killed uploads stay until removed",
                           self.name, self._describe(exc))
            return
        logger.info("media store %s: incomplete multipart uploads are aborted after %d day",
                    self.name, ABORT_AFTER_DAYS)

    def stat(self, key: str) -> dict[str, str] | None:
        """The object's metadata (its ``x-amz-meta-*`` without the prefix, and
        ``content-type``), or None when there is no object under ``key``."""
        with self._talking("stat", key):
            try:
                found = self._client.stat_object(self.bucket, key)
            except S3Error as exc:
                if exc.code in _MISSING:
                    return None
                raise
        meta = {name.lower()[len(META_PREFIX):]: value
                for name, value in (found.metadata or {}).items()
                if name.lower().startswith(META_PREFIX)}
        meta["content-type"] = found.content_type or meta.get("content-type", "")
        return meta

    def upload(self, key: str, path: Path, content_type: str,
               metadata: dict[str, str]) -> None:
        """Upload ``path`` under ``key``; returns once the server confirmed the whole object."""
        user = {name: value for name, value in metadata.items() if name != "content-type"}
        with self._talking("upload", key):
            self._client.fput_object(self.bucket, key, str(path), content_type=content_type,
                                     metadata=user, part_size=self.part_size)

    def read(self, key: str) -> bytes:
        """The object's bytes. Raises KeyError when there is none."""
        with self._talking("read", key):
            try:
                answer = self._client.get_object(self.bucket, key)
            except S3Error as exc:
                if exc.code in _MISSING:
                    raise KeyError(key) from None
                raise
            try:
                return answer.read()
            finally:
                answer.close()
                answer.release_conn()

    def keys(self, prefix: str = "") -> list[str]:
        """Every object's key under ``prefix``, sorted (complete objects only: S3 lists
        nothing of an upload in progress)."""
        with self._talking("list", prefix):
            return sorted(str(found.object_name) for found in self._client.list_objects(
                self.bucket, prefix=prefix or None, recursive=True))

    @contextmanager
    def _talking(self, action: str, key: str = "") -> Iterator[None]:
        """Translate what minio and urllib3 raise into ServiceUnavailable, key-free."""
        try:
            yield
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            where = f"{self.name}/{key}" if key else self.name
            raise ServiceUnavailable(f"S3 store {where} at {self.endpoint}: {action} failed: "
                                     f"{self._describe(exc)}") from exc

    def _describe(self, exc: BaseException) -> str:
        text = (f"{exc.code}: {exc.message}" if isinstance(exc, S3Error)
                else f"{type(exc).__name__}: {exc}")
        try:
            credentials = self._provider.retrieve()
        except ValueError:
            return text  # no credentials at all: none to leave out
        for secret in (credentials.secret_key, credentials.session_token):
            if secret:
                text = text.replace(secret, "<secret>")
        return text
