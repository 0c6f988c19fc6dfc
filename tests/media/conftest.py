"""Fixtures of the media stage's tests: moto's S3 server (devtools/s3_server.py), started once
per session on loopback; ``s3_env`` puts its address and test keys into this process's
environment (minio's credential chain reads them there) and returns them for a child's; and
``s3_bucket``, a bucket name of the test's own, so tests sharing the server never meet."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.s3_server import S3Server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = s3_server.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_bucket() -> str:
    return f"test-{uuid.uuid4().hex[:20]}"


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """An empty directory for a test's spool files (what is left in it is what leaked)."""
    directory = tmp_path / "spool"
    directory.mkdir()
    return directory
