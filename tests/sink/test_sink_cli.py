"""The files sink in a real crawl: kill -9 mid-batch and a restart write every result exactly
once; a sink registered before a crawl keeps every URL although the stream is longer than
RESULTS_MAXLEN (without one, the cap still trims); failure records reach the files too;
SIGTERM stops a sink cleanly. The kill is injected in the ``sink.py`` subprocess by a sitecustomize module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import redis

from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.sink.files import FileSink
from common.sink.reader import SinkReader, run_sink
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.store.results import ResultStore
from tests.helpers import REPO_ROOT, TEST_ENV, WorkerThread, wait_for
from tests.sink.parts import lines, open_parts, stream_ids

#: Where the sink dies, and the sitecustomize code that kills it there (on the 3rd call).
KILL_POINTS = {
    # Half of a batch's gzip member is in the part, not fsynced.
    "torn_batch": ("files.FileSink._append", """
        def patched(self, fd, data):
            if calls == 3:
                os.write(fd, data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, fd, data)
    """),
    # The batch is written and fsynced; its XACK never happens.
    "after_fsync_before_ack": ("reader.SinkReader.ack", """
        def patched(self, entries):
            if calls == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, entries)
    """),
    # A part was just renamed to its final name; the next batch is not written yet.
    "after_rotation": ("files.Part.finalize", """
        def patched(self):
            original(self)
            if calls == 3:
                os.kill(os.getpid(), signal.SIGKILL)
    """),
}


def _killing_sitecustomize(tmp_path: Path, point: str) -> str:
    target, body = KILL_POINTS[point]
    module, cls, method = target.split(".")
    folder = tmp_path / "inject"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import functools, os, signal
        from common.sink import {module} as _module

        original = _module.{cls}.{method}
        calls = 0
    """) + textwrap.dedent(body) + textwrap.dedent(f"""
        @functools.wraps(original)
        def counting(*args):
            global calls
            calls += 1
            return patched(*args)

        _module.{cls}.{method} = counting
    """))
    return str(folder)


def _crawl(settings: Settings, client: redis.Redis, urls: list[str]) -> None:
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)
    with WorkerThread(settings.with_overrides(idle_exit_s=1.5, concurrency=4)) as worker:
        assert worker.join(120) == 0


