"""The asset store (common/media/store.py) against moto's S3 server and a temp directory:
bytes and metadata back as put, one object per hash, and no object from a put killed midway."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from common.core.config import load_settings
from common.core.errors import ConfigError, ServiceUnavailable
from common.media.store import AssetStore, FileStore, asset_key, open_store
from devtools.nginx_site import free_port
from devtools.s3_server import S3Server
from tests.helpers import REPO_ROOT

MiB = 1 << 20


def _asset(tmp_path: Path, size: int, name: str = "asset.bin") -> tuple[Path, str]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def _wait_for(check: Callable[[], object], what: str, timeout_s: float = 30.0) -> object:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def _child(code: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO_ROOT,
                            env={**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(params=["directory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> AssetStore:
    if request.param == "directory":
        return open_store(load_settings({"MEDIA_STORE": str(tmp_path / "media")}))
    env = request.getfixturevalue("s3_env")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(load_settings({**env, "MEDIA_STORE": f"s3://{bucket}"}))


def test_an_asset_reads_back_byte_for_byte_with_its_metadata(store, tmp_path):
    path, sha = _asset(tmp_path, 300_000)
    stored = store.put(path, sha, 300_000, "image/png",
                       {"source-url": "http://site.test/caf\u00e9.png", "page-url":
                        "http://site.test/", "job": "j1", "kind": "image"})
    assert stored.key == asset_key(sha, "image/png")
    assert stored.key.endswith(f"sha256/{sha[:2]}/{sha[2:4]}/{sha}.png")
    assert stored.existed is False
    assert store.read(stored.key) == path.read_bytes()
    assert store.metadata(stored.key) == {
        "source-url": "http://site.test/caf%C3%A9.png", "page-url": "http://site.test/",
        "job": "j1", "kind": "image", "content-type": "image/png", "size": "300000",
        "sha256": sha}
    assert stored.location.endswith(stored.key)


def test_the_same_bytes_put_twice_are_stored_once(store, tmp_path):
    path, sha = _asset(tmp_path, 1000)
    first = store.put(path, sha, 1000, "application/pdf", {"source-url": "http://a.test/1"})
    again = store.put(path, sha, 1000, "application/pdf", {"source-url": "http://b.test/2"})
    assert (first.existed, again.existed) == (False, True)
    assert again.key == first.key and first.key.endswith(".pdf")
    assert store.keys() == [first.key]
    assert store.metadata(first.key)["source-url"] == "http://a.test/1"  # not overwritten


def test_a_missing_key_is_a_key_error_and_does_not_exist(store):
    key = asset_key("0" * 64, "image/gif")
    assert store.exists(key) is False
    with pytest.raises(KeyError):
        store.read(key)
    with pytest.raises(KeyError):
        store.metadata(key)


def test_an_s3_prefix_is_prepended_to_every_key(s3_env, s3_bucket, tmp_path):
    store = open_store(load_settings({**s3_env, "MEDIA_STORE": f"s3://{s3_bucket}/run/7"}))
    path, sha = _asset(tmp_path, 10)
    stored = store.put(path, sha, 10, "text/plain; charset=utf-8", {}, prefix="job-a/")
    assert stored.key == f"run/7/job-a/sha256/{sha[:2]}/{sha[2:4]}/{sha}.txt"
    assert stored.location == f"s3://{s3_bucket}/{stored.key}"
    assert store.keys("job-a/") == [stored.key] and store.keys("job-b/") == []


def test_opening_an_s3_store_asks_to_abort_incomplete_uploads_after_a_day(
        s3_server, s3_env, s3_bucket):
    open_store(load_settings({**s3_env, "MEDIA_STORE": f"s3://{s3_bucket}"}))
    rules = s3_server.client().get_bucket_lifecycle(s3_bucket).rules
    assert [r.abort_incomplete_multipart_upload.days_after_initiation for r in rules] == [1]


def test_a_file_store_never_lists_a_temp_file_or_a_lone_sidecar(tmp_path):
    store = FileStore(tmp_path / "media")
    path, sha = _asset(tmp_path, 100)
    stored = store.put(path, sha, 100, "image/webp", {})
    leaf = (tmp_path / "media" / stored.key).parent
    (leaf / f".{'1' * 64}.webp.x1y2.part").write_bytes(b"half")
    (leaf / f"{'2' * 64}.webp.meta.json").write_text("{}")
    assert store.keys() == [stored.key]
    assert sorted(p.name for p in leaf.iterdir()) == sorted([
        f".{'1' * 64}.webp.x1y2.part", f"{'2' * 64}.webp.meta.json", f"{sha}.webp",
        f"{sha}.webp.meta.json"])


S3_PUT_STALLED_AFTER_ONE_PART = """
import os, sys, time
from pathlib import Path
from minio import Minio
from common.core.config import load_settings
from common.media.store import open_store

marker, source, sha = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
real_upload_part = Minio._upload_part

def upload_part_then_stall(self, *args, **kwargs):
    etag = real_upload_part(self, *args, **kwargs)
    marker.touch()
    time.sleep(300)  # the test kills us here, parts uploaded, the upload not completed
    return etag

