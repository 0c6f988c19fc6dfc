"""An S3 server on loopback for tests and local runs: moto's, in a child process.

    with S3Server() as s3:                     # http://127.0.0.1:PORT
        env = {**os.environ, **s3.env(), "MEDIA_STORE": "s3://assets"}
        s3.client().bucket_exists("assets")    # a minio.Minio signed with the test keys
        s3.pending_uploads("assets")           # multipart uploads begun, never completed

MinIO's own server would be the natural choice, but it is on no registry reachable here (not
on PyPI, npm or Debian), so the tests speak to moto's S3 (``moto[server]``, a dev dependency):
the same S3 API (signature v4, multipart uploads, bucket lifecycle), kept in memory. The fleet
itself never imports moto; it talks to any S3 through minio-py (common/media/store.py).

The server is ``python -m moto.server`` in its own process group on a free port of
127.0.0.1. :meth:`S3Server.env` gives what a worker needs: S3_ENDPOINT_URL and a random key
pair in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (moto accepts any; they are never printed).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from devtools.nginx_site import free_port

REGION = "us-east-1"


class S3Server:
    """moto's S3 server on ``host``:``port`` (a free port by default), started by
    :meth:`start` or ``with``; :meth:`stop` terminates, kills and reaps it."""

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None,
                 start_timeout_s: float = 30.0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.start_timeout_s = start_timeout_s
        self.access_key = "test-" + secrets.token_hex(10)
        self._secret_key = secrets.token_urlsafe(30)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: tempfile.TemporaryDirectory[str] | None = None

    def __repr__(self) -> str:  # never the secret
        return f"S3Server({self.endpoint})"

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: what S3_ENDPOINT_URL takes."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def env(self) -> dict[str, str]:
        """The environment a worker needs to use this server as its S3."""
        return {"S3_ENDPOINT_URL": self.endpoint, "S3_REGION": REGION,
                "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self._secret_key}

    def client(self) -> Any:
        """A ``minio.Minio`` signed with this server's test keys."""
        from minio import Minio  # runtime dependency, imported late: devtools loads without it

        return Minio(f"{self.host}:{self.port}", access_key=self.access_key,
                     secret_key=self._secret_key, secure=False, region=REGION)

    def pending_uploads(self, bucket: str, prefix: str = "") -> list[dict[str, Any]]:
        """Multipart uploads begun under ``prefix`` and neither completed nor aborted: each
        ``{"key", "upload_id", "parts"}`` (the number of parts uploaded so far)."""
        import boto3  # moto's own dependency: dev only, like this module

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                          aws_access_key_id=self.access_key,
                          aws_secret_access_key=self._secret_key)
        answer = s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        uploads = []
        for upload in answer.get("Uploads", []):
            parts = s3.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            uploads.append({"key": upload["Key"], "upload_id": upload["UploadId"],
                            "parts": len(parts.get("Parts", []))})
        return uploads

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API), for a test that starts empty."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def start(self) -> S3Server:
        self._log = tempfile.TemporaryDirectory(prefix="s3-server-")
        log_file = Path(self._log.name) / "moto.log"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=log_file.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.start_timeout_s
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace")[-2000:]
                state = (f"exited with {self._proc.returncode}" if self._proc.poll() is not None
                         else f"did not answer in {self.start_timeout_s} s")
                self.stop()
                raise RuntimeError(f"moto's S3 server {state}: {tail}")
            time.sleep(0.1)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False  # not listening yet: the caller polls until its deadline

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
            else:
                proc.wait()
        log, self._log = self._log, None
        if log is not None:
            log.cleanup()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main() -> None:
    """Run a server in the foreground for a local try (`python -m devtools.s3_server`)."""
    with S3Server() as server:
        print(f"S3_ENDPOINT_URL={server.endpoint} (keys: export from S3Server.env(); "
              "moto accepts any)", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            print("stopping", flush=True)


if __name__ == "__main__":
    main()