def _written(directory: Path) -> list[tuple[str, str]]:
    return [(line["stream"], line["id"]) for line in lines(directory)]


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_files_sink_killed_mid_batch_and_restarted_writes_every_entry_exactly_once(
        point, settings, redis_client, run_cli, site, tmp_path):
    urls = [site.page_url(n) for n in range(1, 31)] + [site.url("/status/404"),
                                                       site.url("/status/410")]
    _crawl(settings, redis_client, urls)
    expected = stream_ids(redis_client)
    assert len(expected) == 32
    out = tmp_path / "parts"
    env = {"SINK_BATCH": "4", "SINK_ROTATE_BYTES": "700"}

    killed = run_cli("sink.py", "files", "--dir", str(out), "--idle-exit", "5",
                     env={**env, "PYTHONPATH": f"{_killing_sitecustomize(tmp_path, point)}:"
                                              f"{REPO_ROOT}"}, timeout_s=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert open_parts(out) or point == "after_rotation"
    assert redis_client.xlen(RESULTS_STREAM) + redis_client.xlen(FAILURES_STREAM) > 0

    rerun = run_cli("sink.py", "files", "--dir", str(out), "--idle-exit", "2", env=env,
                    timeout_s=120)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    if point == "torn_batch":
        # Cut from a part with earlier batches, or a new part holding only the torn one.
        assert ("had a torn last batch; cut" in rerun.stderr
                or "held no complete batch; removed" in rerun.stderr), rerun.stderr
    if point == "after_fsync_before_ack":
        assert "replayed entries were written before; skipped" in rerun.stderr

    written = _written(out)
    assert len(written) == len(set(written)), "no stream id twice"
    assert set(written) == set(expected), "no stream id missing"
    assert {(line["stream"], line["id"]): line["url"] for line in lines(out)} == {
        key: record["url"] for key, record in expected.items()}
    assert open_parts(out) == []
    # Everything acknowledged, so the sink trimmed both streams to nothing.
    assert redis_client.xlen(RESULTS_STREAM) == redis_client.xlen(FAILURES_STREAM) == 0
    for stream in (RESULTS_STREAM, FAILURES_STREAM):
        assert redis_client.xpending(stream, sink_group("files"))["pending"] == 0


def test_a_sink_registered_before_the_crawl_gets_every_url_beyond_results_maxlen(
        settings, redis_client, site, tmp_path, small_stream_nodes):
    pages = [site.page_url(n) for n in range(1, 61)]
    sink = FileSink(tmp_path, rotate_bytes=4096, rotate_s=3600)
    reader = SinkReader(redis.Redis.from_url(settings.redis_url), sink.name, batch=8)
    stop, codes = threading.Event(), []
    thread = threading.Thread(target=lambda: codes.append(run_sink(reader, sink, stop)),
                              daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: redis_client.sismember(SINKS, "files"), 20)
        _crawl(settings.with_overrides(results_maxlen=20), redis_client,
               [*pages, site.url("/status/404")])
        assert wait_for(lambda: redis_client.xlen(RESULTS_STREAM) == 0, 60), \
            "the sink trims what it acknowledged"
    finally:
        stop.set()
        thread.join(30)
    assert codes == [0]
    got = lines(tmp_path)
    results = sorted(line["url"] for line in got if line["stream"] == RESULTS_STREAM)
    assert results == sorted(canonicalize(url) for url in pages)
    assert [line["url"] for line in got if line["stream"] == FAILURES_STREAM] == [
        canonicalize(site.url("/status/404"))]


def test_without_a_sink_results_maxlen_still_caps_the_stream(settings, redis_client, site,
                                                             small_stream_nodes):
    _crawl(settings.with_overrides(results_maxlen=20), redis_client,
           [site.page_url(n) for n in range(1, 41)])
    assert 20 <= redis_client.xlen(RESULTS_STREAM) <= 20 + small_stream_nodes


def test_failure_records_reach_the_files_sink(settings, redis_client, run_cli, site, tmp_path):
    failing = {canonicalize(site.url("/status/404")): "http_404",
               canonicalize(site.url("/status/410")): "http_410"}
    _crawl(settings, redis_client, [site.page_url(1), site.page_url(2), *failing])

    done = run_cli("sink.py", "files", "--dir", str(tmp_path), "--idle-exit", "1")

    assert done.returncode == 0, done.stderr[-3000:]
    got = lines(tmp_path)
    failures = {line["url"]: line for line in got if line["stream"] == FAILURES_STREAM}
    assert {url: line["reason"] for url, line in failures.items()} == failing
    assert {line["outcome"] for line in failures.values()} == {"dead_letter"}
    assert len([line for line in got if line["stream"] == RESULTS_STREAM]) == 2


def test_the_postgres_sink_needs_postgres_url_and_retire_names_an_unknown_sink(run_cli):
    missing = run_cli("sink.py", "postgres", env={"POSTGRES_URL": ""})
    assert missing.returncode == 2
    assert "POSTGRES_URL" in missing.stderr
    unknown = run_cli("sink.py", "retire", "nobody")
    assert unknown.returncode == 1
    assert "no sink named 'nobody'" in unknown.stderr


def test_sigterm_stops_the_sink_cleanly_with_its_part_finalized(settings, redis_client,
                                                                 tmp_path):
    store = ResultStore(redis_client, settings.results_maxlen)
    for n in range(10):
        store.record({"url": f"https://example.test/{n}", "n": n})
    env = dict(os.environ, **TEST_ENV, REDIS_URL=settings.redis_url,
               RABBITMQ_URL=settings.rabbitmq_url, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "sink.py", "files", "--dir", str(tmp_path)],
                            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: redis_client.xlen(RESULTS_STREAM) == 0, 60)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert [line["n"] for line in lines(tmp_path)] == list(range(10))
    assert open_parts(tmp_path) == []