Minio._upload_part = upload_part_then_stall
store = open_store(load_settings(os.environ))
store.put(source, sha, source.stat().st_size, "video/mp4", {"kind": "video"})
"""


@pytest.mark.slow
def test_an_upload_killed_mid_multipart_leaves_no_object_and_a_second_put_succeeds(
        s3_server, s3_env, s3_bucket, tmp_path):
    path, sha = _asset(tmp_path, 40 * MiB, "video.mp4")
    env = {**s3_env, "MEDIA_STORE": f"s3://{s3_bucket}", "MEDIA_MULTIPART_BYTES": "5MiB"}
    marker = tmp_path / "first-part-sent"
    proc = _child(S3_PUT_STALLED_AFTER_ONE_PART, env, str(marker), str(path), sha)
    try:
        _wait_for(lambda: marker.exists() or proc.poll() is not None, "the first part")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        pending = s3_server.pending_uploads(s3_bucket)
        key = asset_key(sha, "video/mp4")
        assert [(u["key"], u["parts"] >= 1) for u in pending] == [(key, True)]
    finally:
        _kill(proc)
    store = open_store(load_settings(env))
    assert store.exists(key) is False
    assert store.keys() == []
    with pytest.raises(KeyError):
        store.read(key)

    again = store.put(path, sha, 40 * MiB, "video/mp4", {"kind": "video"})
    assert (again.key, again.existed) == (key, False)
    assert hashlib.sha256(store.read(key)).hexdigest() == sha
    assert store.keys() == [key]


FILE_PUT_FROM = """
import sys
from pathlib import Path
from common.media.store import FileStore

FileStore(Path(sys.argv[1])).put(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                 "image/png", {"kind": "image"})
"""


def test_a_file_put_killed_mid_write_leaves_no_object_under_the_key(tmp_path):
    root = tmp_path / "media"
    whole = os.urandom(4 * MiB)
    sha = hashlib.sha256(whole).hexdigest()
    fifo = tmp_path / "download"  # the child copies from a pipe: it writes what we send
    os.mkfifo(fifo)
    proc = _child(FILE_PUT_FROM, {}, str(root), str(fifo), sha, str(len(whole)))
    writer = None
    try:
        def open_writer() -> int | None:
            try:
                return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                return None  # no reader yet

        writer = _wait_for(open_writer, "the child to open the pipe")
        os.set_blocking(writer, True)
        os.write(writer, whole[:MiB])
        leaf = root / asset_key(sha, "image/png").rsplit("/", 1)[0]
        temps = _wait_for(lambda: [p for p in leaf.glob(".*.part") if p.stat().st_size > 0],
                          "the child's temp file")
    finally:
        _kill(proc)
        if writer is not None:
            os.close(writer)
    store = FileStore(root)
    key = asset_key(sha, "image/png")
    assert temps[0].exists()  # killed mid-write: the partial bytes are in the temp file only
    assert store.exists(key) is False and store.keys() == []

    full = tmp_path / "full.png"
    full.write_bytes(whole)
    assert store.put(full, sha, len(whole), "image/png", {}).existed is False
    assert store.read(key) == whole and store.keys() == [key]


def test_an_unreachable_endpoint_is_service_unavailable_without_the_secret(monkeypatch):
    secret = "Sec" + os.urandom(16).hex()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    settings = load_settings({"MEDIA_STORE": "s3://assets",
                              "S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(ServiceUnavailable) as caught:
        open_store(settings)
    told = "".join(traceback.format_exception(caught.value))
    assert "127.0.0.1" in str(caught.value)
    assert secret not in told


def test_an_s3_store_without_credentials_is_a_config_error(monkeypatch, tmp_path, s3_server):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="AWS_ACCESS_KEY_ID"):
        open_store(load_settings({"MEDIA_STORE": "s3://assets",
                                  "S3_ENDPOINT_URL": s3_server.endpoint}))


@pytest.mark.parametrize("media_store", [
    "s3://Bad_Bucket", "s3://ab", "s3://", "ftp://host/dir", "file://host/dir",
    "s3://assets/../up"])
def test_a_bad_media_store_is_a_config_error(media_store, s3_env):
    with pytest.raises(ConfigError, match="MEDIA_STORE"):
        open_store(load_settings({**s3_env, "MEDIA_STORE": media_store}))


def test_a_part_size_s3_cannot_take_is_a_config_error(s3_env):
    with pytest.raises(ConfigError, match="MEDIA_MULTIPART_BYTES"):
        open_store(load_settings({**s3_env, "MEDIA_STORE": "s3://assets",
                                  "MEDIA_MULTIPART_BYTES": "1MiB"}))


def test_asset_keys_split_the_hash_and_take_the_types_extension():
    sha = "ab" + "cd" + "e" * 60
    assert asset_key(sha, "image/jpeg") == f"sha256/ab/cd/{sha}.jpg"
    assert asset_key(sha, "Application/PDF; q=1", "p/") == f"p/sha256/ab/cd/{sha}.pdf"
    assert asset_key(sha, "application/x-unknown-thing") == f"sha256/ab/cd/{sha}"
    assert asset_key(sha, "") == f"sha256/ab/cd/{sha}"
    with pytest.raises(ValueError):
        asset_key("ABC", "image/png")


def test_the_s3_server_fixture_gives_a_worker_its_endpoint_and_keys(s3_server: S3Server):
    env = s3_server.env()
    assert env["S3_ENDPOINT_URL"] == s3_server.endpoint.rstrip("/")
    assert len(env["AWS_SECRET_ACCESS_KEY"]) >= 32
    assert env["AWS_SECRET_ACCESS_KEY"] not in repr(s3_server)


def test_a_file_url_names_the_same_directory_store_as_its_path(tmp_path):
    by_url = open_store(load_settings({"MEDIA_STORE": f"file://{tmp_path}/my%20media"}))
    assert isinstance(by_url, FileStore) and by_url.name == str(tmp_path / "my media")
    path, sha = _asset(tmp_path, 10)
    stored = by_url.put(path, sha, 10, "image/gif", {})
    assert FileStore(tmp_path / "my media").keys() == [stored.key]
    assert stored.location == str(tmp_path / "my media" / stored.key)
